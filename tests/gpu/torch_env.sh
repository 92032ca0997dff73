# Sourced by the tests/gpu scripts: the GPU machine's torch venv ($TORCH_VENV, default
# /opt/torch/.venv) as `venv`, its site-packages as `sp`, and the libraries torch and the
# capture load (torch's own and its NVIDIA wheels') on LD_LIBRARY_PATH.
venv=${TORCH_VENV:-/opt/torch/.venv}
sp=$(echo "$venv"/lib/python3*/site-packages)
export LD_LIBRARY_PATH="$sp/torch/lib:$sp/nvidia/cu13/lib:$sp/nvidia/cudnn/lib:$sp/nvidia/nccl/lib:$sp/nvidia/cusparselt/lib:$sp/nvidia/nvshmem/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
