#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-05 (seventh session), from the repo root: what the flush
# before every mapping costs a write-through mount (`--ram-tier 0`: each write() maps its own
# blocks, so each one now waits for an fdatasync of the data area). One stream of 1 MiB writes,
# 512 MiB, + fsync (experiments/stream_io.c, built to /tmp/ab/stream_io), through a mount of
# 69e8f51 (/tmp/ab/build-old) and of the current code (/tmp/ab/build-new), alternated over
# ROUNDS; then the same with the default RAM tier for scale.
set -u
cd "$(dirname "$0")/../../.."
D=${D:-/var/tmp/wtab}; rm -rf $D; mkdir -p $D/mnt
for r in ${ROUNDS:-1 2 3}; do for mode in ${MODES:-before after}; do for tier in 0 default; do
  build=/tmp/ab/build-new; [ $mode = before ] && build=/tmp/ab/build-old
  args=""; [ $tier = 0 ] && args="--ram-tier 0"
  rm -rf $D/vol; $build/bin/spillfs mkfs $D/vol --size 4G > /dev/null
  $build/bin/spillfs mount $D/vol $D/mnt $args > /dev/null
  echo "round $r $mode tier=$tier: $(/tmp/ab/stream_io w $D/mnt/f 512 | tr '\n' ' ')"
  $build/bin/spillfs umount $D/mnt > /dev/null
done; done; done
