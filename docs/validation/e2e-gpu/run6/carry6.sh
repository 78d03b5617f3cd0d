#!/bin/bash
# Run 6, carrying call N (0-3; the last piece is moved by serve6.sh a): moves this call's
# piece (CARRY_DIR/cN, default .build/e6) into /root/stash, which stays while the machine is warm.
set -e
mkdir -p /root/stash
cp -a "${CARRY_DIR:-.build/e6}/c$1/." /root/stash/
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
echo "call $1: stash has $(ls /root/stash | wc -l) entries, $(du -sm /root/stash | cut -f1) MiB"
