#!/bin/bash
# End-to-end on the GPU machine: patched vLLM 0.20.2 serves the tiny GLM-5 from its GGUF
# (UD-Q4_K_XL, 2 shards) and from its bf16 safetensors; prompt log-probs + greedy outputs.
# Pieces and wheels were carried by earlier calls into /root/stash (see e2e_serving.md).
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
REPO=$PWD; E=$REPO/docs/validation/e2e-gpu
mkdir -p /root/stash && for c in c6 c7; do [ -d .build/e2e/$c ] && cp -a .build/e2e/$c/. /root/stash/; done; cd /root/stash || exit 1
W=vllm-0.20.2-cp38-abi3-manylinux_2_35_x86_64.whl
cat vllm.part.aa vllm.part.ab vllm.part.ac vllm.part.ad > $W
echo "$(cut -d' ' -f1 vllm.sha256)  $W" | sha256sum -c || exit 1
rm -rf /root/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site $W extra/*.whl w/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -5
el "installed"
for p in $REPO/files/patches/vllm-0.20.2/*.patch; do echo "== $(basename $p)"; patch -p1 -d /root/site < $p || echo "PATCH FAILED: $(basename $p)"; done
export PYTHONPATH=/root/site
if [ "${E2E_SPECULATORS_WORKAROUND:-0}" = 1 ]; then
# run-only workaround, NOT in the patch set: skip vLLM's speculators probe for GGUF files
# (it asks transformers to parse the GGUF, which does not know glm-dsa)
python3 - <<'PY'
p = "/root/site/vllm/transformers_utils/config.py"
s = open(p).read()
old = "    if check_gguf_file(model):\n        kwargs[\"gguf_file\"] = Path(model).name\n"
assert s.count(old) == 1, "anchor"
s = s.replace(old, "    if check_gguf_file(model):\n        return model, tokenizer, vllm_speculative_config  # E2E WORKAROUND\n", 1)
open(p, "w").write(s)
print("speculators-probe workaround applied")
PY
fi
mkdir -p /root/gguf && cp gguf/*.gguf /root/gguf/ 2>/dev/null
cat /root/hf_gen.log; cp /root/hfgen/*.safetensors /root/hf/ 2>/dev/null
sha256sum /root/gguf/*.gguf /root/hf/*.safetensors /root/hf/model.safetensors.index.json
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
python3 -c "import vllm, torch, triton; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__)"
COMMON="--tokenizer /root/hf --hf-config-path /root/hf --attention-backend TRITON_MLA --tensor-parallel-size 1 --max-model-len 2048 --served-model-name glm-5 --enforce-eager --max-logprobs 2048 --host 127.0.0.1"
health() { for i in $(seq 1 $2); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null && return 0; kill -0 $3 2>/dev/null || return 1; sleep 2; done; return 1; }
el "start gguf server"
setsid python3 -m vllm.entrypoints.openai.api_server --model /root/gguf/tiny-glm5-UD-Q4_K_XL-00001-of-00002.gguf $COMMON --gpu-memory-utilization 0.5 --port 8000 > $OUT/server_gguf.log 2>&1 < /dev/null &
P1=$!
if health 8000 120 $P1; then el "gguf server healthy"; G=1; else el "gguf server NOT healthy"; G=0; fi
[ "${E2E_ST:-1}" = 1 ] && { el "start safetensors server"
setsid python3 -m vllm.entrypoints.openai.api_server --model /root/hf $COMMON --dtype bfloat16 --gpu-memory-utilization 0.4 --port 8001 > $OUT/server_st.log 2>&1 < /dev/null &
P2=$!; }
[ $G = 1 ] && python3 $E/query.py 8000 $OUT/gguf $E/prompts.json 2048 && el "gguf queried"
nvidia-smi --query-gpu=memory.used --format=csv
kill -TERM -$P1 2>/dev/null; sleep 3; kill -KILL -$P1 2>/dev/null
[ "${E2E_ST:-1}" = 1 ] && if health 8001 $(( (520 - ($(date +%s) - T0)) / 2 )) $P2; then el "st server healthy"; python3 $E/query.py 8001 $OUT/st $E/prompts.json 2048 && el "st queried"; else el "st server NOT healthy"; fi
kill -TERM -$P2 2>/dev/null; sleep 3; kill -KILL -$P2 2>/dev/null
grep -n -i -E "error|Traceback|exception" $OUT/server_gguf.log | head -20
el "done"
