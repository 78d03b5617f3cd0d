#!/usr/bin/env bash
# Calibrates flash_attn_job_peak_mb: compiles ONE flash-attn kernel source for one
# architecture with the flags flash-attn's setup.py uses, under /usr/bin/time -v, once per
# NVCC_THREADS value, and checks with cuobjdump that the object holds that architecture only.
#
# Usage: nvcc_calibrate.sh SRC_DIR PYTHON OUT_DIR [ARCH] [THREADS...]
#   SRC_DIR  the unpacked flash-attn sdist (pip download --no-deps --no-binary :all: flash-attn==2.8.3)
#   PYTHON   a python with torch (its headers are needed)
#   ARCH     default 120; THREADS default "1 2"
# Env: CUDA_HOME (default /usr/local/cuda), CUOBJDUMP (default cuobjdump on PATH),
#      KERNEL (default csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu)
set -euo pipefail
src=$1 py=$2 out=$3 arch=${4:-120}
shift $(( $# < 4 ? $# : 4 ))
threads=("${@:-1 2}")
[[ ${#threads[@]} -eq 1 ]] && read -r -a threads <<<"${threads[0]}"
cuda=${CUDA_HOME:-/usr/local/cuda}
kernel=${KERNEL:-csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu}
cuobjdump=${CUOBJDUMP:-cuobjdump}
tinc=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
pinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
mkdir -p "$out"
for t in "${threads[@]}"; do
  obj="$out/kernel_sm${arch}_t$t.o"
  /usr/bin/time -v -o "$out/time_t$t.log" "$cuda/bin/nvcc" -c "$src/$kernel" -o "$obj" \
    -I"$src/csrc/flash_attn" -I"$src/csrc/flash_attn/src" -I"$src/csrc/cutlass/include" \
    -I"$tinc" -I"$tinc/torch/csrc/api/include" -I"$pinc" \
    -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=flash_attn_2_cuda -D_GLIBCXX_USE_CXX11_ABI=1 \
    -Xcompiler -fPIC -O3 -std=c++17 -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ \
    -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr \
    --expt-extended-lambda --use_fast_math -gencode "arch=compute_$arch,code=sm_$arch" --threads "$t"
  rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$out/time_t$t.log")
  wall=$(awk -F'): ' '/Elapsed \(wall clock\)/ {print $2}' "$out/time_t$t.log")
  archs=$("$cuobjdump" --list-elf "$obj" | grep -o 'sm_[0-9]*[a-z]*' | sort -u | tr '\n' ' ')
  ptx=$("$cuobjdump" --list-ptx "$obj" 2>/dev/null | grep -c 'ptx' || true)
  echo "NVCC_THREADS=$t peak_rss_kb=$rss_kb wall=$wall elf_archs=${archs% } ptx_entries=$ptx"
  if [[ ${archs% } != "sm_$arch" || $ptx != 0 ]]; then
    echo "object holds more than sm_$arch: ${archs% } (ptx $ptx)" >&2
    exit 1
  fi
done
