#!/bin/bash
# Issue 23 item 3 (PREPARED, NOT RUN YET): patch 0013's fp8 latent cache of
# TRITON_MLA_SPARSE on the GPU validation machine (H100/H200, SM 9.0, no network).
# usage (repository root, on that machine, after run 6's setup
# `docs/validation/e2e-gpu/run6/serve6.sh a` left /root/setup.done, /root/site-base,
# /root/model/tiny-glm5-UD-Q4_K_XL.gguf, /root/hf and /root/apikey):
#   bash docs/validation/e2e-gpu/fp8/run.sh
# 1. makes /root/site-fp8: site-base's vLLM with this checkout's whole patch set
#    (files/patches/vllm-0.20.2/*.patch, 0001-0013) applied with patch(1) as role
#    vllm_patches does (a symlink tree of site-base's vllm/ whose patched files are real
#    copies; the rest of the stack is read from site-base);
# 2. the kernel check on the GPU (devtests/ml/patches/sparse_fp8_check.py --device cuda):
#    vLLM's own concat_and_cache_mla writes the fp8_ds_mla rows (bytes compared with the
#    project's torch writer), then sparse_mla over them against float32 attention over
#    the dequantized rows and against the bf16 cache; and sparse_mla's time per call at
#    GLM-5's per-rank dims (8 heads, top-k 2048, 64k cache; batch 1/16/64) bf16 vs fp8;
# 3. starts fp8/servers.yml's three servers at once (the command lines role vllm_service
#    renders: cmdline-*.sh; bf16 cache eager, fp8 eager, fp8 with CUDA graphs), takes
#    the held prompts' whole log-prob distributions and greedy tokens from each
#    (run5/query5.py), and compares them (compare_fp8.py: KL, top-1, greedy).
# Everything comes back under $OUT (fp8-results.tar.gz, kernel_check.json,
# compare_fp8.json, summary.txt). GPU time: about 3-4 minutes (setup of the tree ~20 s,
# kernel check ~30 s, servers ~2 min to start, queries ~30 s).
# DRY=1 RT=<dir> [PY3=<python with the stack>] (a dir with site-base and setup.done): step 1
# and an import check only (how it was tried here, on the ML venv's site-packages).
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
REPO=$PWD; R=$REPO/docs/validation/e2e-gpu/fp8; Q=$REPO/docs/validation/e2e-gpu/run5
RT=${RT:-/root}; L=$RT/fp8; OUT=${OUT:-$L/out}
rm -rf "$L"; mkdir -p "$L" "$OUT"
[ -f "$RT/setup.done" ] && [ -d "$RT/site-base/vllm" ] || {
  echo "no $RT/setup.done or $RT/site-base/vllm: run docs/validation/e2e-gpu/run6/serve6.sh a first (its setup)"
  exit 1
}
[ -z "${DRY:-}" ] && nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader | tee "$L/gpu.txt"

# 1. the patched tree
SITE=$RT/site-fp8
rm -rf "$SITE"; mkdir -p "$SITE"
cp -as "$(readlink -f "$RT/site-base/vllm")" "$SITE/vllm"
PATCHES=("$REPO"/files/patches/vllm-0.20.2/[0-9][0-9][0-9][0-9]-*.patch)
for rel in $(sed -n 's|^+++ [^/ ]*/\([^[:space:]]*\).*|\1|p' "${PATCHES[@]}" | sort -u); do
  [ -L "$SITE/$rel" ] && { rm "$SITE/$rel"; cp "$RT/site-base/$rel" "$SITE/$rel"; }
done
for p in "${PATCHES[@]}"; do
  patch -p1 -s -f -N -d "$SITE" -i "$p" && echo "applied $(basename "$p")" || { echo "PATCH FAILED: $(basename "$p")"; exit 1; }
done | tee "$L/patches.txt"
grep -q "PATCH FAILED" "$L/patches.txt" && exit 1
grep -q "^applied 0013-" "$L/patches.txt" || { echo "patch 0013 is not in this checkout's set"; exit 1; }
PY3=${PY3:-$(command -v python3)}
mkdir -p "$RT/ml-env-fp8/bin"
printf '#!/bin/sh\nexport PYTHONPATH=%s:%s${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$SITE" "$RT/site-base" "$PY3" > "$RT/ml-env-fp8/bin/python"
printf '#!/bin/sh\nexport PYTHONPATH=%s:%s${PYTHONPATH:+:$PYTHONPATH}\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$SITE" "$RT/site-base" "$PY3" > "$RT/ml-env-fp8/bin/vllm"
chmod 0755 "$RT/ml-env-fp8/bin/python" "$RT/ml-env-fp8/bin/vllm"
"$RT/ml-env-fp8/bin/python" - "$SITE" <<'PY' | tee "$L/tree.txt" || exit 1
import sys
import vllm
from vllm.v1.attention.backends.mla import sparse_utils
from vllm.v1.attention.backends.registry import AttentionBackendEnum
assert vllm.__file__.startswith(sys.argv[1]), vllm.__file__
backend = AttentionBackendEnum.TRITON_MLA_SPARSE.get_class()
assert "fp8" in backend.supported_kv_cache_dtypes and sparse_utils.fp8_ds_mla_row_bytes() == 656
print("vllm", vllm.__version__, "from", vllm.__file__, "| TRITON_MLA_SPARSE takes", backend.supported_kv_cache_dtypes)
PY
el "patched tree ready"
[ -n "${DRY:-}" ] && { el "dry run: tree only"; exit 0; }

