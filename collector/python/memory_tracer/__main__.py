"""`python -m memory_tracer ARGS`: the bundled collector (e.g. `trace -o run.mtrace.json -- python train.py`)."""

import os
import sys

from . import collector_path


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ.setdefault("MEMORY_TRACER_PYTHONPATH", os.path.dirname(here))
    exe = collector_path()
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
