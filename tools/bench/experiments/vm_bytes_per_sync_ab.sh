#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-05 (fifth session), from the repo root: the background sync of
# the data area (`mount --bytes-per-sync`, default 64M) against the code before it (99e6f44, built
# in /tmp/build-old from a worktree) and against `--bytes-per-sync 0`. Release builds; alternated
# over 3 rounds (ROUNDS and MODES to change) because the VM's disk drifts; each row is beside its own raw io_uring run.
set -u
cd "$(dirname "$0")/../../.."
B=/tmp/build-rel/bin/spillfs-bench
D=${D:-/var/tmp/sbx}; mkdir -p $D
for r in ${ROUNDS:-1 2 3}; do for mode in ${MODES:-before new new_off}; do
  bin=/tmp/build-rel/bin/spillfs; args="--threads 16"
  [ $mode = before ] && bin=/tmp/build-old/bin/spillfs
  [ $mode = new_off ] && args="$args --bytes-per-sync 0"
  $B --dir $D --spillfs $bin --sections seq --size 1G --repeat 1 --mount-args "$args" 2>&1 |
    grep -E "^    (raw|spillfs mount|host fs)" | grep -E "write|read" | sed "s/^/round $r $mode: /"
done; done
