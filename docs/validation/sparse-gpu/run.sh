#!/usr/bin/env bash
# On the GPU validation machine: the sparse attention kernels of patch 0011 at
# GLM-5's real dims (bench_kernels.py). $1: folder holding sparse_utils.py of the
# patched vLLM tree (the kernels) and vLLM 0.20.2's triton_decode_attention.py.
set -euo pipefail
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/bench_kernels.py" "$1/sparse_utils.py" \
  "$1/triton_decode_attention.py" "${OUT:-.}/bench.json"
