"""The GPU checks' runner on the CPU (tests/gpu/all.py, which `cargo xtask gpu` calls, and
tests/gpu/checks.py, which the checks print with): CHECK lines read out of a check's output
(as tests/gpu/issue66.sh prints it: tables, ranks' lines, nested parts), a crash, a timeout, a
malformed line and a check that prints none become the rows they should; the table and the exit
status; the list names scripts that exist. The checks themselves need a GPU."""

import importlib.util
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

GPU = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu")


def load(name):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", os.path.join(GPU, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner, checks = load("all"), load("checks")

# What a check's output looks like: its own lines, a markdown table, CHECK lines with and
# without a note, one of another part prefixed, and lines that only mention CHECK.
OUTPUT = """\
=== settings
default                reserved   9976152064 replay   9976152064 PASS
CHECK settings.default.own_replay_reserved 9976152064 =9976152064 PASS
| case | parameters (PyTorch / why) |
|---|---|
| resnet --large | 102,228,128 / 102,228,128 |
CHECK resnet_--large.recorded_at_peak 100.00% >=99% PASS
CHECK leaks.moe_clean leak =no_steady_growth FAIL
CHECK recorder.llama.modules 63/64 >=95%_within_5% PASS (b) leaf modules' forward peaks against hooks; 61 exact
  CHECK indented lines are not CHECK lines
CHECKS done
"""


def test_check_lines_are_read_with_their_notes():
    found, malformed = runner.parse_checks(OUTPUT)
    assert found == [
        ("settings.default.own_replay_reserved", "9976152064", "=9976152064", "PASS", ""),
        ("resnet_--large.recorded_at_peak", "100.00%", ">=99%", "PASS", ""),
        ("leaks.moe_clean", "leak", "=no_steady_growth", "FAIL", ""),
        ("recorder.llama.modules", "63/64", ">=95%_within_5%", "PASS", "(b) leaf modules' forward peaks against hooks; 61 exact"),
    ]
    assert malformed == []


def test_a_malformed_check_line_is_a_failure():
    text = "CHECK only three words\nCHECK a 1 =1 MAYBE\nCHECK b 2 =2 PASS\n"
    found, malformed = runner.parse_checks(text)
    assert [f[0] for f in found] == ["b"]
    assert malformed == ["CHECK only three words", "CHECK a 1 =1 MAYBE"]
    rows = runner.rows_of("x", text, 0, 1.0)
    assert [(r.name, r.result) for r in rows] == [("b", "PASS"), ("malformed", "FAIL"), ("malformed", "FAIL")]


def test_what_checks_py_prints_reads_back():
    out = io.StringIO()
    with redirect_stdout(out):
        assert checks.check("a b.peak", 1034188800, "=1034188800", True, "against  max_memory_allocated()")
        assert not checks.check("c", "", "<=5%", False)
    found, malformed = runner.parse_checks(out.getvalue())
    assert found == [("a_b.peak", "1034188800", "=1034188800", "PASS", "against max_memory_allocated()"), ("c", "-", "<=5%", "FAIL", "")]
    assert not malformed


def test_the_bash_check_prints_the_same_line():
    script = f'. {GPU}/torch_env.sh; check "a b.peak" 1034188800 "=1034188800" [ 1 = 1 ]; check c "" "<=5%" false; echo "rc=$?"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=dict(os.environ, TORCH_VENV="/nonexistent")).stdout
    assert out.splitlines() == ["CHECK a_b.peak 1034188800 =1034188800 PASS", "CHECK c - <=5% FAIL", "rc=1"]


@pytest.mark.parametrize(
    "status, last, want",
    [
        (0, None, []),
        (1, "rc=1", ["FAIL"]),
        (None, "timeout", ["FAIL"]),
    ],
)
def test_exit_status_and_timeout_rows(status, last, want):
    rows = runner.rows_of("issue66", OUTPUT, status, 12.0)
    assert [r.result for r in rows[:4]] == ["PASS", "PASS", "FAIL", "PASS"]
    extra = rows[4:]
    assert [r.result for r in extra] == want
    if last:
        assert extra[0].name == "exit" and extra[0].figure == last and extra[0].bound == "rc=0"
        assert extra[0].note.endswith("CHECKS done")


