"""Memory Tracer's bootstrap, put on PYTHONPATH by `collector trace -- COMMAND`.

Python imports `sitecustomize` at start-up; this one arms the capture (it starts when the
program imports torch) and then runs the `sitecustomize` it shadows, if there is one.
"""

import os
import sys


def _arm():
    try:
        from memory_tracer import _auto
    except Exception as e:  # a broken bootstrap must never stop the program
        sys.stderr.write(f"memory-tracer: cannot load the capture ({e}); running untraced\n")
        return
    _auto.install()


def _chain():
    """Runs the next `sitecustomize` on sys.path (the one this file shadows)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_mt_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


_arm()
_chain()
