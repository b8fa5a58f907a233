#!/usr/bin/env bash
# Written for the H200 in the fourth session (2026-12-04), not yet run there (no device was lent);
# run from the repo root, with Release binaries in .devrun/
# (tools/bench/README.md has the recipe). Question: are cold sequential reads through the mount short
# of raw because the read-ahead keeps fewer bytes in flight than raw's 16 x 1 MiB? The daemon is the
# committed code with `spillfs mount --read-ahead SIZE` (16M is the default). Each row is one
# `spillfs-bench --sections seq` (its own raw io_uring QD 16 run beside it), alternated over
# settings and rounds because the disk drifts.
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=.devrun/bin/spillfs-bench; mkdir -p /root/sb
echo "disk: $(lsblk -dno NAME,SIZE,ROTA,MODEL 2>/dev/null | tr '\n' ';') $(cat /sys/block/vda/queue/max_sectors_kb 2>/dev/null) KiB max, nr_requests $(cat /sys/block/vda/queue/nr_requests 2>/dev/null)"
for r in 1 2 3; do for ra in 16M 32M 64M; do
  $B --spillfs .devrun/bin/spillfs --dir /root/sb --sections seq --size 2G --repeat 1 --mount-args "--read-ahead $ra" \
    2>&1 | grep -E "^ +(raw io_uring O_DIRECT|spillfs mount (buffered|O_DIRECT) read)" | grep -E "read" |
    awk -v r=$r -v ra=$ra '{printf "round %s read-ahead %s: %s\n", r, ra, $0}'
done; done
