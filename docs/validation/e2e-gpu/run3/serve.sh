#!/bin/bash
# Run 3, serving call: joins the ten carried pieces, checks them, installs the pinned
# vLLM 0.20.2 with the lock's transformers 4.57.6 stack into /root/site, applies the
# project's patch set (0001-0005), and starts four servers at once, each with the
# command line role vllm_service renders (cmdline-*.sh, from render_cmdlines.yml):
#   q4          the UD-Q4_K_XL GGUF (2 split shards), dtype as the unit leaves it (auto)
#   q4-fp16     the same with --dtype float16 (what vLLM's GGUF path allows on SM >= 10.0)
#   bf16-gguf   the BF16 GGUF (the same bf16 weights as the safetensors), bf16
#   safetensors the bf16 safetensors, bf16
# Queries each (query.py), checks the API key, /metrics, the backend line of each log
# (the role's regex), runs stage 5 of the funnel against q4, stops all but q4 (left
# for diagnose.sh) and returns the logs and results as $OUT/run3.tar.gz.
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
RUN=${RUN:-run3}
REPO=$PWD; E=$REPO/docs/validation/e2e-gpu; R=$E/run3; L=/root/$RUN
rm -rf $L; mkdir -p $L
cat /root/stash/payload.part.* > /root/payload.tar
echo "$(cut -d' ' -f1 /root/stash/payload.sha256)  /root/payload.tar" | sha256sum -c || exit 1
rm -rf /root/p && mkdir /root/p && tar -xf /root/payload.tar -C /root/p && (cd /root/p && sha256sum -c --quiet SHA256SUMS) || exit 1
el "payload verified"
rm -rf /root/site /root/ans
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site \
  /root/p/wheels/*.whl 2>&1 | grep -v "WARNING: Target directory" | tail -5
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/ans /root/p/ans/*.whl 2>&1 | grep -v "WARNING: Target directory" | tail -3
el "installed"
for p in "$REPO"/files/patches/vllm-0.20.2/*.patch; do
  patch -p1 -s -d /root/site < "$p" && echo "applied $(basename "$p")" || { echo "PATCH FAILED: $(basename "$p")"; exit 1; }
done
# The machine's python3 (its own venv with torch), by absolute path: the unit's PATH
# (cmdline-*.sh) does not include that venv.
PY3=$(command -v python3)
mkdir -p /root/ml-env/bin
printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$PY3" > /root/ml-env/bin/python
printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$PY3" > /root/ml-env/bin/vllm
chmod 0755 /root/ml-env/bin/python /root/ml-env/bin/vllm
/root/ml-env/bin/python -c "import vllm, torch, triton, transformers, huggingface_hub, tokenizers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'huggingface_hub', huggingface_hub.__version__, 'tokenizers', tokenizers.__version__)" | tee $L/versions.txt
grep -q "transformers 4.57.6" $L/versions.txt || { echo "not the lock's transformers"; exit 1; }
mkdir -p /root/model/gguf /root/bf16 /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
cp /root/p/gguf/*.gguf /root/model/gguf/; ln -sfn /root/hf /root/model/base
for i in $(seq 1 60); do grep -q "^done" /root/hf_gen.log && break; sleep 2; done
cp /root/hfgen/*.safetensors /root/hf/
# The BF16 GGUF: llama.cpp's own converter (carried) on the regenerated safetensors, with
# the lock's transformers; its sha256 must equal the fixture's (pack.sh's record).
PYTHONPATH=/root/p/llama.cpp/gguf-py:/root/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  python3 "$REPO/src/glm5_tools/fixtures/_convert_entry.py" /root/p/llama.cpp /root/hf --outtype bf16 \
  --outfile /root/bf16/tiny-glm5-BF16.gguf --model-name tiny-glm5 > $L/convert-bf16.log 2>&1 \
  && el "bf16 GGUF converted" || el "BF16 CONVERSION FAILED (see convert-bf16.log)"
sha256sum /root/model/gguf/*.gguf /root/bf16/*.gguf /root/hf/*.safetensors | tee $L/sha256.txt
python3 -c "import secrets; print(secrets.token_hex(16))" > /root/apikey; chmod 0600 /root/apikey
export VLLM_API_KEY=$(cat /root/apikey)
# HTTP status of a GET (curl is not on that machine's image): code URL [bearer-key] [save-to]
code() { python3 - "$@" <<'PY'
import sys, urllib.error, urllib.request
req = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2]:
    req.add_header("Authorization", "Bearer " + sys.argv[2])
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        body, status = r.read(), r.status
except urllib.error.HTTPError as e:
    body, status = e.read(), e.code
except OSError:
    body, status = b"", 0
if len(sys.argv) > 3:
    open(sys.argv[3], "wb").write(body)
print(status)
PY
}
declare -A PORT=([q4]=8000 [safetensors]=8001 [bf16-gguf]=8002 [q4-fp16]=8003)
for s in "${!PORT[@]}"; do
  setsid bash "$R/cmdline-$s.sh" > "$L/server-$s.log" 2>&1 < /dev/null &
  echo $! > "$L/pid-$s"
done
el "four servers started"
declare -A UP
while :; do
  pending=0
  for s in "${!PORT[@]}"; do
    [ -n "${UP[$s]}" ] && continue
    if [ "$(code "http://127.0.0.1:${PORT[$s]}/health")" = 200 ]; then UP[$s]=1; el "$s healthy"
    elif ! kill -0 "$(cat $L/pid-$s)" 2>/dev/null; then UP[$s]=0; el "$s DIED"
    else pending=1; fi
  done
  [ $pending = 0 ] && break
  [ $(( $(date +%s) - T0 )) -gt 360 ] && { el "timeout waiting for servers"; break; }
  sleep 3
done
QP=()
for s in "${!PORT[@]}"; do
  if [ "${UP[$s]}" = 1 ]; then
    python3 "$E/query.py" "${PORT[$s]}" "$L/$s" "$E/prompts.json" 2048 > "$L/query-$s.txt" 2>&1 &
    QP+=($!)
  fi
done
wait "${QP[@]}"
for s in "${!PORT[@]}"; do [ -f "$L/query-$s.txt" ] && sed "s/^/$s: /" "$L/query-$s.txt" | cut -c1-300; done
el "queried"
echo "--- API key on q4: /v1/models without key, with key; /metrics without key"
echo "no key: HTTP $(code http://127.0.0.1:8000/v1/models)"
echo "key:    HTTP $(code http://127.0.0.1:8000/v1/models "$VLLM_API_KEY" $L/models.json) $(cat $L/models.json)"
echo "metrics: HTTP $(code http://127.0.0.1:8000/metrics "" $L/metrics-q4.txt), $(grep -c '^vllm:' $L/metrics-q4.txt) vllm: samples"
echo "--- backend lines (role vllm_service's regex TRITON_MLA|TritonMLA) and dtype per server"
for s in "${!PORT[@]}"; do
  echo "$s: regex $(grep -cE 'TRITON_MLA|TritonMLA' "$L/server-$s.log") lines; $(grep -oE 'Using [A-Za-z_.]+ backend|Using [A-Za-z ]+ prefill for MLA|dtype=torch\.[a-z0-9]+' "$L/server-$s.log" | sort | uniq -c | tr '\n' ';')"
done
echo "--- stage 5 (probe) of the funnel against q4"
PYTHONPATH=$REPO/src timeout 120 /root/ml-env/bin/python -m glm5_tools.diagnostics --gguf /root/model/gguf --hf-config /root/hf \
  --tp 1 --stages 5 --server-url http://127.0.0.1:8000 --model glm-5 --json $L/stage5.json 2>&1 | grep -vE "^(INFO|WARNING|DEBUG)" | tail -25
for s in safetensors bf16-gguf q4-fp16; do kill -TERM -"$(cat $L/pid-$s)" 2>/dev/null; done
sleep 3
for s in safetensors bf16-gguf q4-fp16; do kill -KILL -"$(cat $L/pid-$s)" 2>/dev/null; done
for s in "${!PORT[@]}"; do grep -nE "Traceback|Error" "$L/server-$s.log" | head -5 | sed "s/^/$s: /"; done
tar -czf $OUT/$RUN.tar.gz -C /root $RUN
el "done (q4 server left running for diagnose.sh)"
