#!/usr/bin/env bash
# On the GPU validation machine (docs/validation/sparse-speed/README.md).
# run.sh stash N: copy carried piece N (.build/i23/cN) to /root/stash (kept while warm).
# run.sh bench [quick]: unpack vLLM 0.20.2's files (xz of _C.abi3.so in two pieces,
# the rest of its package) into /root/site and run bench.py on the two kernel files
# (.build/i23/k: this branch's and main's sparse_utils.py of patch 0011).
set -euo pipefail
case "$1" in
stash)
  mkdir -p /root/stash
  cp -a ".build/i23/c$2/." /root/stash/
  echo "stash: $(ls /root/stash | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  command -v nvcc || echo "no nvcc"
  ;;
bench)
  cp -a .build/i23/c2/. /root/stash/
  cat /root/stash/C.part0 /root/stash/C.part1 > /root/C.so.xz
  echo "67389647f46cb7ae8e3619de76d8d800e40a783844fe58cbebc3eb53270eec7d  /root/C.so.xz" | sha256sum -c
  mkdir -p /root/site
  tar -xJf /root/stash/rest.tar.xz -C /root/site
  xz -dc /root/C.so.xz > /root/site/vllm/_C.abi3.so
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  PYTHONPATH=/root/site PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/bench.py" \
    .build/i23/k/new_sparse_utils.py .build/i23/k/old_sparse_utils.py "${OUT:-.}" "${2:-full}"
  ;;
one)
  # one call: _C.abi3.so with only its SM 9.0 cubins kept (strip_fatbin.py; PTX kept)
  echo "eda0759da362314f224f43356e31bf2e72563028d2648001ef0dfad6cf67fe68  .build/i23/one/C90.so.xz" | sha256sum -c
  mkdir -p /root/site
  tar -xJf .build/i23/one/rest.tar.xz -C /root/site
  xz -dc .build/i23/one/C90.so.xz > /root/site/vllm/_C.abi3.so
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  PYTHONPATH=/root/site PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/bench.py" \
    .build/i23/one/k/new_sparse_utils.py .build/i23/one/k/old_sparse_utils.py "${OUT:-.}" "${2:-full}"
  ;;
esac
