#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-05 (fifth session), from the repo root: the session's two write
# changes together (background sync of the data area, 3001f19; the RAM tier warmed at mount, 784bf34)
# against the code before them (99e6f44, built in /tmp/build-old from a worktree). Release builds;
# alternated rounds because the VM's disk drifts; each row is beside its own raw io_uring run.
set -u
cd "$(dirname "$0")/../../.."
B=/tmp/build-rel/bin/spillfs-bench
D=${D:-/var/tmp/sbx}; mkdir -p $D
for r in ${ROUNDS:-1 2 3 4 5}; do for mode in before after; do
  bin=/tmp/build-rel/bin/spillfs
  [ $mode = before ] && bin=/tmp/build-old/bin/spillfs
  $B --dir $D --spillfs $bin --sections seq --size 1G --repeat 1 --mount-args "--threads 16" 2>&1 |
    grep -E "^    (raw|spillfs mount|host fs)" | grep -E "write|read" | sed "s/^/round $r $mode: /"
done; done
