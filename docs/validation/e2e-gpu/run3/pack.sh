#!/bin/bash
# Run 3, here (the development machine): builds what the GPU validation machine needs and
# cuts it into the pieces the device calls carry (each call carries at most 64 MiB).
#   payload/wheels   vLLM 0.20.2 (the lock's wheel, its sha256 checked against the lock)
#                    and the lock's packages that machine lacks, at the lock's versions and
#                    hashes: the serving stack and transformers 4.57.6 / tokenizers 0.22.2 /
#                    huggingface-hub 0.36.2 (that machine has transformers 5.x)
#   payload/ans      ansible-core 2.19.14 + resolvelib (tools lock): playbooks/diagnose.yml
#                    runs there with ansible.builtin modules only
#   payload/gguf     the fixture's UD-Q4_K_XL GGUF, 2 split shards (docs/fixtures.md)
#   payload/llama.cpp llama.cpp's converter (convert_hf_to_gguf.py, conversion/, gguf-py/)
#                    from the llama-cpp-python 0.3.36 sdist: makes the BF16 GGUF there from
#                    the regenerated safetensors (its sha256 is checked against the fixture's)
# Not carried (a lock package the serving path does not import; left out for the 64 MiB
# calls): flashinfer-cubin/-python, tilelang, z3-solver, cuda-tile, quack-kernels,
# fastsafetensors. The bf16 safetensors are regenerated there (gen_weights.py, seeded).
# usage: docs/validation/e2e-gpu/run3/pack.sh WHEEL_DIR   (WHEEL_DIR: pip download of the lock)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
cd "$repo"
wheels_in=$1
lock=roles/ml_env/files/locks/requirements-py3.12.txt
fixture=.cache/fixtures/tiny-glm5
sdist=$(ls -d .cache/fixtures/llama-cpp-python-0.3.36/src/llama_cpp_python-0.3.36 2>/dev/null || true)
out=.build/e2e3
rm -rf "$out" && mkdir -p "$out/payload"/{wheels,ans,gguf}
skip='^(flashinfer-cubin|flashinfer-python|tilelang|z3-solver|cuda-tile|quack-kernels|fastsafetensors)$'

# The lock's hashes of one package (name==version line and its --hash lines).
lock_hashes() { awk -v p="$1 " 'index($0,p)==1{f=1;next} f&&/--hash=sha256:/{sub(/.*sha256:/,"");sub(/ .*/,"");print;next} f&&!/^ /{f=0}' "$lock"; }
for whl in "$wheels_in"/*.whl; do
  base=$(basename "$whl")
  name=$(echo "${base%%-[0-9]*}" | tr '_A-Z' '-a-z')
  [[ $name =~ $skip ]] && continue
  sum=$(sha256sum "$whl" | cut -d' ' -f1)
  version=$(echo "$base" | cut -d- -f2)
  lock_hashes "$name==$version" | grep -x "$sum" >/dev/null \
    || { echo "pack: $base is not in the lock with this hash" >&2; exit 1; }
  cp "$whl" "$out/payload/wheels/"
done
ls "$out"/payload/wheels/vllm-0.20.2-*.whl >/dev/null
cp "$wheels_in"/ans/*.whl "$out/payload/ans/"
cp "$fixture"/gguf/split/tiny-glm5-UD-Q4_K_XL-0000[12]-of-00002.gguf "$out/payload/gguf/"
lc=$sdist/vendor/llama.cpp
mkdir -p "$out/payload/llama.cpp"
cp -a "$lc/convert_hf_to_gguf.py" "$lc/conversion" "$lc/gguf-py" "$out/payload/llama.cpp/"
(cd "$out/payload" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
tar -C "$out/payload" -cf "$out/payload.tar" .
sha256sum "$out/payload.tar" | sed "s|$out/||" > "$out/payload.sha256"
(cd "$out" && split -b 60M -a 2 payload.tar payload.part.)
n=0
for part in "$out"/payload.part.*; do
  mkdir -p "$out/c$n" && mv "$part" "$out/c$n/"
  n=$((n + 1))
done
cp "$out/payload.sha256" "$out/c0/"
mkdir -p "$out/c0/hf" && find "$fixture/hf" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$out/c0/hf/" \;
rm -rf "$out/payload" "$out/payload.tar"
du -sm "$out"/c* | sed 's/^/pack: /'
echo "pack: $n pieces; payload $(cut -d' ' -f1 "$out/payload.sha256")"
