#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 from the repo root (run 15 in RESULTS.md), Release binaries in
# .devrun/ (ignored by git; tools/bench/README.md has the recipe): .devrun/new the daemon of
# b124dae, .devrun/new2 the same with leader_follower_loop.patch (beside this file) applied. The
# patch was not kept: it showed no gain. Output: results/h200_2026-12-04_run15_*.
# Session-loop A/B: libfuse's loop (b124dae, .devrun/new) against the leader/follower loop
# (.devrun/new2) with and without spinning; ingest and write+fsync of 4 GiB, reads, alternated.
set -u
cd "$(dirname "$0")/../../.."  # the repo root
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
BASE=$PWD/.devrun/new/spillfs LOOP=$PWD/.devrun/new2/spillfs
D=/root/lp; mkdir -p $D/m; $BASE mkfs $D/vol --size 24G >/dev/null
dd if=/dev/urandom of=$D/src bs=1M count=4096 status=none
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b 'BEGIN{printf "%5.0f", 4294967296/(b-a)/1e6}'; }
echo "MB/s, 4 GiB, dd bs=1M: ingest O_DIRECT | ingest buffered | O_DIRECT+fsync | buffered+fsync | cold read O_DIRECT | raw dd O_DIRECT+fsync"
for r in 1 2; do for v in libfuse spin0 spin200; do
  case $v in libfuse) S=$BASE; A="";; spin0) S=$LOOP; A="--spin-us 0";; spin200) S=$LOOP; A="--spin-us 200";; esac
  $S mount $D/vol $D/m $A >/dev/null; mkdir -p $D/m/e; python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  dd if=$D/src of=$D/m/e/w bs=1M oflag=direct status=none; rm $D/m/e/w
  a=$(mb dd if=$D/src of=$D/m/e/f bs=1M oflag=direct); rm $D/m/e/f
  b=$(mb dd if=$D/src of=$D/m/e/f bs=1M); rm $D/m/e/f
  c=$(mb dd if=$D/src of=$D/m/g bs=1M oflag=direct conv=fsync); rm $D/m/g
  d=$(mb dd if=$D/src of=$D/m/g bs=1M conv=fsync)
  $S umount $D/m >/dev/null; $S mount $D/vol $D/m $A >/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches
  e=$(mb dd if=$D/m/g of=/dev/null bs=1M iflag=direct); rm $D/m/g
  f=$(mb dd if=$D/src of=$D/raw bs=1M oflag=direct conv=fsync); rm $D/raw
  echo "round $r $v: $a | $b | $c | $d | $e | $f"
  $S umount $D/m >/dev/null
done; done
B=$PWD/.devrun/new/spillfs-bench
for v in spin200 libfuse; do
  S=$LOOP; [ $v = libfuse ] && S=$BASE
  echo "=== bench seq,torch,random $v"
  $B --spillfs $S --dir /root/sb --python python3 --size 2G --rand-size 4G --rand-seconds 2 --sections seq,torch,random --json-out $OUT/loop_bench_$v.json | grep -E "^(seq|torch|random) "
done
