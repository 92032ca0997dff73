# Sourced by the tests/gpu scripts: the GPU machine's torch venv ($TORCH_VENV, default
# /opt/torch/.venv) as `venv`, its site-packages as `sp`, and the libraries torch and the
# capture load (torch's own and its NVIDIA wheels') on LD_LIBRARY_PATH; and `check`, which
# prints the CHECK line of tests/gpu/README.md (tests/gpu/checks.py is its Python twin).
venv=${TORCH_VENV:-/opt/torch/.venv}
sp=$(echo "$venv"/lib/python3*/site-packages)
export LD_LIBRARY_PATH="$sp/torch/lib:$sp/nvidia/cu13/lib:$sp/nvidia/cudnn/lib:$sp/nvidia/nccl/lib:$sp/nvidia/cusparselt/lib:$sp/nvidia/nvshmem/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# check NAME FIGURE BOUND TEST...: runs TEST and prints `CHECK NAME FIGURE BOUND PASS|FAIL`
# (whitespace in a word becomes `_`, an empty one `-`); returns TEST's verdict, for
# `check ... || fail=1`.
check() {
  local words=() parts w verdict=PASS
  for w in "$1" "$2" "$3"; do
    read -ra parts <<<"$w"
    w=$(IFS=_; echo "${parts[*]}")
    words+=("${w:--}")
  done
  shift 3
  "$@" || verdict=FAIL
  echo "CHECK ${words[*]} $verdict"
  [ "$verdict" = PASS ]
}
