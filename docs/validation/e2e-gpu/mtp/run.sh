#!/bin/bash
# Issue 23 items 4/6: MTP speculative decoding served on the GPU validation machine (run 7).
# usage (repository root, on that machine): docs/validation/e2e-gpu/mtp/run.sh "SERVER ..." [compare]
#   e.g. run.sh "sparse sparse-mtp1 sparse-mtp3"   then, on the same warm machine,
#        run.sh "sparse-graphs sparse-mtp3-graphs dense-mtp3" compare
# Payload: run 6's (docs/validation/e2e-gpu/run6/pack6.sh packs the lock's wheels as one
# pip --target tree and the topk32 fixture in 5 pieces; run6/carry6.sh N moves piece N into
# /root/stash, one device call each; the last piece travels with the first call of this
# script as LAST=.build/e6/c4).
# The first call installs the stack into /root/site and applies the whole patch set
# (files/patches/vllm-0.20.2/*, 0001-0012) with patch(1) as role vllm_patches does.
# The named servers (servers.yml, each with the command line role vllm_service renders:
# cmdline-*.sh, re-rendered by render_cmdlines.yml -e @.../mtp/servers.yml) START TOGETHER
# (one wave; startup is CPU work) and are then QUERIED ONE AFTER ANOTHER (query_mtp.py:
# greedy completions, single-stream decode time, spec-decode counters), so that each
# decode timing has the GPU to itself. "compare" then runs compare_mtp.py over all results
# so far: greedy equality with/without MTP (first divergence and the top-2 margin there),
# acceptance per draft position, tokens/s side by side.
# CROSS_REF=NAME (a server of the wave): after the queries, crosscheck_mtp.py feeds every
# other server's greedy output back to NAME (teacher-forced) and reports the deficits.
# FAULT=1: also a copy of the tree with a verification-step fault (below), served as
# sparse-mtp3-graphs-fault, to show that the cross-check fails on it.
# Run 9 (the constructed chain fixture, docs/fixtures.md "The MTP chain fixture"):
# SERVERS=chain takes the servers of chain/ (cmdline-*.sh, ports) instead of this folder's;
# CHAIN=1 makes /root/model/tiny-glm5-mtp-chain.gguf from the fixture's GGUF with
# glm5_tools.fixtures.mtp_chain (numpy + gguf-py; its sha256 into chain.txt) and compare
# checks the outputs against the chain; NC=1 makes the tree of server
# chain-mtp3-graphs-nc: the patch set plus devtests/ml/diagnostics/faults/
# mtp-shared-head-norm-not-carried.patch (the raw hidden state carried between draft steps).
# Everything comes back under $OUT (results as mtp.tar.gz, server logs apart).
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
REPO=$PWD; M=$REPO/docs/validation/e2e-gpu/mtp; R=$M${SERVERS:+/$SERVERS}; L=/root/mtp
WAVE=$1; LAST=${LAST:-.build/e6/c4}
mkdir -p $L
if [ ! -f /root/setup7.done ]; then
  [ -d "$LAST" ] && cp -a "$LAST"/. /root/stash/
  cat /root/stash/payload.part.* > /root/payload.tar
  echo "$(cut -d' ' -f1 /root/stash/payload.sha256)  /root/payload.tar" | sha256sum -c || exit 1
  rm -rf /root/p && mkdir /root/p && tar -xf /root/payload.tar -C /root/p && rm /root/payload.tar
  (cd /root/p && grep -v ' main.gguf$' SHA256SUMS | sha256sum -c --quiet) || exit 1
  rm -rf /root/site && mkdir /root/site && xz -T0 -dc /root/p/site.tar.xz | tar -xf - -C /root/site
  el "payload verified and unpacked"
  for p in "$REPO"/files/patches/vllm-0.20.2/*.patch; do
    patch -p1 -s -d /root/site < "$p" && echo "applied $(basename "$p")" || { echo "PATCH FAILED: $(basename "$p")"; exit 1; }
  done
  PY3=$(command -v python3)
  mkdir -p /root/ml-env/bin
  printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$PY3" > /root/ml-env/bin/python
  printf '#!/bin/sh\nexport PYTHONPATH=/root/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$PY3" > /root/ml-env/bin/vllm
  chmod 0755 /root/ml-env/bin/python /root/ml-env/bin/vllm
  /root/ml-env/bin/python -c "import vllm, torch, triton; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" | tee $L/versions.txt
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee -a $L/versions.txt
  mkdir -p /root/model /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
  cp /root/p/tiny-glm5-UD-Q4_K_XL.gguf /root/model/; rm -rf /root/hf; cp -a /root/p/hf /root/hf
  python3 -c "import secrets; print(secrets.token_hex(16))" > /root/apikey; chmod 0600 /root/apikey
  touch /root/setup7.done
  el "setup done"
fi
if [ -n "${CHAIN:-}" ] && [ ! -f /root/model/tiny-glm5-mtp-chain.gguf ]; then
  PYTHONPATH=$REPO/src:/root/site python3 -m glm5_tools.fixtures.mtp_chain /root/model/tiny-glm5-UD-Q4_K_XL.gguf \
    /root/model/tiny-glm5-mtp-chain.gguf > $L/chain.txt 2>&1 || { cat $L/chain.txt; exit 1; }
  want=$(cut -d' ' -f1 "$M/chain/chain.sha256")
  [ "$(head -c 64 $L/chain.txt)" = "$want" ] && el "chain fixture made: sha256 $want, as on the CPU" \
    || el "chain fixture made: sha256 $(head -c 64 $L/chain.txt) DIFFERS from the CPU's $want"
fi
if [ -n "${NC:-}" ] && [ ! -d /root/site-nc ]; then
  cp -a /root/site /root/site-nc
  patch -p1 -s -d /root/site-nc < "$REPO/devtests/ml/diagnostics/faults/mtp-shared-head-norm-not-carried.patch" \
    || { echo "NC fault patch failed"; exit 1; }
  mkdir -p /root/ml-env-nc/bin
  sed 's|/root/site|/root/site-nc|' /root/ml-env/bin/python > /root/ml-env-nc/bin/python
  sed 's|/root/site|/root/site-nc|' /root/ml-env/bin/vllm > /root/ml-env-nc/bin/vllm
  chmod 0755 /root/ml-env-nc/bin/*
  el "norm-not-carried fault tree made"
fi
if [ -n "${FAULT:-}" ] && [ ! -d /root/site-fault ]; then
  # The fault a verification step could have: each token of a decode request of up to
  # 4 query tokens (1 + 3 drafts) gets the request's whole context, so it sees the draft
  # tokens after it. Prefill and one-token decode stay right (for them it is the same
  # value). Injected into a copy of the patched tree; the cross-check must flag it.
  cp -a /root/site /root/site-fault
  python3 - /root/site-fault/vllm/v1/attention/backends/mla/sparse_utils.py <<'PY'
import sys
from pathlib import Path
f = Path(sys.argv[1]); s = f.read_text()
line = "    ctx = seq_lens[:num_reqs].to(torch.int32)[req] - ends[req] + tok + 1\n"
assert s.count(line) == 1, "fault: the context line of token_request_and_context is not there once"
fault = ("    ctx = torch.where((ends[req] - query_start_loc[:num_reqs].to(torch.int32)[req]) <= 4, "
         "seq_lens[:num_reqs].to(torch.int32)[req], ctx)  # FAULT (run 8)\n")
f.write_text(s.replace(line, line + fault))
print("fault injected into", f)
PY
  mkdir -p /root/ml-env-fault/bin
  sed 's|/root/site|/root/site-fault|' /root/ml-env/bin/python > /root/ml-env-fault/bin/python
  sed 's|/root/site|/root/site-fault|' /root/ml-env/bin/vllm > /root/ml-env-fault/bin/vllm
  chmod 0755 /root/ml-env-fault/bin/*
  if [ -z "${SERVERS:-}" ]; then  # run 8's server; run 9's is rendered (chain/servers.yml)
    sed -e 's|/root/ml-env/|/root/ml-env-fault/|g' -e 's|--port 8004|--port 8006|' \
      "$R/cmdline-sparse-mtp3-graphs.sh" > "$R/cmdline-sparse-mtp3-graphs-fault.sh"
    grep -q -- '--port 8006' "$R/cmdline-sparse-mtp3-graphs-fault.sh" || { echo "fault cmdline not made"; exit 1; }
  fi
fi
export VLLM_API_KEY=$(cat /root/apikey)
health() { python3 -c "import sys,urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=3).status)
except Exception: print(0)" "$1"; }
port_of() { awk -v s="$1" '$1==s{print $2}' "$R/ports"; }
declare -A pid
for s in $WAVE; do
  setsid bash "$R/cmdline-$s.sh" > "$L/server-$s.log" 2>&1 < /dev/null &
  pid[$s]=$!
done
t=$(date +%s)
for s in $WAVE; do
  port=$(port_of "$s"); up=0
  while [ $(( $(date +%s) - t )) -lt ${WAIT_S:-300} ]; do
    [ "$(health "http://127.0.0.1:$port/health")" = 200 ] && { up=1; break; }
    kill -0 "${pid[$s]}" 2>/dev/null || break
    sleep 2
  done
  [ $up = 1 ] && el "$s healthy" || el "$s NOT healthy"
done
for s in $WAVE; do
  port=$(port_of "$s")
  if [ "$(health "http://127.0.0.1:$port/health")" = 200 ]; then
    python3 "$M/query_mtp.py" "$port" "$L/$s.json" "$REPO/docs/validation/e2e-gpu/run5/prompts.json" > "$L/query-$s.txt" 2>&1
    el "$s queried: $(tail -1 "$L/query-$s.txt" | cut -c1-300)"
  fi
  grep -nE "Traceback|Error|error:" "$L/server-$s.log" | grep -v VLLM_API_KEY | head -6 | sed "s/^/$s: /" | cut -c1-400
done
if [ -n "${CROSS_REF:-}" ]; then
  subjects=$(for s in $WAVE; do [ "$s" != "$CROSS_REF" ] && echo "$s"; done)
  PROMPTS=$REPO/docs/validation/e2e-gpu/run5/prompts.json python3 "$M/crosscheck_mtp.py" \
    "$(port_of "$CROSS_REF")" "$L" "$CROSS_REF" $subjects 2>&1 | tee "$L/crosscheck.txt"
  el "cross-checked against $CROSS_REF"
fi
for s in $WAVE; do kill -TERM -"${pid[$s]}" 2>/dev/null; done; sleep 3
for s in $WAVE; do kill -KILL -"${pid[$s]}" 2>/dev/null; tail -80 "$L/server-$s.log" > "$L/tail-$s.log"; done
if [ "${2:-}" = compare ]; then
  PYTHONPATH=$REPO/src:/root/site PROMPTS=$REPO/docs/validation/e2e-gpu/run5/prompts.json \
    python3 "$M/compare_mtp.py" "$L" ${SERVERS:-} | tee "$L/summary.txt"
fi
tar -czf $OUT/mtp.tar.gz -C /root --exclude='server-*.log' mtp; (cd /root && tar -czf $OUT/mtp-logs.tar.gz mtp/server-*.log)
el "done"
