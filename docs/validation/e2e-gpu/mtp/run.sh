#!/bin/bash
# Issue 23 items 4/6 (PREPARED, NOT RUN YET): MTP speculative decoding served on the GPU
# validation machine. usage (repository root, on that machine): docs/validation/e2e-gpu/mtp/run.sh
# Payload: run 5's (docs/validation/e2e-gpu/run5/pack.sh packs the lock's wheels and the
# small-top-k fixture, carry.sh moves one piece per device call into /root/stash).
# Installs the stack into /root/site, applies the whole patch set (0001-0012) with
# patch(1) as role vllm_patches does, then runs the servers of servers.yml ONE AFTER
# ANOTHER (decode timings on an otherwise idle GPU), each with the command line role
# vllm_service renders (cmdline-*.sh; render_cmdlines.yml -e @.../mtp/servers.yml):
# greedy completions of the held prompts, single-stream decode time, and vLLM's
# spec-decode counters from /metrics (query_mtp.py). compare_mtp.py then reports greedy
# equality with/without MTP and the acceptance per draft position. Everything comes back
# as $OUT/mtp.tar.gz.
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
REPO=$PWD; R=$REPO/docs/validation/e2e-gpu/mtp; L=/root/mtp
rm -rf $L; mkdir -p $L
cat /root/stash/payload.part.* > /root/payload.tar
echo "$(cut -d' ' -f1 /root/stash/payload.sha256)  /root/payload.tar" | sha256sum -c || exit 1
rm -rf /root/p && mkdir /root/p && tar -xf /root/payload.tar -C /root/p && (cd /root/p && sha256sum -c --quiet SHA256SUMS) || exit 1
rm -rf /root/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site \
  /root/p/wheels/*.whl $(ls /root/stash/extra/*.whl 2>/dev/null) 2>&1 | grep -v "WARNING: Target directory" | tail -5
el "installed"
for p in "$REPO"/files/patches/vllm-0.20.2/*.patch; do
  patch -p1 -s -d /root/site < "$p" && echo "applied $(basename "$p")" || { echo "PATCH FAILED: $(basename "$p")"; exit 1; }
done
PY3=$(command -v python3)
mkdir -p /root/ml-env/bin
printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$PY3" > /root/ml-env/bin/python
printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$PY3" > /root/ml-env/bin/vllm
chmod 0755 /root/ml-env/bin/python /root/ml-env/bin/vllm
/root/ml-env/bin/python -c "import vllm, torch, triton; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" | tee $L/versions.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a $L/versions.txt
mkdir -p /root/model /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
cp /root/p/gguf/*.gguf /root/model/; rm -rf /root/hf; cp -a /root/p/hf /root/hf
python3 -c "import secrets; print(secrets.token_hex(16))" > /root/apikey; chmod 0600 /root/apikey
export VLLM_API_KEY=$(cat /root/apikey)
health() { python3 -c "import sys,urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=3).status)
except Exception: print(0)" "$1"; }
while read -r s port; do
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $s "* ]] && continue
  setsid bash "$R/cmdline-$s.sh" > "$L/server-$s.log" 2>&1 < /dev/null &
  pid=$!; t=$(date +%s); up=0
  while [ $(( $(date +%s) - t )) -lt ${WAIT_S:-300} ]; do
    [ "$(health "http://127.0.0.1:$port/health")" = 200 ] && { up=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 3
  done
  if [ $up = 1 ]; then
    el "$s healthy"
    python3 "$R/query_mtp.py" "$port" "$L/$s.json" "$REPO/docs/validation/e2e-gpu/run5/prompts.json" > "$L/query-$s.txt" 2>&1
    el "$s queried: $(tail -1 "$L/query-$s.txt" | cut -c1-200)"
  else
    el "$s NOT healthy"
  fi
  grep -nE "Traceback|Error|error:" "$L/server-$s.log" | grep -v VLLM_API_KEY | head -6 | sed "s/^/$s: /" | cut -c1-400
  kill -TERM -$pid 2>/dev/null; sleep 3; kill -KILL -$pid 2>/dev/null
  tail -60 "$L/server-$s.log" > "$L/tail-$s.log"
done < "$R/ports"
python3 "$R/compare_mtp.py" "$L" | tee "$L/summary.txt"
tar -czf $OUT/mtp.tar.gz -C /root --exclude='server-*.log' mtp; (cd /root && tar -czf $OUT/mtp-logs.tar.gz mtp/server-*.log)
el "done"
