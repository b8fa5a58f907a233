#!/usr/bin/env bash
# Written for the H200 in the fourth session (2026-12-04), not yet run there (no device was lent);
# run from the repo root with Release binaries in .devrun/ (tools/bench/README.md has the recipe).
# Question: on 16 cores, does FUSE over io_uring (`spillfs mount --fuse-uring`, a queue per CPU)
# beat /dev/fuse? Each row is one `spillfs-bench --sections seq,random` (its own raw runs beside it),
# the two transports alternated over 3 rounds because the disk drifts. The kernel offers the ring
# only with the fuse module's enable_uring set.
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=.devrun/bin/spillfs-bench; mkdir -p /root/sb
echo Y > /sys/module/fuse/parameters/enable_uring || echo "cannot set enable_uring: the ring rows fall back"
echo "possible CPUs $(cat /sys/devices/system/cpu/possible), online $(cat /sys/devices/system/cpu/online)"
for r in 1 2 3; do for mode in dev_fuse ring; do
  args=""; [ $mode = ring ] && args="--fuse-uring"
  $B --spillfs .devrun/bin/spillfs --dir /root/sb --sections seq,random --size 2G --rand-size 4G --rand-seconds 2 \
    --repeat 1 --mount-args "$args" 2>&1 | grep -E "^ +(raw|spillfs mount)" | sed "s/^/round $r $mode: /"
done; done
