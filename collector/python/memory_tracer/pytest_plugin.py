"""pytest plugin (the wheel's `pytest11` entry point): memory budgets for tests.

- `pytest --memory-budget=6GiB` traces every test with a MemoryTracer;
- `@pytest.mark.memory_budget("2GiB")` (or `@memory_tracer.budget("2GiB")`) traces the tests it
  marks, and wins over the option; `memory_budget(None)` leaves a test untraced (one that runs
  its own MemoryTracer: a process has one capture at a time).

A traced test whose body passes but whose peak allocated memory is over its budget fails,
naming the peak, the budget and the module (layer) allocating at the peak (from the trace's
summary). Only the test's body (its call phase) is traced: what its
fixtures hold when it starts is on the device already but not in the trace. `--memory-device`
picks the device (default: cuda:0 when CUDA is available, else the CPU). Needs pytest 8.

Sizes are read as the collector reads them (`shared::units::parse_size`): 6GiB, 512MiB,
1.5GB, 2g or a number of bytes (KiB, MiB, GiB, TiB, K, M, G, T: powers of 1024; KB, MB, GB, TB: of 1000).
"""

import re
import shutil

import pytest

_SCALES = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tib": 1024**4,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}

_OPTION_BUDGET = pytest.StashKey()

# New-style hook wrappers need pytest 8 (pluggy 1.2 at least). On an older pytest the plugin,
# loaded into every run where the wheel is installed, adds its options but traces nothing.
_PYTEST_8 = int(pytest.__version__.split(".")[0]) >= 8


def parse_size(size):
    """`6GiB`, `512 MiB`, `1.5GB`, `1073741824` (or an int) → bytes, as `shared::units::parse_size`."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise ValueError(f"expected a size such as 6GiB, 512MiB, 1.5GB or 1073741824 (bytes), got `{size}`: sizes cannot be negative")
        return size
    text = str(size)
    m = re.fullmatch(r"\s*([0-9.]*)\s*([A-Za-z]*)\s*", text)
    why = None
    if m is None or not m.group(1):
        why = "sizes cannot be negative" if text.strip().startswith("-") else "no number"
    elif m.group(2).lower() not in _SCALES:
        why = "unknown unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
    else:
        try:
            return round(float(m.group(1)) * _SCALES[m.group(2).lower()])
        except ValueError:
            why = "not a number"
    raise ValueError(f"expected a size such as 6GiB, 512MiB, 1.5GB or 1073741824 (bytes), got `{text}`: {why}")


def pytest_addoption(parser):
    group = parser.getgroup("memory-tracer", "memory budgets (memory_tracer)")
    group.addoption(
        "--memory-budget",
        metavar="SIZE",
        default=None,
        help="trace every test and fail those whose peak allocated memory is over SIZE (6GiB, 512MiB, 1.5GB or bytes); "
        "a memory_budget marker wins over it",
    )
    group.addoption(
        "--memory-device",
        metavar="DEVICE",
        default=None,
        help="the device budgets hold for: cpu, cuda or cuda:N (default: cuda:0 when CUDA is available, else cpu)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "memory_budget(size): trace the test and fail it when its peak allocated memory is over size "
        "(6GiB, 512MiB, 1.5GB or bytes; None: not traced). From memory_tracer.",
    )
    text = config.getoption("memory_budget", None)
    if text is not None and not _PYTEST_8:
        raise pytest.UsageError(f"--memory-budget needs pytest 8 or later; this is pytest {pytest.__version__}")
    if text is not None:
        try:
            config.stash[_OPTION_BUDGET] = (parse_size(text), f"--memory-budget={text}")
        except ValueError as e:
            raise pytest.UsageError(f"--memory-budget: {e}") from None


def _budget(item):
    """(bytes, where it was given) for this test, or None when it has no budget."""
    marker = item.get_closest_marker("memory_budget")
    if marker is None:
        return item.config.stash.get(_OPTION_BUDGET, None)
    if len(marker.args) + len(marker.kwargs) != 1 or set(marker.kwargs) - {"size"}:
        pytest.fail(f"memory_budget marker: expected one size, as in @pytest.mark.memory_budget('2GiB'), got {marker.args!r} {marker.kwargs!r}", pytrace=False)
    size = marker.args[0] if marker.args else marker.kwargs["size"]
    if size is None:
        return None
    try:
        return parse_size(size), f"memory_budget({size!r})"
    except ValueError as e:
        problem = str(e)
    pytest.fail(f"memory_budget marker: {problem}", pytrace=False)


def pytest_runtest_call(item):
    budget = _budget(item)
    if budget is None:
        return (yield)
    from ._tracer import MemoryTracer

    limit_bytes, given = budget
    tracer = MemoryTracer(device=item.config.getoption("memory_device", None))
    raised = None
    with tracer.trace():
        try:
            result = yield
        except BaseException as e:  # raised again once the trace is complete
            raised = e
    s = tracer.get_summary()
    # Nothing of the trace is kept: a suite traces every test.
    shutil.rmtree(tracer._dir, ignore_errors=True)
    peak = s["peak_allocated_bytes"]
    where = f"module `{s['peak_layer']}`" if s.get("peak_layer") else "no module (outside every nn.Module call)"
    line = (
        f"peak allocated {format_bytes(peak)} ({peak} bytes) on {s.get('peak_device') or 'the device'}, at {where}; "
        f"budget {format_bytes(limit_bytes)} ({given})"
    )
    item.user_properties.append(("peak_allocated_bytes", peak))
    if raised is None and peak > limit_bytes:
        pytest.fail(f"memory budget exceeded: {line}", pytrace=False)
    # Shown with the test's own failure (and by -rA): where its memory went.
    item.add_report_section("call", "memory", line)
    if raised is not None:
        raise raised
    return result


# pluggy skips a hook name bound to None.
pytest_runtest_call = pytest.hookimpl(wrapper=True)(pytest_runtest_call) if _PYTEST_8 else None


def format_bytes(n):
    """`1.50 KiB`, as `shared::units::format_bytes` writes sizes."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.2f} {unit}"
