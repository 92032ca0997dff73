# Issue 32 on 2 GPUs: per-rank snapshots of DDP and FSDP2 recorded as users record them (after
# the model is built, so memory from before recording exists), at the size the tests keep and a
# smaller one, and short forward-only loops (leaking and clean) on one GPU; all with PyTorch's
# counters. Everything lands in $OUT/snaps.tar.xz.
#   bash tests/gpu/rank_run.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
py=/opt/torch/.venv/bin/python
w=/tmp/w; mkdir -p $w
nvidia-smi -L
for mode in ddp fsdp2; do
  $py -m torch.distributed.run --nproc-per-node 2 tests/gpu/ddp_snapshots.py $mode $w --prefix ${mode}_big > $w/${mode}_big.log 2>&1; echo "$mode big rc $?"
  $py -m torch.distributed.run --nproc-per-node 2 tests/gpu/ddp_snapshots.py $mode $w --width 256 --blocks 3 --tokens 64 --prefix ${mode}_small > $w/${mode}_small.log 2>&1; echo "$mode small rc $?"
done
CUDA_VISIBLE_DEVICES=0 $py tests/gpu/leak_loop.py $w > $w/leak_loop.log 2>&1; echo "leak rc $?"
grep -h RESULT $w/*.log > $w/results.txt
cat $w/results.txt
ls -la $w
tar -C $w -cJf $OUT/snaps.tar.xz .
