"""Which driver calls grow the process's device memory beyond what allocation calls show: a
CUPTI subscription to every driver and runtime API call and to resource events (from Python,
slow: an experiment, not a capture), NVML's figure for the process read at each call's entry
and exit; prints the calls inside which it grew (the CUDA context at cuDevicePrimaryCtxRetain,
kernels at their first cuLaunchKernel, 2 MiB pages at stream creation), the issue-67 ledger's
sources beyond the allocation calls.

    python tests/gpu/kernel_memory_probe.py"""
import ctypes, glob, os, sys, collections, time
import torch
site = os.path.dirname(os.path.dirname(torch.__file__))
cupti = ctypes.CDLL(sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcupti.so*")))[-1])
nv = ctypes.CDLL("libnvidia-ml.so.1"); nv.nvmlInit_v2()
h = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
class PI(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
q = getattr(nv, "nvmlDeviceGetComputeRunningProcesses_v3")
pid = os.getpid()
def used():
    n = ctypes.c_uint(64); infos = (PI * 64)()
    if q(h, ctypes.byref(n), infos) != 0: return -1
    for i in range(n.value):
        if infos[i].pid == pid: return infos[i].used
    return 0
class CB(ctypes.Structure):
    _fields_ = [("site", ctypes.c_int), ("fname", ctypes.c_char_p), ("params", ctypes.c_void_p), ("ret", ctypes.c_void_p),
                ("sym", ctypes.c_char_p), ("ctx", ctypes.c_void_p), ("ctxuid", ctypes.c_uint32), ("corr", ctypes.c_void_p), ("cid", ctypes.c_uint32)]
class RD(ctypes.Structure):  # CUpti_ResourceData
    _fields_ = [("context", ctypes.c_void_p), ("handle", ctypes.c_void_p), ("desc", ctypes.c_void_p)]
class MD(ctypes.Structure):
    _fields_ = [("mid", ctypes.c_uint32), ("size", ctypes.c_size_t), ("cubin", ctypes.c_void_p)]
grow = collections.defaultdict(lambda: [0, 0])  # name -> [calls, bytes grown inside]
between = collections.defaultdict(int)
state = {"last": used(), "enter": {}, "prev": "start"}
events = []
FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
def cb(_, dom, cbid, data):
    u = used()
    if dom == 1 or dom == 2:
        d = ctypes.cast(data, ctypes.POINTER(CB)).contents
        name = ("drv:" if dom == 1 else "rt:") + d.fname.decode()
        if d.site == 0:
            if u != state["last"]:
                between[state["prev"]] += u - state["last"]
            state["enter"][(dom, d.cid)] = u
        else:
            e = state["enter"].pop((dom, d.cid), u)
            grow[name][0] += 1; grow[name][1] += u - e
            if u != e: events.append((name, u - e, u, ctypes.cast(d.sym, ctypes.c_char_p).value if d.sym else None))
            state["prev"] = name
    elif dom == 3:
        name = f"res:{cbid}"
        extra = ""
        if cbid in (6, 7, 8) and data:
            r = ctypes.cast(data, ctypes.POINTER(RD)).contents
            m = ctypes.cast(r.desc, ctypes.POINTER(MD)).contents
            extra = f" module {m.mid} cubin {m.size}"
        events.append((name + extra, u - state["last"], u, None))
        grow[name][0] += 1
    state["last"] = u
fn = FN(cb)
sub = ctypes.c_void_p()
print("subscribe", cupti.cuptiSubscribe(ctypes.byref(sub), fn, None))
for dom in (1, 2, 3):
    print("enable", dom, cupti.cuptiEnableDomain(1, sub, dom))
t0 = time.time()
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize(); print("after init", used())
def step(tag):
    before = used()
    a = torch.randn(1024, 1024, device="cuda"); b = a @ a
    c = a.bfloat16() @ a.bfloat16()
    conv = torch.nn.Conv2d(3, 64, 7, padding=3).cuda(); y = conv(torch.randn(8, 3, 224, 224, device="cuda")); y.sum().backward()
    z = torch.nn.functional.layer_norm(b, (1024,)).softmax(-1).relu().sum()
    q_ = torch.randn(4, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    o = torch.nn.functional.scaled_dot_product_attention(q_, q_, q_, is_causal=True)
    torch.cuda.synchronize()
    print(tag, "grew", used() - before, "reserved", torch.cuda.memory_reserved())
step("first"); step("second")
f = torch.compile(lambda t: (t.sin() * 2).cos().sum())
f(torch.randn(1000, device="cuda")); torch.cuda.synchronize(); print("compiled grew to", used())
cupti.cuptiUnsubscribe(sub)
print("time", time.time() - t0)
print("=== growth inside calls")
for k, (n, g) in sorted(grow.items(), key=lambda kv: -abs(kv[1][1]))[:25]: print(f"{k:50s} calls {n:7d} grew {g/2**20:9.1f} MiB")
print("=== growth between calls, after:")
for k, g in sorted(between.items(), key=lambda kv: -abs(kv[1]))[:10]: print(f"{k:50s} {g/2**20:9.1f} MiB")
print("=== events")
for e in events[:200]: print(e[0], round(e[1]/2**20, 1), "MiB now", round(e[2]/2**20,1), e[3])
print("final used", used(), "reserved", torch.cuda.memory_reserved())
