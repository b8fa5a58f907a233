#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-05 (eighth session), from the repo root: the flush
# pipeline with several batches in flight and a background flush that takes chunks filled
# while it runs, against b1f4c5a (one batch written while the previous one is mapped, and
# every background flush drained to its last sync before the next began). OLD and NEW are
# the two `spillfs` binaries (Release builds); the same spillfs-bench runs both, alternated
# over ROUNDS rounds because the VM's disk drifts; each row sits beside its own raw run.
set -u
cd "$(dirname "$0")/../../.."
OLD=${OLD:-/tmp/ab/base/spillfs}; NEW=${NEW:-/tmp/ab/build-new/bin/spillfs}
BENCH=${BENCH:-/tmp/ab/build-new/bin/spillfs-bench}
D=${D:-/var/tmp/sbx}; mkdir -p $D
for r in ${ROUNDS:-1 2 3}; do for mode in ${MODES:-old new}; do
  bin=$NEW; [ $mode = old ] && bin=$OLD
  $BENCH --dir $D --spillfs $bin --sections ${SECTIONS:-seq} --size 1G --repeat 1 2>&1 |
    grep -E "^    (raw|spillfs mount|spillfs direct)" | grep -E "write" | sed "s/^/round $r $mode: /"
done; done
