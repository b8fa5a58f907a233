#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-04 (fourth session) at 6d01f62, from the repo root, with a
# Release build in /tmp/build-rel. FUSE over io_uring (`spillfs mount --fuse-uring`) against
# /dev/fuse, alternated over 3 rounds because the VM's disk drifts: each row is one
# `spillfs-bench --sections seq,random` with its own raw io_uring runs beside it.
set -u
cd "$(dirname "$0")/../../.."
B=/tmp/build-rel/bin/spillfs-bench
D=${D:-/var/tmp/sbx}; mkdir -p $D
echo Y > /sys/module/fuse/parameters/enable_uring
for r in 1 2 3; do for mode in dev_fuse ring; do
  args="--threads 16"; [ $mode = ring ] && args="$args --fuse-uring"
  $B --dir $D --sections seq,random --size 1G --rand-size 1G --rand-seconds 2 --repeat 1 --mount-args "$args" 2>&1 |
    grep -E "^  (raw|spillfs mount)" | sed "s/^/round $r $mode: /"
done; done
