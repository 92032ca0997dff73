"""The pytest plugin (memory_tracer.pytest_plugin): `--memory-budget` and the `memory_budget`
marker fail tests whose peak allocated memory on the CPU is over their budget, naming the peak
and the module at it; budgets that do not parse are a usage error (the option) or a failed
test (a marker). Each case is a pytest run of its own (pytester, in a subprocess)."""

import importlib.metadata
import os

import pytest

from memory_tracer.pytest_plugin import parse_size

pytest_plugins = ["pytester"]

# A test module whose `test_wide` peaks in the module `wide`: its weight and bias (16 MiB) and
# the input (1 MiB) before the forward, then the output (4 MiB) inside it; float32.
TESTS = """
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

import memory_tracer


def wide_step():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(wide=nn.Linear(1024, 4096)))
    with torch.no_grad():
        return model(torch.randn(256, 1024)).sum().item()


{marker}
def test_wide():
    wide_step()


def test_small():
    assert sum(range(10)) == 45
"""
WIDE_PEAK_BYTES = 4 * (1024 * 4096 + 4096 + 256 * 1024 + 256 * 4096)


def plugin_args():
    """`-p memory_tracer.pytest_plugin` unless the installed wheel's pytest11 entry point loads it."""
    points = importlib.metadata.entry_points(group="pytest11")
    if any(p.value == "memory_tracer.pytest_plugin" for p in points):
        return []
    return ["-p", "memory_tracer.pytest_plugin"]


def run(pytester, marker, *args):
    pytester.makepyfile(test_budgets=TESTS.replace("{marker}", marker))
    return pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", *args)


def test_the_wheel_registers_the_plugin():
    if not os.environ.get("MEMORY_TRACER_WHEEL_DIR"):
        pytest.skip("runs against the installed wheel (cargo xtask test)")
    points = [p for p in importlib.metadata.entry_points(group="pytest11") if p.value.startswith("memory_tracer")]
    assert [(p.name, p.value) for p in points] == [("memory_tracer.pytest_plugin", "memory_tracer.pytest_plugin")]
    assert plugin_args() == []


def test_the_plugin_named_beside_the_entry_point_loads_once(pytester):
    r = run(pytester, '@memory_tracer.budget("1MiB")', "-p", "memory_tracer.pytest_plugin")
    r.assert_outcomes(passed=1, failed=1)


def test_a_marked_test_within_its_budget_passes(pytester):
    r = run(pytester, '@memory_tracer.budget("64MiB")')
    r.assert_outcomes(passed=2)


def test_a_marked_test_over_its_budget_fails_naming_the_peak_and_the_module(pytester):
    r = run(pytester, '@pytest.mark.memory_budget("1MiB")', "--memory-device=cpu")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    r.stdout.fnmatch_lines(["memory budget exceeded: peak allocated *", "FAILED test_budgets.py::test_wide - Failed: memory budget exceeded*"])
    assert f"peak allocated 21.02 MiB ({WIDE_PEAK_BYTES} bytes) on cpu:0, at module `wide`; budget 1.00 MiB (memory_budget('1MiB'))" in out, out


def test_the_option_budgets_every_test(pytester):
    r = run(pytester, "", "--memory-budget=64MiB")
    r.assert_outcomes(passed=2)
    r = run(pytester, "", "--memory-budget=1.5MB")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert "at module `wide`; budget 1.43 MiB (--memory-budget=1.5MB)" in out, out
    assert f"({WIDE_PEAK_BYTES} bytes)" in out, out


def test_a_marker_wins_over_the_option(pytester):
    r = run(pytester, '@memory_tracer.budget("1GiB")', "--memory-budget=1MiB")
    r.assert_outcomes(passed=2)
    r = run(pytester, "@memory_tracer.budget(None)", "--memory-budget=1MiB")
    r.assert_outcomes(passed=2)


def test_a_test_that_fails_keeps_its_own_failure_and_shows_its_peak(pytester):
    pytester.makepyfile(
        test_fails=TESTS.replace("{marker}", "").replace("def test_small():", "@memory_tracer.budget('1KiB')\ndef test_fails():\n    wide_step()\n    assert 1 + 1 == 3\n\n\ndef test_small():")
    )
    r = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "test_fails.py::test_fails")
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    assert "assert (1 + 1) == 3" in out and "memory budget exceeded" not in out, out
    r.stdout.fnmatch_lines(["*Captured memory call*", "peak allocated * at module `wide`; budget 1.00 KiB (memory_budget('1KiB'))"])


def test_a_budget_option_that_does_not_parse_is_a_usage_error(pytester):
    r = run(pytester, "", "--memory-budget=lots")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--memory-budget: expected a size such as 6GiB, 512MiB, 1.5GB or 1073741824 (bytes), got `lots`: no number*"])


def test_a_marker_that_does_not_parse_fails_its_test(pytester):
    r = run(pytester, '@pytest.mark.memory_budget("6 GiBs")')
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["memory_budget marker: expected a size *got `6 GiBs`: unknown unit*", "FAILED test_budgets.py::test_wide*"])
    assert "During handling" not in r.stdout.str()
    r = run(pytester, '@pytest.mark.memory_budget("1GiB", "2GiB")')
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["memory_budget marker: expected one size, as in @pytest.mark.memory_budget('2GiB'), got ('1GiB', '2GiB') {}"])


def test_sizes_read_as_collector_check_reads_them():
    assert parse_size("6GiB") == 6 * 2**30
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("2g") == 2 * 2**30
    assert parse_size("1073741824") == 2**30
    assert parse_size(4096) == 4096
    for bad, why in [("-1GiB", "cannot be negative"), ("GiB", "no number"), ("1.2.3MiB", "not a number"), ("3 parsecs", "unknown unit")]:
        with pytest.raises(ValueError, match=why):
            parse_size(bad)

