"""The `MemoryTracer` API (`memory_tracer.MemoryTracer`): a block of the program traced into a
collector it starts (`collector ingest`), then read back as tables, summaries and exports; and
`collector_path`, the collector binary it (and `python -m memory_tracer`, the notebook magic)
runs."""

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import weakref

from . import _capture, _shim


@dataclasses.dataclass
class LayerMemoryStats:
    layer_name: str
    peak_allocated: int
    peak_reserved: int
    total_allocations: int
    total_deallocations: int
    avg_fragmentation: float
    duration_ms: float
    allocated_bytes_total: int = 0
    # Of allocated_bytes_total, those in a private pool (CUDA graphs' memory, a MemPool).
    private_pool_bytes: int = 0


def _installed_collectors():
    """Where the wheel that installed this package put its `collector` script: the path its
    RECORD names (venvs, --user, --prefix), then `bin/` beside the package (`pip install
    --target`, whose RECORD paths point outside the target)."""
    from importlib import metadata

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        dist = metadata.distribution("memory_tracer")
    except metadata.PackageNotFoundError:
        dist = None
    # Only the distribution this very package came from (not one installed elsewhere).
    if dist is not None and os.path.abspath(str(dist.locate_file("memory_tracer/__init__.py"))) == os.path.join(here, "__init__.py"):
        for f in dist.files or ():
            if f.name == "collector":
                yield os.path.abspath(str(dist.locate_file(f)))
    yield os.path.join(os.path.dirname(here), "bin", "collector")


def collector_path():
    """The collector binary: $MEMORY_TRACER_COLLECTOR, the one the wheel installed with this
    package, or PATH."""
    env = os.environ.get("MEMORY_TRACER_COLLECTOR")
    if env:
        return env
    for installed in _installed_collectors():
        if os.path.isfile(installed) and os.access(installed, os.X_OK):
            return installed
    found = shutil.which("collector")
    if found:
        return found
    raise RuntimeError("memory-tracer: no collector binary found (set MEMORY_TRACER_COLLECTOR or install the memory_tracer wheel)")


