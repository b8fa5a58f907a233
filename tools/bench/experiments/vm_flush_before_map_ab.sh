#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-05 (seventh session), from the repo root: the data flush
# before every mapping (Filesystem::FlushBeforeMapping) against the code before it (69e8f51, built
# in /tmp/ab/build-old from a worktree; it synced the data area in the background every 64 MiB
# instead). Release builds of both (the new one in /tmp/ab/build-new); alternated over ROUNDS
# rounds because the VM's disk drifts; each row is beside its own raw io_uring run. SECTIONS
# defaults to seq (1 MiB stream through the mount, 1 GiB); `random` adds the direct path.
set -u
cd "$(dirname "$0")/../../.."
D=${D:-/var/tmp/sbx}; mkdir -p $D
for r in ${ROUNDS:-1 2 3}; do for mode in ${MODES:-before after}; do
  build=/tmp/ab/build-new; [ $mode = before ] && build=/tmp/ab/build-old
  $build/bin/spillfs-bench --dir $D --spillfs $build/bin/spillfs --sections ${SECTIONS:-seq} --size 1G \
    --repeat 1 2>&1 | grep -E "^    (raw|spillfs mount|host fs|spillfs direct)" | grep -E "write|read" |
    sed "s/^/round $r $mode: /"
done; done