def test_a_check_without_check_lines_is_judged_by_its_exit():
    assert [(r.figure, r.result) for r in runner.rows_of("ledger", "all named\n", 0, 3.0)] == [("rc=0", "PASS")]
    rows = runner.rows_of("ledger", "FAIL: no NCCL bytes named\n", 1, 3.0)
    assert [(r.figure, r.result, r.note) for r in rows] == [("rc=1", "FAIL", "FAIL: no NCCL bytes named")]


def fake(name, command, expected_s=1, gpus=1):
    return runner.Check(name, command, expected_s, gpus, "a fake check")


def test_a_run_collects_rows_logs_and_kills_what_overstays(tmp_path):
    ok = fake("ok", 'echo "in $OUT with $COLLECTOR"; echo "CHECK x.peak 5 =5 PASS"')
    crash = fake("crash", 'echo "CHECK y 1 =1 PASS"; echo "Traceback: boom" >&2; exit 3')
    # A child that keeps the output open: the whole process group goes.
    slow = fake("slow", 'echo started; sleep 60 & sleep 60')
    rows = []
    for c, timeout in ((ok, 30), (crash, 30), (slow, 1)):
        rows += runner.run_one(c, "/bin/true", str(tmp_path), timeout, echo=False)
    got = [(r.check, r.name, r.figure, r.result) for r in rows]
    assert got == [
        ("ok", "x.peak", "5", "PASS"),
        ("crash", "y", "1", "PASS"),
        ("crash", "exit", "rc=3", "FAIL"),
        ("slow", "exit", "timeout", "FAIL"),
    ]
    assert rows[2].note == "Traceback: boom"
    assert rows[3].seconds < 30
    assert (tmp_path / "ok.log").read_text() == f"in {tmp_path}/ok with /bin/true\nCHECK x.peak 5 =5 PASS\n"
    assert (tmp_path / "ok").is_dir()


def test_main_prints_one_table_and_fails_on_a_failed_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "CHECKS", [
        fake("one", 'echo "CHECK a.share 91.0% >=90% PASS"'),
        fake("two", 'echo "CHECK b.error +6.0% abs<=5% FAIL |predicted| off"'),
        fake("pair", "echo never", gpus=2),
    ])
    assert runner.main(["/bin/true", str(tmp_path), "--gpus", "1"]) == 1
    text = (tmp_path / "checks.md").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("| check ") and lines[1].startswith("|---")
    assert lines[2].startswith("| one/a.share | 91.0%  | >=90%   | PASS   |")
    assert "two/b.error" in lines[3] and "FAIL" in lines[3] and "\\|predicted\\| off" in lines[3]
    assert "pair/-" in lines[4] and "SKIP" in lines[4] and "needs 2 GPUs, found 1" in lines[4]
    assert "1 passed, 1 failed, 1 skipped" in capsys.readouterr().out
    # Only the passing one: exit 0; nothing run: exit 1.
    assert runner.main(["/bin/true", str(tmp_path), "--gpus", "1", "--only", "one"]) == 0
    assert runner.main(["/bin/true", str(tmp_path), "--gpus", "1", "--only", "pair"]) == 1
    with pytest.raises(SystemExit, match="unknown check"):
        runner.main(["/bin/true", str(tmp_path), "--only", "three"])


def test_every_listed_check_runs_a_script_that_exists():
    root = os.path.dirname(GPU)
    names = [c.name for c in runner.CHECKS]
    assert len(names) == len(set(names))
    for c in runner.CHECKS:
        scripts = [w for w in c.command.replace('"', " ").split() if w.startswith("tests/gpu/")]
        assert scripts, c
        for s in scripts:
            assert os.path.isfile(os.path.join(os.path.dirname(root), s)), s
        assert c.expected_s > 0 and c.gpus in (1, 2)


