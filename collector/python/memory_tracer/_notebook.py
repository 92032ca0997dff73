"""The viewer inline in Jupyter: `show(path)`, `MemoryTracer.show()` and the `%%memtrace` cell magic.

What goes into the notebook is `collector report --single-file` (the viewer's wasm, its worker
and the trace inlined) as the `srcdoc` of an iframe: nothing is served, nothing is fetched, and
the output survives saving the notebook and exporting it to HTML. The iframe keeps the viewer's
styles and scripts apart from the notebook's. Each output carries the whole viewer (about 8 MB).

IPython is needed only here, and imported only when something is shown
(`pip install memory_tracer[notebook]`).
"""

import argparse
import html
import os
import re
import shlex
import subprocess
import tempfile

# Tall enough for the summary and the first chart; the viewer scrolls inside the frame.
DEFAULT_HEIGHT = 720

_INSTALL = "pip install memory_tracer[notebook]"


def _ipython_display():
    """IPython's `display` and `HTML`, or an ImportError naming what to install."""
    try:
        from IPython.display import HTML, display
    except ImportError as e:
        raise ImportError(f"memory-tracer: showing the viewer in a notebook needs IPython, which is not installed ({e}); install it with `{_INSTALL}`") from e
    return display, HTML


def _css_height(height):
    """`720` or `"720"` → `720px`; CSS lengths (`80vh`, `600px`) pass as they are."""
    if isinstance(height, bool):
        raise ValueError(f"memory-tracer: invalid height {height!r}; expected pixels (720) or a CSS length (80vh)")
    if isinstance(height, (int, float)):
        if not 0 < height < float("inf"):
            raise ValueError(f"memory-tracer: invalid height {height!r}; expected a positive number of pixels")
        return f"{height:g}px"
    text = str(height).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return _css_height(float(text))
    if re.fullmatch(r"\d+(\.\d+)?(px|vh|em|rem)", text):
        return text
    raise ValueError(f"memory-tracer: invalid height {height!r}; expected pixels (720) or a CSS length such as 600px or 80vh")


def report_html(path):
    """The single-file report of the trace or snapshot at `path` (any format the viewer opens)."""
    from ._tracer import collector_path

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"memory-tracer: no trace to show: {path} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"memory-tracer: expected a trace file or a PyTorch memory snapshot, found a folder: {path}")
    with tempfile.TemporaryDirectory(prefix="memory-tracer-show-") as tmp:
        out = os.path.join(tmp, "report.html")
        r = subprocess.run([collector_path(), "report", path, "--single-file", "-o", out], capture_output=True, text=True)
        if r.returncode != 0:
            reason = r.stderr.strip().removeprefix("error: ")
            raise ValueError(f"memory-tracer: cannot show {path}: {reason}")
        with open(out, encoding="utf-8") as f:
            return f.read()


def viewer_html(path, height=None):
    """An `<iframe>` holding the viewer with the trace at `path`, full width, `height` tall
    (pixels or a CSS length; default DEFAULT_HEIGHT pixels)."""
    css = _css_height(DEFAULT_HEIGHT if height is None else height)
    report = report_html(path)
    title = html.escape(f"Memory Tracer: {os.path.basename(os.fspath(path))}", quote=True)
    # In a <div>: IPython's HTML warns about a bare <iframe> (and suggests IFrame, which needs a URL).
    return (
        f'<div class="memory-tracer-output"><iframe class="memory-tracer-viewer" title="{title}" srcdoc="{html.escape(report, quote=True)}" '
        f'style="box-sizing: border-box; width: 100%; height: {css}; border: 1px solid #8884; border-radius: 4px"></iframe></div>'
    )


def show(path, height=None):
    """Displays the viewer with the trace or PyTorch snapshot at `path` in the notebook's output.

    height: pixels (default 720) or a CSS length ("80vh").
    """
    display, HTML = _ipython_display()
    display(HTML(viewer_html(path, height)))


class _UsageError(Exception):
    pass


class _MagicParser(argparse.ArgumentParser):
    """argparse that reports mistakes as IPython usage errors instead of exiting."""

    def error(self, message):
        raise _UsageError(f"{message}\n{self.format_usage().strip()}")


def _magic_parser():
    p = _MagicParser(prog="%%memtrace", add_help=False, description="Traces the cell with MemoryTracer and shows the viewer.")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:0 when CUDA is available, else cpu)")
    p.add_argument("--model", metavar="NAME", help="a variable holding the nn.Module whose paths name the layers")
    p.add_argument("--height", default=str(DEFAULT_HEIGHT), help=f"pixels or a CSS length (default {DEFAULT_HEIGHT})")
    p.add_argument("--save", metavar="PATH", help="also save the trace to PATH")
    p.add_argument("--ops", choices=["backward", "all", "none"], default="backward", help="which operators to record (default backward)")
    return p


def memtrace(line, cell, shell):
    """`%%memtrace [--device D] [--model NAME] [--height H] [--save PATH] [--ops O]`: runs the
    cell under a MemoryTracer, then shows the viewer (also when the cell raised: what was
    allocated up to the error is often the point)."""
    from IPython.core.error import UsageError

    from ._tracer import MemoryTracer

    try:
        args = _magic_parser().parse_args(shlex.split(line))
        _css_height(args.height)
    except (_UsageError, ValueError) as e:
        raise UsageError(str(e)) from None
    model = None
    if args.model is not None:
        if args.model not in shell.user_ns:
            raise UsageError(f"%%memtrace --model: no variable named {args.model!r} in the notebook")
        model = shell.user_ns[args.model]
    tracer = MemoryTracer(device=args.device, ops=args.ops)
    with tracer.trace(model):
        result = shell.run_cell(cell, store_history=False)
    if args.save:
        tracer.save(args.save)
    tracer.show(height=args.height)
    if not result.success:
        # The cell fails as it would without the magic (Run All stops), its traceback shown once.
        raise CellFailed()


class CellFailed(Exception):
    """The cell `%%memtrace` ran raised; IPython already showed its traceback."""

    def _render_traceback_(self):
        return ["%%memtrace: the cell raised (traceback above); the viewer shows what it allocated until then"]


def load_ipython_extension(ipython):
    """`%load_ext memory_tracer`: registers the `%%memtrace` cell magic."""

    def magic(line, cell):
        return memtrace(line, cell, ipython)

    magic.__doc__ = memtrace.__doc__
    ipython.register_magic_function(magic, magic_kind="cell", magic_name="memtrace")