# 2. the kernel check (vLLM's writer) and the per-call timing, on the GPU
PYTHONPATH=$REPO/devtests/ml/patches "$RT/ml-env-fp8/bin/python" "$REPO/devtests/ml/patches/sparse_fp8_check.py" \
  --device cuda --vllm-writer --bench > "$L/kernel_check.txt" 2>&1
tail -1 "$L/kernel_check.txt" > "$OUT/kernel_check.json"
el "kernel check: $(cut -c1-600 "$OUT/kernel_check.json")"

# 3. the served fixture, bf16 cache vs fp8
export VLLM_API_KEY=$(cat "$RT/apikey")
mkdir -p /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
health() { python3 -c "import sys,urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=3).status)
except Exception: print(0)" "$1"; }
declare -A PORT UP; NAMES=()
while read -r name port; do PORT[$name]=$port; NAMES+=("$name"); done < "$R/ports"
for s in "${NAMES[@]}"; do
  setsid bash "$R/cmdline-$s.sh" > "$L/server-$s.log" 2>&1 < /dev/null &
  echo $! > "$L/pid-$s"
done
el "${#NAMES[@]} servers started"
while :; do
  pending=0
  for s in "${NAMES[@]}"; do
    [ -n "${UP[$s]:-}" ] && continue
    if [ "$(health "http://127.0.0.1:${PORT[$s]}/health")" = 200 ]; then UP[$s]=1; el "$s healthy"
    elif ! kill -0 "$(cat "$L/pid-$s")" 2>/dev/null; then UP[$s]=0; el "$s DIED"
    else pending=1; fi
  done
  [ $pending = 0 ] && break
  [ $(( $(date +%s) - T0 )) -gt ${WAIT_S:-270} ] && { el "timeout waiting for servers"; break; }
  sleep 2
done
QP=()
for s in "${NAMES[@]}"; do
  [ "${UP[$s]:-}" = 1 ] || continue
  python3 "$Q/query5.py" "${PORT[$s]}" "$L/$s" "$Q/prompts.json" 2048 > "$L/query-$s.txt" 2>&1 &
  QP+=($!)
done
[ ${#QP[@]} -gt 0 ] && wait "${QP[@]}"
el "queried"
for s in "${NAMES[@]}"; do
  grep -nE "Traceback|Error|error:|fp8_ds_mla" "$L/server-$s.log" | grep -v VLLM_API_KEY | head -8 | sed "s/^/$s: /" | cut -c1-400
  kill -TERM -"$(cat "$L/pid-$s")" 2>/dev/null
done
python3 "$R/compare_fp8.py" "$L" "$OUT/compare_fp8.json" ${ORACLE_NPZ:+--oracle-npz "$ORACLE_NPZ"} > "$L/compare.txt" 2>&1
{ cat "$L/gpu.txt" "$L/tree.txt"; echo "kernel check:"; cat "$OUT/kernel_check.json"; echo
  python3 - "$OUT/compare_fp8.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for n, s in r["servers"].items():
    print(n, "served" if s["served"] else "NOT SERVED", s["errors"][:1])
for pair, rows in r["pairs"].items():
    print(pair, [None if x is None else (round(x["kl_mean"], 6), round(x["kl_max"], 5), round(x["top1"], 4)) for x in rows])
print("greedy equal to bf16:", r["greedy_equal_to_bf16"])
for pair, rows in r.get("oracle", {}).get("servers", {}).items():  # ORACLE_NPZ: llama.cpp's logits
    print(pair, [None if x is None else {part: (round(a["kl_mean"], 5), round(a["kl_max"], 4), round(a["top1"], 3))
                                         for part, a in x.items()} for x in rows])
PY
} | tee "$OUT/summary.txt"
sleep 3
for s in "${NAMES[@]}"; do kill -KILL -"$(cat "$L/pid-$s")" 2>/dev/null; done
for s in "${NAMES[@]}"; do gzip -c "$L/server-$s.log" > "$L/server-$s.log.gz"; done
tar -czf "$OUT/fp8-results.tar.gz" -C "$L" --exclude='server-*.log' --exclude=out .
el "done"