class MemoryTracer:
    """Records allocations, operators and layers of the code run inside `trace()`.

    max_events: allocations and frees kept (operators are bounded alike); later ones are
        dropped and counted.
    device: "cpu", "cuda" or "cuda:N" (default: "cuda:0" when CUDA is available, else "cpu").
    enable_fragmentation_tracking: False reports fragmentation as 0.
    ops: "backward" (default: autograd nodes only; every allocation still gets its module,
        phase and iteration), "all" (every operator with its tensors; costs about a
        microsecond per operator) or "none" (allocations and module scopes only).
    module_scopes: False records no module paths (allocations keep their phase and
        iteration); with ops="none", the cheapest capture.
    tensorboard_dir: a TensorBoard log folder (a training run's, say): each trace adds an event
        file of memory scalars per iteration there (see `to_tensorboard`); nothing there is
        overwritten.
    holders: True records who holds each tensor's memory (parameters, buffers, gradients,
        optimizer state, tensors saved for backward), "python" also the Python variables
        holding tensors at each mark, backward and optimizer step; `collector why` reads them.
    ledger: True (a CUDA device) also records the device ledger: every byte the driver gives
        the process, by the library that asked (NCCL, cuBLAS, kernels, raw cudaMalloc, ...),
        and NVML's count for the process; `collector ledger` reads it.
    """

    _OPS = {"none": 0, "all": 1, "backward": 2}

    def __init__(self, max_events=100_000, device=None, enable_fragmentation_tracking=True, enable_fragmentation=None, capture_tensors=True, ops="backward", module_scopes=True, tensorboard_dir=None, holders=False, ledger=False):
        if ops not in self._OPS:
            raise ValueError(f"memory-tracer: invalid ops {ops!r}; expected one of {sorted(self._OPS)}")
        self.ops = ops
        if int(max_events) < 1:
            raise ValueError("max_events must be at least 1")
        self.max_events = int(max_events)
        self.device = device
        self.enable_fragmentation_tracking = bool(enable_fragmentation_tracking if enable_fragmentation is None else enable_fragmentation)
        self.capture_tensors = bool(capture_tensors)
        self.module_scopes = bool(module_scopes)
        self.tensorboard_dir = None if tensorboard_dir is None else os.fspath(tensorboard_dir)
        if holders not in (False, True, "python"):
            raise ValueError(f"memory-tracer: invalid holders {holders!r}; expected False, True or 'python'")
        self.holders = 2 if holders == "python" else int(bool(holders))
        self.ledger = bool(ledger)
        self._result = None
        self._dir = None
        self._trace_path = None
        self._scopes = []

    def _resolve_device(self):
        import torch

        dev = self.device
        if dev is None:
            dev = "cuda:0" if torch.cuda.is_available() else "cpu"
        dev = str(dev)
        if dev == "cuda":
            dev = "cuda:0"
        if dev.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ValueError(f"memory-tracer: device {dev!r} asked for, but this PyTorch sees no CUDA device; use device='cpu'")
            try:
                index = int(dev.split(":", 1)[1])
            except (IndexError, ValueError):
                raise ValueError(f"memory-tracer: invalid device {dev!r}; expected cpu, cuda or cuda:N") from None
            if index >= torch.cuda.device_count():
                raise ValueError(f"memory-tracer: device {dev!r} does not exist ({torch.cuda.device_count()} CUDA devices)")
            return dev, index
        if dev != "cpu":
            raise ValueError(f"memory-tracer: invalid device {dev!r}; expected cpu, cuda or cuda:N")
        return dev, None

    @contextlib.contextmanager
    def trace(self, model=None):
        """Records the block; `model` (optional) names layers by their paths in it."""
        import torch  # noqa: F401  (the shim binds to the libtorch torch loaded)

        problem = _shim.check_torch_version(torch.__version__)
        if problem:
            raise RuntimeError(f"memory-tracer: {problem}")
        dev, index = self._resolve_device()
        collector = collector_path()
        if self._dir is None:
            # The tracer's scratch folder (its trace, the tables it converts): removed with the
            # tracer, or at exit; `save()` keeps a trace.
            self._dir = tempfile.mkdtemp(prefix="memory-tracer-")
            weakref.finalize(self, shutil.rmtree, self._dir, True)
        out = os.path.join(self._dir, "trace.mtrace.json")
        ours, theirs = socket.socketpair()
        cmd = [collector, "ingest", "--fd", str(theirs.fileno()), "--output", out, "--stats-json", "--device", dev]
        if not self.enable_fragmentation_tracking:
            cmd.append("--no-fragmentation")
        proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        theirs.close()
        options = {"max_events": self.max_events, "capture_tensors": self.capture_tensors and self.ops == "all", "capture_ops": self._OPS[self.ops], "module_scopes": self.module_scopes, "holders": self.holders, "ledger": bool(self.ledger and index is not None)}
        try:
            cap = _capture.begin(_shim.load(), ours.detach(), options, "api", {"mode": "api", "device": dev}, reset_peak_device=index)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if model is not None:
            cap.name_root(model, main=True)
        try:
            yield self
        finally:
            cap.finish("api")
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"memory-tracer: the collector could not build the trace: {stderr.decode(errors='replace').strip()}")
            self._result = json.loads(stdout)
            self._trace_path = out
            if self.tensorboard_dir is not None:
                self._convert(self.tensorboard_dir, "tensorboard")

    @contextlib.contextmanager
    def trace_module(self, name):
        """A layer scope named `name` around the block (nested inside module scopes)."""
        cap = _capture.current()
        if cap is None or not cap.enabled:
            yield self
            return
        i = cap.intern(str(name))
        cap.lib.mt_scope_enter(i)
        try:
            yield self
        finally:
            cap.lib.mt_scope_exit(i)

    def _need(self):
        if self._result is None:
            raise RuntimeError("memory-tracer: nothing traced yet; run code inside `with tracer.trace():` first")
        return self._result

    def get_layer_stats(self):
        known = {f.name for f in dataclasses.fields(LayerMemoryStats)}
        return {k: LayerMemoryStats(**{f: x for f, x in v.items() if f in known}) for k, v in self._need()["layer_stats"].items()}

    def get_peak_memory_per_layer(self):
        return dict(self._need()["peak_memory_per_layer"])

    def get_fragmentation_stats(self):
        """Average fragmentation ratio (0-1) per layer."""
        return dict(self._need()["fragmentation"]["per_layer"])

    def get_summary(self):
        """Peak, when, totals and PyTorch's own counters, as a dict."""
        return dict(self._need()["summary"])

    def _convert(self, path, fmt, *extra):
        self._need()
        fmt_args = [] if fmt is None else ["--format", fmt]
        r = subprocess.run([collector_path(), "convert", self._trace_path, "--output", os.fspath(path), *fmt_args, *extra], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory-tracer: cannot write {path}: {r.stderr.strip()}")

    def to_tensorboard(self, writer):
        """Adds the memory scalars of every iteration to a `torch.utils.tensorboard.SummaryWriter`
        (or anything with its `add_scalar(tag, value, global_step, walltime)`): `memory/peak_allocated`,
        `memory/peak_reserved`, `memory/fragmentation`, `memory/peak_<phase>`,
        `memory/allocated_at_end` and `memory/leak_growth`, step = iteration."""
        steps = self._need()["tensorboard"]
        for s in steps:
            for tag, value in s["scalars"]:
                writer.add_scalar(tag, value, global_step=s["step"], walltime=s["wall_time"])
        return len(steps)

    def _parquet(self, table):
        if table not in ("events", "layers", "operators"):
            raise ValueError(f"memory-tracer: unknown table {table!r}; expected events, layers or operators")
        self._need()
        path = os.path.join(self._dir, f"{table}.parquet")
        self._convert(path, None, "--table", table)
        return path

    def to_pandas(self, table="events"):
        """The trace as a pandas DataFrame: one row per memory event (`table="events"`: time,
        type, size, address, allocated and reserved totals, layer, phase, category, device,
        rank), per layer (`"layers"`) or per operator (`"operators"`). Needs pandas and pyarrow
        (`pip install memory_tracer[pandas]`)."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError("memory-tracer: to_pandas needs pandas and pyarrow: pip install memory_tracer[pandas]") from e
        return pandas.read_parquet(self._parquet(table))

    def to_polars(self, table="events"):
        """The trace as a polars DataFrame (the tables of `to_pandas`). Needs polars
        (`pip install memory_tracer[polars]`)."""
        try:
            import polars
        except ImportError as e:
            raise ImportError("memory-tracer: to_polars needs polars: pip install memory_tracer[polars]") from e
        return polars.read_parquet(self._parquet(table))

    def export_flame_graph(self, output_path):
        """Speedscope JSON (https://www.speedscope.app/)."""
        self._convert(output_path, "speedscope")

    def export_timeline(self, output_path):
        """Timeline JSON: `events`, `layer_stats`, `summary`."""
        self._convert(output_path, "timeline")

    def export_chrome_trace(self, output_path):
        """Chrome trace JSON (Perfetto)."""
        self._convert(output_path, "chrome")

    def save(self, output_path):
        """Memory Tracer's own format (open it in the viewer or with `collector summary`)."""
        self._need()
        shutil.copyfile(self._trace_path, output_path)

    def show(self, height=None):
        """Displays the viewer with this trace inline in a Jupyter notebook (see `show`)."""
        from . import _notebook

        self._need()
        _notebook.show(self._trace_path, height)

    def print_summary(self):
        self._need()
        r = subprocess.run([collector_path(), "summary", self._trace_path], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory-tracer: cannot summarise: {r.stderr.strip()}")
        sys.stdout.write(r.stdout)
        sys.stdout.flush()
