#!/bin/bash
# Stage 4 (GGUF linear layers) on the H200 with vLLM's own GGUF kernels, after the run-3
# payload was carried (docs/validation/e2e-gpu/run3/carry.sh 0..6):
#   A  the tiny llama.cpp GLM-5 (UD-Q4_K_XL, 2 shards) at TP 1, stage 4, patched vLLM
#   A' the same, stage 4, on vLLM lacking patch 0007 (the fault of GPU run 3)
#   B  a synthetic glm-dsa GGUF at GLM-5's real dimensions (glm5dims.py), stage 4 at TP 8
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
REPO=$PWD
cat /root/stash/payload.part.* > /root/payload.tar
echo "$(cut -d' ' -f1 /root/stash/payload.sha256)  /root/payload.tar" | sha256sum -c || exit 1
rm -rf /root/p /root/site /root/no7 && mkdir /root/p && tar -xf /root/payload.tar -C /root/p \
  && (cd /root/p && sha256sum -c --quiet SHA256SUMS) || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site \
  /root/p/wheels/*.whl 2>&1 | grep -v "WARNING: Target directory" | tail -3
for p in "$REPO"/files/patches/vllm-0.20.2/*.patch; do
  patch -p1 -s -d /root/site < "$p" || { echo "PATCH FAILED: $p"; exit 1; }
done
# vLLM without 0007: a tree of links to the patched one, 0007's files real and reversed
mkdir -p /root/no7 && cp -as /root/site/vllm /root/no7/vllm
p7=$(ls "$REPO"/files/patches/vllm-0.20.2/0007-*.patch)
for rel in $(sed -n 's|^+++ b/||p' "$p7"); do rm /root/no7/$rel && cp /root/site/$rel /root/no7/$rel; done
patch -R -p1 -s -d /root/no7 < "$p7" || { echo "reverse of 0007 failed"; exit 1; }
el "installed, patched (0001-0007), no-0007 overlay made"
export PYTHONPATH=/root/site:$REPO/src
D="python3 -m glm5_tools.diagnostics"
$D --gguf /root/p/gguf --hf-config /root/stash/hf --tp 1 --device cuda --stages 4 --json $OUT/tiny-tp1.json \
  2>&1 | grep -vE "^(INFO|WARNING|DEBUG)|^\(|warn" ; el "A done"
PYTHONPATH=/root/no7:$PYTHONPATH $D --gguf /root/p/gguf --hf-config /root/stash/hf --tp 1 --device cuda --stages 4 \
  --json $OUT/tiny-tp1-no0007.json 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)|^\(|warn" | head -12; el "A' done"
python3 "$REPO/docs/validation/diagnostics-gpu/run2/glm5dims.py" /root/g5
timeout 300 $D --gguf /root/g5/glm5dims.gguf --hf-config /root/g5 --tp 8 --device cuda --stages 4 \
  --json $OUT/glm5dims-tp8.json 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)|^\(|warn"; el "B done"
