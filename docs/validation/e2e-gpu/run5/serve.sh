#!/bin/bash
# Run 5 (issue 13), serving call on the GPU validation machine. usage: serve.sh [b|c|d]
# (b, c: the servers of b/ and c/servers.yml on the main fixture; d: the sparse server
# with d/fault-off-by-one.patch on top of the set). Joins and checks the
# carried pieces, installs the lock's vLLM 0.20.2 stack into /root/site, applies the
# project's patch set (0001-0011) with patch(1) as the role does, and starts the five
# servers of servers.yml at once, each with the command line role vllm_service renders
# (cmdline-*.sh, render_cmdlines.yml). Queries each healthy one (query5.py), records
# each log's backend lines and errors, and returns everything as $OUT/run5.tar.gz.
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
SET=${1:-}
REPO=$PWD; R=$REPO/docs/validation/e2e-gpu/run5${SET:+/$SET}; L=/root/run5$SET; VOCAB=${VOCAB:-2048}
rm -rf $L; mkdir -p $L
cat /root/stash/payload.part.* > /root/payload.tar
echo "$(cut -d' ' -f1 /root/stash/payload.sha256)  /root/payload.tar" | sha256sum -c || exit 1
rm -rf /root/p && mkdir /root/p && tar -xf /root/payload.tar -C /root/p && (cd /root/p && sha256sum -c --quiet SHA256SUMS) || exit 1
el "payload verified"
rm -rf /root/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site \
  /root/p/wheels/*.whl $(ls /root/stash/extra/*.whl 2>/dev/null) 2>&1 | grep -v "WARNING: Target directory" | tail -5
el "installed"
for p in "$REPO"/files/patches/vllm-0.20.2/*.patch; do
  patch -p1 -s -d /root/site < "$p" && echo "applied $(basename "$p")" || { echo "PATCH FAILED: $(basename "$p")"; exit 1; }
done
for f in "$R"/fault-*.patch; do
  # run 5d: a fault on top of the set (a test double of a wrong selection)
  [ -f "$f" ] && { patch -p1 -s -d /root/site < "$f" && echo "applied FAULT $(basename "$f")" || exit 1; }
done
PY3=$(command -v python3)
mkdir -p /root/ml-env/bin
printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$PY3" > /root/ml-env/bin/python
printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$PY3" > /root/ml-env/bin/vllm
chmod 0755 /root/ml-env/bin/python /root/ml-env/bin/vllm
/root/ml-env/bin/python -c "import vllm, torch, triton, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee $L/versions.txt
mkdir -p /root/model /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
cp /root/p/gguf/*.gguf /root/model/; rm -rf /root/hf; cp -a /root/p/hf /root/hf
if [ -d /root/stash/main ]; then
  # the main fixture (carried apart: c9-c11), its second shard in two pieces
  mkdir -p /root/model/main; rm -rf /root/hf-main; cp -a /root/stash/main/hf /root/hf-main
  cp /root/stash/main/*-00001-of-00002.gguf /root/model/main/
  cat /root/stash/main/shard2.part.* > /root/model/main/tiny-glm5-UD-Q4_K_XL-00002-of-00002.gguf
fi
sha256sum /root/model/*.gguf /root/model/main/*.gguf 2>/dev/null | tee $L/sha256.txt
python3 -c "import secrets; print(secrets.token_hex(16))" > /root/apikey; chmod 0600 /root/apikey
export VLLM_API_KEY=$(cat /root/apikey)
health() { python3 -c "import sys,urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=3).status)
except Exception: print(0)" "$1"; }
declare -A PORT
while read -r name port; do PORT[$name]=$port; done < "$R/ports"
for s in "${!PORT[@]}"; do
  setsid bash "$R/cmdline-$s.sh" > "$L/server-$s.log" 2>&1 < /dev/null &
  echo $! > "$L/pid-$s"
done
el "${#PORT[@]} servers started"
declare -A UP
# servers are queried one after another when SERIAL is set (timings), else at once
while :; do
  pending=0
  for s in "${!PORT[@]}"; do
    [ -n "${UP[$s]}" ] && continue
    if [ "$(health "http://127.0.0.1:${PORT[$s]}/health")" = 200 ]; then UP[$s]=1; el "$s healthy"
    elif ! kill -0 "$(cat $L/pid-$s)" 2>/dev/null; then UP[$s]=0; el "$s DIED"
    else pending=1; fi
  done
  [ $pending = 0 ] && break
  [ $(( $(date +%s) - T0 )) -gt ${WAIT_S:-330} ] && { el "timeout waiting for servers"; break; }
  sleep 3
done
QP=()
for s in "${!PORT[@]}"; do
  if [ "${UP[$s]}" = 1 ] && [ -n "${SERIAL:-}" ]; then
    python3 "$REPO/docs/validation/e2e-gpu/run5/${QUERY:-query5.py}" "${PORT[$s]}" "$L/$s" "$R/prompts.json" "$VOCAB" > "$L/query-$s.txt" 2>&1
  elif [ "${UP[$s]}" = 1 ]; then
    python3 "$REPO/docs/validation/e2e-gpu/run5/${QUERY:-query5.py}" "${PORT[$s]}" "$L/$s" "$R/prompts.json" "$VOCAB" "${LOGPROBS:-$VOCAB}" > "$L/query-$s.txt" 2>&1 &
    QP+=($!)
  fi
done
[ ${#QP[@]} -gt 0 ] && wait "${QP[@]}"
el "queried"
for s in "${!PORT[@]}"; do
  [ -f "$L/query-$s.txt" ] && sed "s/^/$s: /" "$L/query-$s.txt" | cut -c1-220
  echo "$s: $(grep -oE 'Using [A-Za-z_.]+ (attention )?backend[^.]*|TRITON_MLA_SPARSE|CUDA graph[^,]*' "$L/server-$s.log" | sort | uniq -c | tr '\n' ';' | cut -c1-400)"
  grep -nE "Traceback|Error|error:" "$L/server-$s.log" | grep -v "VLLM_API_KEY" | head -4 | sed "s/^/$s: /" | cut -c1-400
done
for s in "${!PORT[@]}"; do kill -TERM -"$(cat $L/pid-$s)" 2>/dev/null; done
sleep 2
for s in "${!PORT[@]}"; do tail -40 "$L/server-$s.log" > "$L/tail-$s.log"; done
tar -czf $OUT/run5$SET.tar.gz -C /root --exclude='*.log' run5$SET; (cd /root && tar -czf $OUT/logs$SET.tar.gz run5$SET/*.log)
el "done"
