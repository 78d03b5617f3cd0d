#!/usr/bin/env bash
# On the GPU validation machine (README.md): unpack vLLM 0.20.2's files carried in
# .build/i23/one (its _C.abi3.so with only the SM 9.0 cubins, strip_fatbin.py; the rest
# of the package) into /root/site and run bench.py on the two kernel files there.
# usage: run.sh one [quick]
set -euo pipefail
[ "$1" = one ]
echo "eda0759da362314f224f43356e31bf2e72563028d2648001ef0dfad6cf67fe68  .build/i23/one/C90.so.xz" | sha256sum -c
mkdir -p /root/site
tar -xJf .build/i23/one/rest.tar.xz -C /root/site
xz -dc .build/i23/one/C90.so.xz > /root/site/vllm/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
PYTHONPATH=/root/site PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/bench.py" \
  .build/i23/one/k/new_sparse_utils.py .build/i23/one/k/old_sparse_utils.py "${OUT:-.}" "${2:-full}"
