#!/bin/bash
# Run 6 (issue 23), here: what the GPU validation machine needs to serve the tiny GLM-5 with
# the patched vLLM, in 5 pieces (one per device call; with the ~21 MiB tree that travels each call
# stays under 64 MiB). Lighter than run 5's 13 pieces:
#   site.tar.xz  the lock's wheels that machine lacks (sha256 checked against the lock;
#                the list below), installed here with pip --target for CPython 3.12 /
#                manylinux, less what serving never loads: vLLM's FlashAttention 2 library
#                (below SM 9.0 only), xgrammar's static lib/libxgrammar.a; the CUDA
#                libraries of vLLM (_C, _moe_C, _C_stable_libtorch, _flashmla_C, FA3) with
#                the other SMs' cubins zeroed (tools/gpu/strip_fatbin.py, SM 90 kept)
#   gguf         tiny-glm5-topk32's UD-Q4_K_XL GGUF (index_topk 32). The main fixture's
#                unsplit GGUF differs from it in two bytes (the glm-dsa index_topk value,
#                2048 instead of 32): serve6.sh makes it there and checks its sha256
#   hf, hf-main  the two fixtures' small HF files (config.json differs in index_topk)
# usage: docs/validation/e2e-gpu/run6/pack6.sh WHEEL_DIR  (WHEEL_DIR: pip download --no-deps
#        --only-binary=:all: --python-version 3.12 --platform manylinux_2_{35,28,17}_x86_64 of
#        the pins in $want)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
cd "$repo"
wheels_in=$(cd "$1" && pwd)
lock=roles/ml_env/files/locks/requirements-py3.12.txt
out=.build/e6
want="annotated-types anthropic apache-tvm-ffi astor blake3 cachetools cbor2 cffi compressed-tensors
cryptography depyf dill diskcache dnspython docstring-parser email-validator fastapi gguf
googleapis-common-protos httpcore2 httptools httpx2 ijson interegular jiter jmespath jsonschema
jsonschema-specifications lark llguidance lm-format-enforcer loguru mcp mcp-types mistral-common
model-hosting-container-standards msgspec openai openai-harmony opentelemetry-api
opentelemetry-exporter-http-transport opentelemetry-exporter-otlp opentelemetry-exporter-otlp-common
opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-grpc
opentelemetry-exporter-otlp-proto-http opentelemetry-proto opentelemetry-sdk
opentelemetry-semantic-conventions opentelemetry-semantic-conventions-ai outlines-core
partial-json-parser prometheus-fastapi-instrumentator pybase64 pycountry pycparser pydantic
pydantic-core pydantic-extra-types pydantic-settings pyjwt python-dotenv python-json-logger
python-multipart pyzmq referencing rpds-py setproctitle sniffio sse-starlette starlette supervisor
torch-c-dlpack-ext truststore typing-inspection uvicorn vllm watchfiles websockets xgrammar
transformers tokenizers huggingface-hub"
lock_hashes() { awk -v p="$1 " 'index($0,p)==1{f=1;next} f&&/--hash=sha256:/{sub(/.*sha256:/,"");sub(/ .*/,"");print;next} f&&!/^ /{f=0}' "$lock"; }
mkdir -p "$out"
n=0
for whl in "$wheels_in"/*.whl; do
  base=$(basename "$whl")
  name=$(echo "${base%%-[0-9]*}" | tr '_A-Z' '-a-z')
  version=$(echo "$base" | cut -d- -f2)
  echo " $want " | tr '\n' ' ' | grep -q " $name " || { echo "pack6: $base is not wanted" >&2; exit 1; }
  lock_hashes "$name==$version" | grep -x "$(sha256sum "$whl" | cut -d' ' -f1)" >/dev/null \
    || { echo "pack6: $base is not in the lock with this hash" >&2; exit 1; }
  n=$((n + 1))
done
[ "$n" = "$(echo $want | wc -w)" ] || { echo "pack6: $n wheels, want $(echo $want | wc -w)" >&2; exit 1; }
if [ ! -f "$out/site.tar.xz" ]; then
  rm -rf "$out/site"
  python3 -m pip install -q --no-deps --no-compile --no-index --target "$out/site" --python-version 3.12 \
    --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --only-binary=:all: "$wheels_in"/*.whl
  rm -f "$out/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$out/site/xgrammar/lib/libxgrammar.a"
  for so in _C _moe_C _C_stable_libtorch _flashmla_C vllm_flash_attn/_vllm_fa3_C; do
    python3 tools/gpu/strip_fatbin.py "$out/site/vllm/$so.abi3.so" "$out/site/vllm/$so.abi3.so" 90
  done
  tar -C "$out/site" -cf - . | xz -T2 -6 > "$out/site.tar.xz"
  rm -rf "$out/site"
fi
rm -rf "$out/payload" "$out"/c[0-9] && mkdir -p "$out/payload"/{hf,hf-main}
cp "$out/site.tar.xz" "$out/payload/"
cp .cache/fixtures/tiny-glm5-topk32/gguf/tiny-glm5-UD-Q4_K_XL.gguf "$out/payload/"
find .cache/fixtures/tiny-glm5-topk32/hf -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$out/payload/hf/" \;
find .cache/fixtures/tiny-glm5/hf -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$out/payload/hf-main/" \;
(cd "$out/payload" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
# the main fixture's GGUF, made there from the topk32 one: its sha256 to check
sha256sum .cache/fixtures/tiny-glm5/gguf/tiny-glm5-UD-Q4_K_XL.gguf | sed 's|  .*|  main.gguf|' >> "$out/payload/SHA256SUMS"
tar -C "$out/payload" -cf "$out/payload.tar" .
sha256sum "$out/payload.tar" | sed "s|$out/||" > "$out/payload.sha256"
(cd "$out" && split -n 5 -a 1 -d payload.tar payload.part.)
for i in 0 1 2 3 4; do mkdir -p "$out/c$i" && mv "$out/payload.part.$i" "$out/c$i/"; done
cp "$out/payload.sha256" "$out/c0/"
# the 0011 before issue 23 (run 5's set; serve6.sh's variant "old")
git show 8ca8552:files/patches/vllm-0.20.2/0011-glm-dsa-sparse-mla-triton.patch > "$out/c0/old-0011.patch"
rm -rf "$out/payload" "$out/payload.tar"
du -sm "$out"/c* | sed 's/^/pack6: /'
echo "pack6: payload $(cut -d' ' -f1 "$out/payload.sha256")"
