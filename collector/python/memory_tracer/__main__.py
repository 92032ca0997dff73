"""`python -m memory_tracer ARGS` and `memory-tracer ARGS`: the collector installed with this package
(e.g. `trace -o run.mtrace.json -- python train.py`)."""

import os
import sys

from ._tracer import collector_path


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    # Traced programs get this package with its capture libraries; a package without them (a
    # build from source) leaves the collector its own copy.
    if os.path.isfile(os.path.join(here, "_lib", "SUPPORTED")):
        os.environ.setdefault("MEMORY_TRACER_PYTHONPATH", os.path.dirname(here))
    exe = collector_path()
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
