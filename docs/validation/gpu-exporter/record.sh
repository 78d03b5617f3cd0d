#!/usr/bin/env bash
# Records what role gpu_exporter needs from a real nvidia-smi, on the GPU validation
# machine (no systemd there: the exporter is run directly). Writes into $1.
# Used for: the unit tests' and fake_nvidia_smi's recorded CSV, the field list the
# driver accepts, an unknown field's error, nvidia-smi as an unprivileged user with
# no_new_privs (what the unit's DynamicUser= and NoNewPrivileges= give it), and a
# scrape of the exporter itself.
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
exporter=roles/gpu_exporter/files/glm5_gpu_exporter.py
fields=$(python3 -c "import importlib.util as u, sys; s=u.spec_from_file_location('e','$exporter'); m=u.module_from_spec(s); sys.modules['e']=m; s.loader.exec_module(m); print(','.join(m.DEFAULT_FIELDS))")
echo "$fields" > "$out/fields.txt"
{
  nvidia-smi --version
  echo "--- /proc/devices (nvidia)"; grep -i nvidia /proc/devices
  echo "--- device nodes"; ls -l /dev/nvidia* 2>&1
  echo "--- id"; id
  echo "--- kernel"; uname -r
} > "$out/host.txt" 2>&1
nvidia-smi --help-query-gpu > "$out/help-query-gpu.txt" 2>&1
nvidia-smi --query-gpu="$fields" --format=csv,nounits > "$out/query-header.csv" 2> "$out/query.stderr"
echo "rc=$?" >> "$out/query.stderr"
nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits > "$out/query.csv"
nvidia-smi --query-gpu=index,no.such.field --format=csv,noheader,nounits > "$out/unknown-field.out" 2>&1
echo "rc=$?" >> "$out/unknown-field.out"
setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs \
  nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits > "$out/unprivileged.csv" 2>&1
echo "rc=$?" >> "$out/unprivileged.csv"
# Syscalls and socket families nvidia-smi uses (for the unit's SystemCallFilter= and
# RestrictAddressFamilies=), where strace exists.
if command -v strace >/dev/null; then
  strace -f -qq -o "$out/strace.log" nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits >/dev/null 2>&1
  echo "rc=$?" >> "$out/strace.log"
fi
# MemoryDenyWriteExecute= as the kernel does it (PR_SET_MDWE, Linux 6.3+), where available.
python3 -c 'import ctypes, os, sys
rc = ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0)
print("prctl(PR_SET_MDWE) rc", rc, "errno", ctypes.get_errno(), flush=True)
os.execvp("nvidia-smi", ["nvidia-smi", "--query-gpu=" + sys.argv[1], "--format=csv,noheader,nounits"])' \
  "$fields" > "$out/mdwe.txt" 2>&1
echo "rc=$?" >> "$out/mdwe.txt"
# PrivateUsers= as a user namespace, where unprivileged ones are allowed.
setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs \
  unshare --user nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits > "$out/userns.csv" 2>&1
echo "rc=$?" >> "$out/userns.csv"
python3 "$exporter" --once > "$out/once.txt" 2> "$out/once.stderr"
echo "rc=$?" >> "$out/once.stderr"
cp "$exporter" /tmp/glm5_gpu_exporter.py && chmod 0755 /tmp/glm5_gpu_exporter.py
setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs \
  python3 /tmp/glm5_gpu_exporter.py --listen-address 127.0.0.1 --port 19835 2> "$out/server.stderr" &
pid=$!
sleep 2
python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:19835/metrics", timeout=20).read().decode())' \
  > "$out/server-metrics.txt" 2>&1
echo "rc=$?" >> "$out/server-metrics.txt"
kill "$pid"
