#!/bin/bash
# Run 5 (issue 13), here: what the GPU validation machine needs to serve the small-top-k
# fixture with the patched vLLM, cut into pieces of at most 50 MiB (one per device call: the tree that travels with it is ~12 MiB).
#   wheels  the lock's wheels that machine lacks (sha256 checked against the lock), as in
#           run 3, less what serving never imports (flashinfer, tilelang, z3-solver,
#           cuda-tile, quack-kernels, fastsafetensors, numba/llvmlite, hf-xet, the
#           fastapi CLIs; the first serving try died on `No module named
#           'opentelemetry'`: those wheels travelled in a ninth call, c8/extra). vLLM's wheel travels without
#           vllm_flash_attn/_vllm_fa2_C.abi3.so (82 MB compressed): FlashAttention 2 is
#           vLLM's path below SM 9.0; on the H200 it takes FA3 (_vllm_fa3_C, kept).
#   gguf    tiny-glm5-topk32's UD-Q4_K_XL GGUF (index_topk 32), hf/ its small files
# usage: docs/validation/e2e-gpu/run5/pack.sh WHEEL_DIR   (pip download --no-deps of the lock)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
cd "$repo"
wheels_in=$1
lock=roles/ml_env/files/locks/requirements-py3.12.txt
fixture=.cache/fixtures/tiny-glm5-topk32
out=.build/e2e5
rm -rf "$out" && mkdir -p "$out/payload"/{wheels,gguf,hf}
skip='^(flashinfer-cubin|flashinfer-python|tilelang|z3-solver|cuda-tile|quack-kernels|fastsafetensors|numba|llvmlite|hf-xet|fastapi-cli|fastapi-cloud-cli|rignore|sentry-sdk)$'
lock_hashes() { awk -v p="$1 " 'index($0,p)==1{f=1;next} f&&/--hash=sha256:/{sub(/.*sha256:/,"");sub(/ .*/,"");print;next} f&&!/^ /{f=0}' "$lock"; }
for whl in "$wheels_in"/*.whl; do
  base=$(basename "$whl")
  name=$(echo "${base%%-[0-9]*}" | tr '_A-Z' '-a-z')
  [[ $name =~ $skip ]] && continue
  version=$(echo "$base" | cut -d- -f2)
  sum=$(sha256sum "$whl" | cut -d' ' -f1)
  lock_hashes "$name==$version" | grep -x "$sum" >/dev/null \
    || { echo "pack: $base is not in the lock with this hash" >&2; exit 1; }
  cp "$whl" "$out/payload/wheels/"
done
vllm_whl=$(ls "$out"/payload/wheels/vllm-0.20.2-*.whl)
python3 - "$vllm_whl" <<'PY'
import sys, zipfile, os
src = sys.argv[1]; tmp = src + ".new"
drop = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if info.filename == drop:
            continue
        data = zi.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l + b"\n" for l in data.splitlines() if not l.startswith(drop.encode()))
        zo.writestr(info, data)
os.replace(tmp, src)
PY
cp "$fixture"/gguf/tiny-glm5-UD-Q4_K_XL.gguf "$out/payload/gguf/"
find "$fixture/hf" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$out/payload/hf/" \;
(cd "$out/payload" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
tar -C "$out/payload" -cf "$out/payload.tar" .
sha256sum "$out/payload.tar" | sed "s|$out/||" > "$out/payload.sha256"
(cd "$out" && split -b 50M -a 2 payload.tar payload.part.)
n=0
for part in "$out"/payload.part.*; do mkdir -p "$out/c$n" && mv "$part" "$out/c$n/"; n=$((n + 1)); done
cp "$out/payload.sha256" "$out/c0/"
rm -rf "$out/payload" "$out/payload.tar"
du -sm "$out"/c* | sed 's/^/pack: /'
echo "pack: $n pieces; payload $(cut -d' ' -f1 "$out/payload.sha256")"
