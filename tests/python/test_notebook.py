"""The viewer inline in Jupyter: a real notebook run by nbclient on a real IPython kernel traces
a model with `%%memtrace` and with `tracer.show()`, and shows a PyTorch snapshot with
`memory_tracer.show(path)`; each output is the single-file report in an iframe, carrying the
very trace (and so its peak). Without IPython, and for paths that are not traces, the errors
say what to do.

The notebook's test needs nbclient, nbformat and ipykernel (`cargo xtask test` installs them
into the pinned torch's venv, and runs this module there only)."""

import base64
import html
import json
import os
import re
import subprocess
import sys
import types

import pytest

import memory_tracer

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOT = os.path.join(HERE, "..", "data", "mlp_adam_3steps.pickle")

IFRAME = re.compile(r'<div class="memory-tracer-output"><iframe class="memory-tracer-viewer" title="[^"]*" srcdoc="([^"]*)" style="([^"]*)"></iframe></div>')
EMBEDDED_TRACE = re.compile(r'window\.__mtTrace = \{name: "([^"]*)", bytes: b64\("([A-Za-z0-9+/=]*)"\)\};')


def collector_json(*args):
    r = subprocess.run([memory_tracer.collector_path(), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def notebook(tmp_path):
    """The notebook a user would write: %%memtrace on one step, tracer.show() on another, and
    memory_tracer.show() of a snapshot; plus a %%memtrace with a wrong option."""
    import nbformat

    code = nbformat.v4.new_code_cell
    cells = [
        code("import json\nimport torch\nimport torch.nn as nn\nimport memory_tracer\n%load_ext memory_tracer"),
        code("torch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))"),
        code(
            f"%%memtrace --device cpu --model model --height 500 --save {tmp_path / 'magic.mtrace.json'}\n"
            "loss = model(torch.randn(32, 64)).square().mean()\nloss.backward()"
        ),
        code(
            "tracer = memory_tracer.MemoryTracer(device='cpu')\n"
            "with tracer.trace(model):\n"
            "    model(torch.randn(512, 64)).sum().backward()\n"
            f"tracer.save({str(tmp_path / 'api.mtrace.json')!r})\n"
            "print(json.dumps(tracer.get_summary()))"
        ),
        code("tracer.show(height='60vh')"),
        code(f"memory_tracer.show({SNAPSHOT!r})"),
        code("%%memtrace --bogus\npass", metadata={"tags": ["raises-exception"]}),
        code("%%memtrace --device cpu\nkept = torch.ones(1024)\nraise RuntimeError('out of patience')", metadata={"tags": ["raises-exception"]}),
    ]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def viewers(cell):
    """(report HTML, iframe style) of each viewer the cell displayed."""
    found = []
    for out in cell.get("outputs", []):
        page = out.get("data", {}).get("text/html")
        if page is not None:
            m = IFRAME.fullmatch("".join(page))
            assert m, f"not a viewer frame: {''.join(page)[:300]}"
            found.append((html.unescape(m.group(1)), m.group(2)))
    return found


def embedded_trace(report, tmp_path, name):
    """The trace a report carries, written to tmp_path/name."""
    m = EMBEDDED_TRACE.search(report)
    assert m, "the report carries no trace"
    path = tmp_path / name
    path.write_bytes(base64.b64decode(m.group(2)))
    return m.group(1), path


def test_a_notebook_shows_the_viewer_with_its_trace_inline(tmp_path):
    try:
        import ipykernel  # noqa: F401  (the kernel nbclient starts)
        from nbclient import NotebookClient
    except ImportError as e:
        pytest.fail(f"{e}: this test runs a notebook; install the pinned nbclient, nbformat, ipykernel and ipython (PY_TEST_DEPS in xtask/src/install.rs)")

    nb = notebook(tmp_path)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    magic, api, api_show, snapshot, bad, raising = nb.cells[2:]
    said = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert "Warning" not in said, said

    # %%memtrace: the viewer with the cell's trace, the one --save wrote.
    [(report, style)] = viewers(magic)
    assert "<title>Memory Tracer" in report and "__mtWorkerUrl" in report, "the single-file report, viewer and worker inlined"
    assert "width: 100%" in style and "height: 500px" in style, style
    name, carried = embedded_trace(report, tmp_path, "magic-carried.mtrace.json")
    assert name == "trace.mtrace.json"
    assert carried.read_bytes() == (tmp_path / "magic.mtrace.json").read_bytes()
    magic_summary = collector_json("summary", str(carried), "--json")
    assert magic_summary["peak_allocated_bytes"] > 32 * 256 * 4, "the forward's activations at least"

    # tracer.show(): the viewer with the tracer's trace; its peak is the tracer's.
    printed = "".join(o["text"] for o in api["outputs"] if o.get("name") == "stdout")
    peak = json.loads(printed)["peak_allocated_bytes"]
    [(report, style)] = viewers(api_show)
    assert "height: 60vh" in style, style
    _, carried = embedded_trace(report, tmp_path, "api-carried.mtrace.json")
    assert carried.read_bytes() == (tmp_path / "api.mtrace.json").read_bytes()
    assert collector_json("summary", str(carried), "--json")["peak_allocated_bytes"] == peak
    assert peak > magic_summary["peak_allocated_bytes"], "512 rows against 32"

    # memory_tracer.show(path): a PyTorch snapshot, as the file is.
    [(report, style)] = viewers(snapshot)
    assert "height: 720px" in style, "the default height"
    name, carried = embedded_trace(report, tmp_path, "snapshot-carried.pickle")
    assert name == "mlp_adam_3steps.pickle"
    with open(SNAPSHOT, "rb") as f:
        assert carried.read_bytes() == f.read()

    # A wrong option: IPython's usage error (on stderr, as IPython shows them), with the usage.
    said = "".join(o["text"] for o in bad["outputs"] if o.get("name") == "stderr")
    assert "UsageError: unrecognized arguments: --bogus\nusage: %%memtrace [--device DEVICE] [--model NAME]" in said, said
    assert not viewers(bad)

    # A cell that raises: its own error, then the viewer of what it allocated, then the cell
    # fails (Run All stops there) without a second traceback.
    kinds = [o["output_type"] for o in raising["outputs"]]
    assert kinds == ["error", "display_data", "error"], kinds
    first, _, last = raising["outputs"]
    assert (first["ename"], first["evalue"]) == ("RuntimeError", "out of patience")
    assert last["traceback"] == ["%%memtrace: the cell raised (traceback above); the viewer shows what it allocated until then"]
    [(report, _)] = viewers(raising)
    _, carried = embedded_trace(report, tmp_path, "raising-carried.mtrace.json")
    assert collector_json("summary", str(carried), "--json")["peak_allocated_bytes"] >= 4096, "torch.ones(1024) before the error"


@pytest.fixture
def fake_ipython(monkeypatch):
    """IPython.display as show() uses it, recording what it displays."""
    shown = []
    display = types.ModuleType("IPython.display")
    display.HTML = lambda text: ("HTML", text)
    display.display = shown.append
    ipython = types.ModuleType("IPython")
    ipython.display = display
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    return shown


def test_show_displays_one_html_frame(fake_ipython):
    memory_tracer.show(SNAPSHOT, height=300)
    [(kind, text)] = fake_ipython
    assert kind == "HTML"
    m = IFRAME.fullmatch(text)
    assert m and "height: 300px" in m.group(2)
    assert "mlp_adam_3steps.pickle" in html.unescape(m.group(1))


def test_without_ipython_show_says_what_to_install(monkeypatch):
    # `import IPython` fails as it does where IPython is not installed.
    monkeypatch.setitem(sys.modules, "IPython", None)
    monkeypatch.setitem(sys.modules, "IPython.display", None)
    with pytest.raises(ImportError, match=re.escape("pip install memory_tracer[notebook]")):
        memory_tracer.show(SNAPSHOT)
    tracer = memory_tracer.MemoryTracer(device="cpu")
    with tracer.trace():
        memory_tracer.mark("something traced")
    with pytest.raises(ImportError, match="needs IPython"):
        tracer.show()


def test_paths_that_are_not_traces_are_refused(fake_ipython, tmp_path):
    missing = tmp_path / "nowhere.mtrace.json"
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(missing))} does not exist"):
        memory_tracer.show(missing)
    with pytest.raises(IsADirectoryError, match="found a folder"):
        memory_tracer.show(tmp_path)
    junk = tmp_path / "notes.txt"
    junk.write_text("not a trace\n")
    with pytest.raises(ValueError, match=f"cannot show {re.escape(str(junk))}"):
        memory_tracer.show(junk)
    with pytest.raises(ValueError, match="invalid height"):
        memory_tracer.show(SNAPSHOT, height="tall")
    with pytest.raises(RuntimeError, match="nothing traced yet"):
        memory_tracer.MemoryTracer(device="cpu").show()
    assert fake_ipython == [], "nothing was displayed"

