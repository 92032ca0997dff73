# Small training-like workload traced with DFTracer: compute spans and real file I/O.
import os
from dftracer.python import dftracer, dft_fn
log = dftracer.initialize_log(logfile="/tmp/dftrun/out", data_dir="/tmp/dftrun", process_id=-1)
os.makedirs("/tmp/dftrun/data", exist_ok=True)
for i in range(2):
    with open(f"/tmp/dftrun/data/shard{i}.bin", "wb") as f:
        f.write(os.urandom(4096))
def work(n):
    s = 0
    for k in range(n):
        s += k * k
    return s
for epoch in range(2):
    for step in range(3):
        with dft_fn(cat="data", name="fetch", epoch=epoch, step=step):
            with open(f"/tmp/dftrun/data/shard{step % 2}.bin", "rb") as f:
                f.read()
        with dft_fn(cat="compute", name="forward", epoch=epoch, step=step):
            work(20000)
        with dft_fn(cat="compute", name="backward", epoch=epoch, step=step):
            work(40000)
        with dft_fn(cat="compute", name="optimizer_step", epoch=epoch, step=step):
            work(5000)
log.finalize()
