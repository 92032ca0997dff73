"""Memory Tracer for Python programs.

Two ways in:

- Run any program under the collector, no code changes::

      collector trace -o run.mtrace.json -- python train.py --epochs 1

- Or trace a block from inside the program with the MemoryTracer API::

      from memory_tracer import MemoryTracer
      tracer = MemoryTracer(max_events=100_000)
      with tracer.trace(model):
          loss = model(x).sum(); loss.backward(); opt.step()
      tracer.print_summary()
      tracer.export_flame_graph("memory_profile.json")   # speedscope
      tracer.save("run.mtrace.json")                     # opens in the viewer
      tracer.show()                                      # the viewer, inline in Jupyter

Both record every allocation and free of PyTorch's allocators (with allocated and reserved
totals), every operator, and the nn.Module path, phase and iteration they belong to, through
the same C++ shim as `collector trace --model`, and both are analysed by the same collector.
`mark(name)` adds a mark to whichever capture is running. In Jupyter, `show(path)` displays any
trace or snapshot inline and `%load_ext memory_tracer` adds the `%%memtrace` cell magic; under
pytest, `budget("2GiB")` (or `--memory-budget`) fails tests whose peak is over a budget.
"""

from . import _capture
from ._tracer import LayerMemoryStats, MemoryTracer, collector_path

__all__ = ["MemoryTracer", "LayerMemoryStats", "mark", "pause", "resume", "is_tracing", "show", "budget", "load_ipython_extension"]
__version__ = "0.1.0"


def mark(name, value=None):
    """Adds a named mark at this moment to the running capture (no-op when none runs)."""
    cap = _capture.current()
    if cap is not None:
        cap.mark(str(name), value)


def pause():
    """Stops recording until resume() (call from the thread that runs the model)."""
    cap = _capture.current()
    if cap is not None:
        cap.pause()


def resume():
    cap = _capture.current()
    if cap is not None:
        cap.resume()


def is_tracing():
    cap = _capture.current()
    return cap is not None and cap.enabled


def show(path, height=None):
    """Displays the viewer with the trace or PyTorch snapshot at `path` inline in a Jupyter
    notebook (one self-contained HTML output: works offline and survives saving).
    height: pixels (default 720) or a CSS length ("80vh"). Needs IPython (`pip install memory_tracer[notebook]`)."""
    from . import _notebook

    _notebook.show(path, height)


def load_ipython_extension(ipython):
    """`%load_ext memory_tracer`: the `%%memtrace` cell magic (traces the cell, shows the viewer)."""
    from . import _notebook

    _notebook.load_ipython_extension(ipython)


def budget(size):
    """`@memory_tracer.budget("2GiB")`: under pytest, fails the test when its peak allocated
    memory is over `size` (6GiB, 512MiB, 1.5GB or bytes; None: no budget, also under
    --memory-budget). The same as `@pytest.mark.memory_budget(size)`."""
    import pytest

    return pytest.mark.memory_budget(size)
