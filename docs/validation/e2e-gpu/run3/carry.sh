#!/bin/bash
# Run 3, carrying call N (0..9): moves this call's carried folder (.build/e2e3/cN: one
# 60 MiB piece of payload.tar; call 0 also the fixture's small hf/ files) out of the
# tree into /root/stash, which stays while the machine is warm. Call 0 also records the
# machine's facts and starts rebuilding the bf16 safetensors in the background (seeded
# generator of the fixture: same bytes, checked against the manifest by serve.sh).
set -e
n=$1
mkdir -p /root/stash
cp -a ".build/e2e3/c$n/." /root/stash/
echo "call $n: stash has $(ls /root/stash | wc -l) entries, $(du -sm /root/stash | cut -f1) MiB"
if [ "$n" = 0 ]; then
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,persistence_mode --format=csv
  echo "--- /proc/devices (NVIDIA character devices)"
  grep -i nvidia /proc/devices || true
  ls -la /dev/nvidia* 2>&1 | head -20
  command -v nvcc || ls -d /usr/local/cuda* 2>&1
  python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers (machine)', transformers.__version__)"
  mkdir -p /root/hf /root/hfgen
  cp /root/stash/hf/* /root/hf/
  setsid nohup env PYTHONPATH="$PWD/src" python3 docs/validation/e2e-gpu/gen_weights.py /root/hf /root/hfgen \
    > /root/hf_gen.log 2>&1 < /dev/null &
  echo "safetensors generation started"
fi
