"""The device ledger (`collector trace --ledger`): every byte the driver hands this process,
by the library that asked (the shim's CUPTI subscription, `mt_ledger_start`, on the libcupti
of torch's own CUDA wheels), and NVML's figure for the process and for the others on each
device, sampled beside the driver's used memory."""

import ctypes
import glob
import os


def cupti_path(torch):
    """The libcupti that came with this torch (its NVIDIA wheels, or torch/lib), else None."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    site = os.path.dirname(torch_dir)
    patterns = [
        os.path.join(site, "nvidia", "*", "lib", "libcupti.so*"),
        os.path.join(site, "nvidia", "cuda_cupti", "lib", "libcupti.so*"),
        os.path.join(torch_dir, "lib", "libcupti*.so*"),
    ]
    for p in patterns:
        found = sorted(glob.glob(p))
        if found:
            return found[-1]
    return None


def start(lib, torch):
    """Subscribes the shim to the driver's allocations; None, or why not."""
    if not hasattr(lib, "mt_ledger_start"):
        return "this capture library has no ledger"
    if not torch.cuda.is_available():
        return "no CUDA device"
    path = cupti_path(torch)
    if path is None:
        return "no libcupti beside torch (its NVIDIA wheels carry one)"
    if lib.mt_ledger_start(path.encode()) != 0:
        from . import _shim

        return _shim.last_error(lib)
    return None


def nccl_communicators(lib):
    """Points NCCL at the shim as its profiler plugin (NCCL 2.25 and newer read
    NCCL_PROFILER_PLUGIN when a communicator is made; the shim then hears which communicator
    each NCCL allocation is for); None, or why NCCL's bytes will not be split by communicator.
    A program that names a plugin of its own keeps it."""
    if not hasattr(lib, "ncclProfiler_v4"):
        return "this capture library cannot tell NCCL's communicators apart"
    own = os.environ.get("NCCL_PROFILER_PLUGIN")
    if own:
        return f"NCCL_PROFILER_PLUGIN is the program's own ({own}): NCCL's bytes are not split by communicator"
    path = getattr(lib, "_name", None)
    if not path or not os.path.isabs(path):
        return "the capture library's path is unknown: NCCL's bytes are not split by communicator"
    os.environ["NCCL_PROFILER_PLUGIN"] = path
    return None


def growth_missing(lib):
    """Why the driver's own growth (kernels loaded at their first launch, streams, CUDA
    graphs) is not measured, or None."""
    if not hasattr(lib, "mt_ledger_growth_watched") or lib.mt_ledger_growth_watched() <= 0:
        return "no growth of kernels, streams or CUDA graphs measured (this capture library, CUPTI or driver cannot): it stays unexplained"
    return None


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]


class Nvml:
    """This process's and the other processes' device memory, as NVML counts them, by CUDA
    device index (matched by PCI bus id: CUDA_VISIBLE_DEVICES reorders); `why` says why not."""

    def __init__(self, torch):
        self.handles = {}
        self.why = None
        self.mig = []  # devices that are MIG instances: NVML counts no memory per process there
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0:
                self.why = "NVML does not start"
                return
            self.query = getattr(self.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None) or self.lib.nvmlDeviceGetComputeRunningProcesses_v2
            for d in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(d)
                bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".encode()
                h = ctypes.c_void_p()
                if self.lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(h)) == 0:
                    self.handles[d] = h
                    if self._mig(h):
                        self.mig.append(d)
        except (OSError, AttributeError) as e:
            self.why = f"no NVML ({e})"

    def _mig(self, handle):
        """Whether the GPU runs MIG instances (then NVML's per-process figures are of the
        whole GPU's processes, or not available)."""
        get = getattr(self.lib, "nvmlDeviceGetMigMode", None)
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        return get is not None and get(handle, ctypes.byref(current), ctypes.byref(pending)) == 0 and current.value == 1

    def missing(self):
        """What NVML cannot give for some devices, in words."""
        return [
            f"cuda:{d} is a MIG instance: NVML counts no memory per process on it, so the context, other processes and the unexplained rest are unknown"
            for d in self.mig
        ]

    def usage(self, device):
        """(this process's bytes, the other processes' bytes) on `device`, or None."""
        h = self.handles.get(device)
        if h is None or device in self.mig:
            return None
        n = ctypes.c_uint(64)
        infos = (_ProcessInfo * 64)()
        if self.query(h, ctypes.byref(n), infos) != 0:
            return None
        me, others, pid = None, 0, os.getpid()
        for i in range(min(n.value, 64)):
            used = infos[i].used
            if used >= (1 << 63):  # NVML_VALUE_NOT_AVAILABLE (MIG, some containers)
                continue
            if infos[i].pid == pid:
                me = (me or 0) + used
            else:
                others += used
        return None if me is None else (me, others)
