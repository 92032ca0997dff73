"""What picking the capture costs a traced process, on the torch of the Python running it:
`_shim.choose` (before the program imports torch: reads torch/version.py, lists the carried
libraries, compares C++ ABIs) and a build on first use (`_build.cached_build` into an empty
cache: what a torch with no carried library pays once).

    PYTHONPATH=<package folder> python tests/bench/capture_choice.py [--choose N] [--builds N]

Prints one line per measure: median and range over the runs (run by `cargo xtask bench` on
every tested torch).
"""

import argparse
import statistics
import tempfile
import time

from memory_tracer import _build, _shim


def stats(ms):
    return f"median {statistics.median(ms):.2f} ms, range {min(ms):.2f}-{max(ms):.2f} ms over {len(ms)} runs"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--choose", type=int, default=50)
    ap.add_argument("--builds", type=int, default=3)
    a = ap.parse_args()
    found = _shim.installed_torch()
    times = []
    for _ in range(a.choose):
        t = time.perf_counter()
        choice = _shim.choose(*found)
        times.append((time.perf_counter() - t) * 1e3)
    print(f"torch {found[0]}: choose ({choice.how}): {stats(times)}")
    builds = []
    for i in range(a.builds):
        with tempfile.TemporaryDirectory() as root:
            t = time.perf_counter()
            _build.cached_build(found[2], found[0], found[1], _shim.SRC_DIR, root=root)
            builds.append((time.perf_counter() - t) * 1e3)
    if builds:
        print(f"torch {found[0]}: build on first use ({_build.cxx_standard(found[2])}, C++11 ABI {_build.cxx11_abi(found[2])}): {stats(builds)}")


if __name__ == "__main__":
    main()
