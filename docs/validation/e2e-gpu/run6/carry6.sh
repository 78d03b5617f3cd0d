#!/bin/bash
# Run 6, carrying call N (0-2; call 3's piece is moved by serve6.sh a): moves this call's
# piece (.build/e6/cN) into /root/stash, which stays while the machine is warm.
set -e
mkdir -p /root/stash
cp -a ".build/e6/c$1/." /root/stash/
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
echo "call $1: stash has $(ls /root/stash | wc -l) entries, $(du -sm /root/stash | cut -f1) MiB"
