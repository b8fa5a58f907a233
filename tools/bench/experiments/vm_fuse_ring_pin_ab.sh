#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-04 (fourth session) at 9c58896 plus an experiment switch never
# committed: EXP_NO_PIN=1 left the ring threads unpinned (FuseRing::Serve skipped pthread_setaffinity_np).
# Ring pinned / ring unpinned / /dev/fuse, alternated over 2 rounds of spillfs-bench --sections seq.
B=/tmp/build-rel/bin/spillfs-bench
for r in 1 2; do for mode in pin nopin dev; do
  args="--threads 16 --fuse-uring"; E=""
  [ $mode = nopin ] && E="EXP_NO_PIN=1"
  [ $mode = dev ] && args="--threads 16"
  env $E $B --dir /var/tmp/sbx --sections seq --size 1G --repeat 1 --mount-args "$args" 2>&1 | grep -E "^  (raw io_uring O_DIRECT +read|spillfs mount)" | sed "s/^/round $r $mode: /"
done; done
