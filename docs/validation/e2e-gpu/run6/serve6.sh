#!/bin/bash
# Run 6 (issue 23), a serving call on the GPU validation machine. usage: serve6.sh a|b
#   a: (first) joins and checks the 5 carried pieces (pack6.sh), unpacks the lock's vLLM
#      0.20.2 stack once into /root/site-base and makes one patched copy per variant,
#      each applied with patch(1) as role vllm_patches does:
#        new    files/patches/vllm-0.20.2/* (0001-0011, the 0011 of issue 23)
#               + trace-topk-path.patch (debug only: a log line per top-k path taken)
#        old    0001-0010 + the 0011 before issue 23 (git 8ca8552, run 5's set; carried)
#        fault  new + fault-off-by-one.patch (issue 23 item 7)
#      then starts a/servers.yml's servers (topk32 fixture) and queries them (query5.py:
#      whole distributions, greedy, concurrent).
#   d: d/servers.yml: causal6.py on the topk32 servers (new, fault) and the main fixture,
#      and topk_check6.py (persistent_topk called directly) while they start
#   c: b's servers again: sparse-new's prompt log-probs twice, then decode_bench6.py
#   b: (right after a, on the same warm machine) the main fixture's servers (b/servers.yml):
#      top-20 prompt log-probs of 4096/5120-token prompts from sparse-new and sparse-old,
#      then decode tokens/s (run5/decode_bench.py) of each server in turn, one at a time.
# Each server's command line is the one role vllm_service renders (cmdline-*.sh).
# Returns per-server tarballs and the logs under $OUT.
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
SET=$1
# R6: this folder as it travels (the device calls send the session's checkout, which has
# main's patch set and run 5's scripts; run 6's folder travels as a carried copy);
# LAST: the carried folder of the last piece (pack6.sh)
REPO=$PWD; R6=${R6:-$REPO/docs/validation/e2e-gpu/run6}; R=$R6/${SET/c/b}; LAST=${LAST:-.build/e6/c4}
RT=${RT:-/root}  # another root only for a dry run of the setup here (DRY=1)
L=$RT/run6$SET
rm -rf $L; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader | tee $L/gpu.txt
if [ ! -f $RT/setup.done ]; then
  [ -d "$LAST" ] && cp -a "$LAST"/. $RT/stash/
  cat $RT/stash/payload.part.* > $RT/payload.tar
  echo "$(cut -d' ' -f1 $RT/stash/payload.sha256)  $RT/payload.tar" | sha256sum -c || exit 1
  rm -rf $RT/p && mkdir $RT/p && tar -xf $RT/payload.tar -C $RT/p && rm $RT/payload.tar
  (cd $RT/p && grep -v ' main.gguf$' SHA256SUMS | sha256sum -c --quiet) || exit 1
  el "payload verified"
  rm -rf $RT/site-base && mkdir $RT/site-base && xz -T0 -dc $RT/p/site.tar.xz | tar -xf - -C $RT/site-base
  el "unpacked"
  patchset() {  # patchset DIR PATCH...
    rm -rf "$1"; cp -a $RT/site-base "$1"; local d=$1; shift
    for p in "$@"; do
      patch -p1 -s -d "$d" < "$p" && echo "$(basename "$d"): applied $(basename "$p")" \
        || { echo "PATCH FAILED: $d $p"; exit 1; }
    done
  }
  SET_NEW=("$REPO"/files/patches/vllm-0.20.2/*.patch)
  patchset $RT/site-new "${SET_NEW[@]}" "$R6/trace-topk-path.patch"
  patchset $RT/site-old "$REPO"/files/patches/vllm-0.20.2/00{01,02,03,04,05,06,07,08,09,10}-*.patch $RT/stash/old-0011.patch
  patchset $RT/site-fault "${SET_NEW[@]}" "$R6/trace-topk-path.patch" "$R6/fault-off-by-one.patch"
  PY3=$(command -v python3)
  for v in new old fault; do
    mkdir -p $RT/ml-env-$v/bin
    printf '#!/bin/sh\nexport PYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$RT/site-$v" "$PY3" > $RT/ml-env-$v/bin/python
    printf '#!/bin/sh\nexport PYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH}\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$RT/site-$v" "$PY3" > $RT/ml-env-$v/bin/vllm
    chmod 0755 $RT/ml-env-$v/bin/python $RT/ml-env-$v/bin/vllm
  done
  mkdir -p $RT/model/main; [ -z "${DRY:-}" ] && mkdir -p /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
  cp $RT/p/tiny-glm5-UD-Q4_K_XL.gguf $RT/model/
  rm -rf $RT/hf $RT/hf-main; cp -a $RT/p/hf $RT/hf; cp -a $RT/p/hf-main $RT/hf-main
  # the main fixture (index_topk 2048): the topk32 GGUF with its glm-dsa index_topk
  # value 32 -> 2048 (the only two bytes in which the fixtures' GGUFs differ)
  python3 - $RT/model/tiny-glm5-UD-Q4_K_XL.gguf $RT/model/main/tiny-glm5-UD-Q4_K_XL.gguf <<'PY'
import sys
src, dst = sys.argv[1], sys.argv[2]
data = bytearray(open(src, "rb").read())
key = b"glm-dsa.attention.indexer.top_k"
i = data.index(key) + len(key)
vtype, value = int.from_bytes(data[i:i + 4], "little"), int.from_bytes(data[i + 4:i + 8], "little")
assert (vtype, value) == (4, 32), (vtype, value)  # GGUF uint32 32
data[i + 4:i + 8] = (2048).to_bytes(4, "little")
open(dst, "wb").write(data)
PY
  echo "$(grep ' main.gguf$' $RT/p/SHA256SUMS | cut -d' ' -f1)  $RT/model/main/tiny-glm5-UD-Q4_K_XL.gguf" | sha256sum -c || exit 1
  $RT/ml-env-new/bin/python -c "import vllm, torch, triton, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee $RT/versions.txt
  python3 -c "import secrets; print(secrets.token_hex(16))" > $RT/apikey; chmod 0600 $RT/apikey
  touch $RT/setup.done
  el "setup done"
fi
cp $RT/versions.txt $L/
[ -n "${DRY:-}" ] && { el "dry run: setup only"; exit 0; }
export VLLM_API_KEY=$(cat /root/apikey)
health() { python3 -c "import sys,urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=3).status)
except Exception: print(0)" "$1"; }
declare -A PORT; NAMES=()
while read -r name port; do PORT[$name]=$port; NAMES+=("$name"); done < "$R/ports"
for s in "${NAMES[@]}"; do
  setsid bash "$R/cmdline-$s.sh" > "$L/server-$s.log" 2>&1 < /dev/null &
  echo $! > "$L/pid-$s"
done
el "${#NAMES[@]} servers started"
if [ "$SET" = d ]; then
  PYTHONPATH=$RT/site-new python3 $R6/topk_check6.py $L/topk_check6.json > $L/topk_check6.txt 2>&1 &
  TOPK_PID=$!
fi
declare -A UP
while :; do
  pending=0
  for s in "${NAMES[@]}"; do
    [ -n "${UP[$s]}" ] && continue
    if [ "$(health "http://127.0.0.1:${PORT[$s]}/health")" = 200 ]; then UP[$s]=1; el "$s healthy"
    elif ! kill -0 "$(cat $L/pid-$s)" 2>/dev/null; then UP[$s]=0; el "$s DIED"
    else pending=1; fi
  done
  [ $pending = 0 ] && break
  [ $(( $(date +%s) - T0 )) -gt ${WAIT_S:-330} ] && { el "timeout waiting for servers"; break; }
  sleep 2
done
Q=$REPO/docs/validation/e2e-gpu/run5
if [ "$SET" = a ]; then
  QP=()
  for s in "${NAMES[@]}"; do
    [ "${UP[$s]}" = 1 ] || continue
    python3 $Q/query5.py "${PORT[$s]}" "$L/$s" "$Q/prompts.json" 2048 > "$L/query-$s.txt" 2>&1 &
    QP+=($!)
  done
  [ ${#QP[@]} -gt 0 ] && wait "${QP[@]}"
  el "queried"
elif [ "$SET" = d ]; then
  wait $TOPK_PID; el "topk_check6 done"; cut -c1-400 $L/topk_check6.txt
  for s in sparse sparse-fault; do
    [ "${UP[$s]}" = 1 ] || continue
    python3 $R6/causal6.py "${PORT[$s]}" "$L/$s-causal-p1.json" "$Q/prompts.json" 1 40 64 100 128 160 200 255 > "$L/query-$s.txt" 2>&1
    python3 $R6/causal6.py "${PORT[$s]}" "$L/$s-causal-p0.json" "$Q/prompts.json" 0 40 80 127 >> "$L/query-$s.txt" 2>&1
    el "$s causality checked"
  done
  [ "${UP[sparse-main]}" = 1 ] && python3 $R6/causal6.py "${PORT[sparse-main]}" "$L/sparse-main-causal.json" "$Q/b/prompts.json" 0 1000 2000 2047 2048 2049 2100 > "$L/query-sparse-main.txt" 2>&1
  el "sparse-main causality checked"
  tar -czf $OUT/d-results.tar.gz -C $L $(cd $L && ls *.json)
elif [ "$SET" = c ]; then
  # c: b's servers again; the same prompts twice from sparse-new (is its run-to-run
  # output the same?), then decode_bench6.py (all servers interleaved, REPS rounds)
  for q in 1 2; do
    python3 $Q/query5.py "${PORT[sparse-new]}" "$L/sparse-new-q$q" "$Q/b/prompts.json" 2048 20 > "$L/query-sparse-new-q$q.txt" 2>&1
    el "sparse-new queried ($q)"
  done
  SV=(); for s in "${NAMES[@]}"; do [ "${UP[$s]}" = 1 ] && SV+=("$s:${PORT[$s]}"); done
  python3 $R6/decode_bench6.py $L/bench6.json "${SV[@]}" 2>&1 | tee $L/bench6.txt | cut -c1-300
  cp $L/bench6.json $OUT/c-bench6.json
  el "decode bench done"
else
  for s in sparse-new sparse-old; do
    [ "${UP[$s]}" = 1 ] || continue
    python3 $Q/query5.py "${PORT[$s]}" "$L/$s" "$Q/b/prompts.json" 2048 20 > "$L/query-$s.txt" 2>&1
    el "$s queried (main fixture, 4096/5120 tokens)"
  done
  for round in 1 2; do
    [ $round = 2 ] && [ $(( $(date +%s) - T0 )) -gt ${ROUND2_BEFORE_S:-300} ] && { el "no time for round 2"; break; }
    for s in "${NAMES[@]}"; do
      [ "${UP[$s]}" = 1 ] || continue
      python3 $Q/decode_bench.py "${PORT[$s]}" "$L/bench-$s-r$round" x 2048 >> "$L/bench.txt" 2>&1
      cp $L/bench.txt $OUT/$SET-bench.txt
      el "$s decode bench round $round: $(grep -c decode_tok_s $L/bench-$s-r$round.json 2>/dev/null) contexts"
    done
  done
  cat $L/bench.txt | cut -c1-300
fi
for s in "${NAMES[@]}"; do
  [ -f "$L/query-$s.txt" ] && sed "s/^/$s: /" "$L/query-$s.txt" | cut -c1-220
  echo "$s: $(grep -oE 'Using [A-Za-z_.]+ (attention )?backend[^.]*|Capturing CUDA graphs[^,]*|GLM5-RUN6-TRACE.*' "$L/server-$s.log" | sort | uniq -c | tr '\n' ';' | cut -c1-900)"
  grep -nE "Traceback|Error|error:" "$L/server-$s.log" | grep -v "VLLM_API_KEY" | head -4 | sed "s/^/$s: /" | cut -c1-400
done
for s in "${NAMES[@]}"; do kill -TERM -"$(cat $L/pid-$s)" 2>/dev/null; done
sleep 3
for s in "${NAMES[@]}"; do kill -KILL -"$(cat $L/pid-$s)" 2>/dev/null; done
for s in "${NAMES[@]}"; do
  files=$(cd $L && ls $s.* $s-q?.* 2>/dev/null)
  [ -n "$files" ] && tar -czf $OUT/$SET-$s.tar.gz -C $L $files
done
(cd /root && tar -czf $OUT/$SET-logs.tar.gz $(cd /root && find run6$SET -type f \( -name '*.log' -o -name '*.txt' -o -name 'bench-*.json' \)))
ls -la $OUT
el "done"