ADVICE = {
    "rows": [
        {"configuration": "baseline", "peak_allocated_bytes": 100, "pytorch_max_allocated_bytes": 100, "error_pct": 0.0, "error": None},
        {"configuration": "checkpoint h.0,h.1", "peak_allocated_bytes": 80, "pytorch_max_allocated_bytes": 80, "error_pct": 4.9,
         "timing_note": "predicted +1.0 ms, measured +1.1 ± 0.1 ms: within 25 % (-9 %)", "extra_error_pct": -9.0, "error": None},
        {"configuration": "amp", "peak_allocated_bytes": 70, "pytorch_max_allocated_bytes": 71, "error_pct": -6.0, "error": None},
        {"configuration": "checkpoint h.0,h.1 + amp", "peak_allocated_bytes": None, "error": "the run failed (exit 1): OOM"},
        {"configuration": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "peak_allocated_bytes": 100,
         "pytorch_max_allocated_bytes": 100, "error_pct": 0.0, "reserved_error_pct": 1.5, "alloc_conf": "expandable_segments:True", "error": None},
    ]
}


def test_advise_verify_rows_are_judged(tmp_path):
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(ADVICE))
    out = io.StringIO()
    with redirect_stdout(out):
        assert not checks.advise(str(path), "gpt", times=True)
    found, _ = runner.parse_checks(out.getvalue())
    verdicts = {name: (figure, result) for name, figure, _, result, _ in found}
    assert verdicts == {
        "gpt.suggestions": ("baseline+checkpoint+amp+both+setting", "PASS"),
        "gpt.baseline.peak": ("100", "PASS"),
        "gpt.baseline.predicted": ("+0.00%", "PASS"),
        "gpt.checkpoint.peak": ("80", "PASS"),
        "gpt.checkpoint.predicted": ("+4.90%", "PASS"),
        "gpt.checkpoint.extra_time": ("-9.00%", "PASS"),
        "gpt.amp.peak": ("70", "FAIL"),
        "gpt.amp.predicted": ("-6.00%", "FAIL"),
        "gpt.both.run": ("failed", "FAIL"),
        "gpt.setting.peak": ("100", "PASS"),
        "gpt.setting.predicted": ("+0.00%", "PASS"),
        "gpt.setting.reserved": ("+1.50%", "PASS"),
    }


def test_whatif_rows_are_judged_against_the_untraced_runs(tmp_path):
    row = {"alloc_conf": "", "env": "", "allocated_error_pct": 0.0, "reserved_error_pct": 0.0, "error": None,
           "measured_allocated_peak_bytes": 10, "measured_reserved_peak_bytes": 20}
    rows = [row,
            dict(row, alloc_conf="expandable_segments:True", env="expandable_segments:True", reserved_error_pct=3.3, reserved_in_range=True),
            dict(row, alloc_conf="max_split_size_mb:128", env="max_split_size_mb:128", allocated_error_pct=0.6, measured_reserved_peak_bytes=21)]
    (tmp_path / "cnn.json").write_text(json.dumps({"rows": rows}))
    counters = [{"alloc_conf": c, "max_memory_allocated": 10, "max_memory_reserved": 20} for c in ("", "expandable_segments:True", "max_split_size_mb:128")]
    (tmp_path / "cnn.counters.jsonl").write_text("".join(json.dumps(c) + "\n" for c in counters))
    out = io.StringIO()
    with redirect_stdout(out):
        assert not checks.whatif(str(tmp_path / "cnn.json"), str(tmp_path / "cnn.counters.jsonl"), "cnn")
    found, _ = runner.parse_checks(out.getvalue())
    failed = [name for name, _, _, result, _ in found if result == "FAIL"]
    assert len(found) == 9
    assert failed == ["cnn.setting2.allocated", "cnn.setting2.untraced"]


def test_a_missing_output_is_a_failed_check(tmp_path):
    code = subprocess.run([sys.executable, os.path.join(GPU, "checks.py"), "advise", str(tmp_path / "none.json"), "resnet152"],
                          capture_output=True, text=True)
    assert code.returncode == 1
    assert code.stdout.startswith("CHECK resnet152.output unreadable readable FAIL FileNotFoundError")
