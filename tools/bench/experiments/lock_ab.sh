#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 from the repo root (run 16 in RESULTS.md), Release binaries in
# .devrun/ (ignored by git; tools/bench/README.md has the recipe): .devrun/new the daemon of
# b124dae, .devrun/new3 that of the commit that added LockSpinning to WriteCached.
# Output: results/h200_2026-12-04_run16_write_lock_ab.txt.
# Write-lock A/B: the daemon of b124dae (.devrun/new) against the same with WriteCached taking the
# inode's I/O lock spinning up to 200 us before sleeping (.devrun/new3); alternated, 4 GiB dd bs=1M.
set -u
cd "$(dirname "$0")/../../.."  # the repo root
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
BASE=$PWD/.devrun/new/spillfs SPIN=$PWD/.devrun/new3/spillfs
D=/root/lk; mkdir -p $D/m; $BASE mkfs $D/vol --size 24G >/dev/null
dd if=/dev/urandom of=$D/src bs=1M count=4096 status=none
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b 'BEGIN{printf "%5.0f", 4294967296/(b-a)/1e6}'; }
echo "MB/s: ingest O_DIRECT | ingest buffered | O_DIRECT+fsync | buffered+fsync"
for r in 1 2 3; do for v in base spin; do
  S=$BASE; [ $v = spin ] && S=$SPIN
  $S mount $D/vol $D/m >/dev/null; mkdir -p $D/m/e; python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  dd if=$D/src of=$D/m/e/w bs=1M oflag=direct status=none; rm $D/m/e/w
  a=$(mb dd if=$D/src of=$D/m/e/f bs=1M oflag=direct); rm $D/m/e/f
  b=$(mb dd if=$D/src of=$D/m/e/f bs=1M); rm $D/m/e/f
  c=$(mb dd if=$D/src of=$D/m/g bs=1M oflag=direct conv=fsync); rm $D/m/g
  d=$(mb dd if=$D/src of=$D/m/g bs=1M conv=fsync); rm $D/m/g
  echo "round $r $v: $a | $b | $c | $d"
  $S umount $D/m >/dev/null
done; done
