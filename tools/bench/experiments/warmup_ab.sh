#!/usr/bin/env bash
# Ran from .devrun/ (copied here as it ran); needs a daemon built with the NOWARM=1 switch
# (an experiment-only getenv in WriteBackCache's pool construction, never committed).
# H200: RAM-tier pool warm-up thread on (default) vs off (NOWARM=1, experiment build only).
set -u
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
S=$PWD/.devrun/bin/spillfs
nproc; D=/root/w; mkdir -p $D/m
head -c 2G /dev/urandom > $D/src
$S mkfs $D/vol --size 16G >/dev/null || exit 1
t() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b 'BEGIN{printf "%5.0f", 2147483648/(b-a)/1e6}'; }
for r in 1 2 3; do
  for mode in warm nowarm; do
    if [ $mode = nowarm ]; then NOWARM=1 $S mount $D/vol $D/m >/dev/null; else $S mount $D/vol $D/m >/dev/null; fi
    mkdir -p $D/m/e && python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
    a=$(t dd if=$D/src of=$D/m/g bs=1M oflag=direct conv=fsync); rm $D/m/g
    b=$(t dd if=$D/src of=$D/m/g bs=1M oflag=direct conv=fsync); rm $D/m/g
    $S umount $D/m >/dev/null
    if [ $mode = nowarm ]; then NOWARM=1 $S mount $D/vol $D/m >/dev/null; else $S mount $D/vol $D/m >/dev/null; fi
    c=$(t dd if=$D/src of=$D/m/e/f bs=1M oflag=direct); d=$(t dd if=$D/src of=$D/m/e/f2 bs=1M); rm $D/m/e/f $D/m/e/f2
    $S umount $D/m >/dev/null
    echo "round $r $mode: fresh-mount O_DIRECT+fsync first $a second $b MB/s | fresh-mount ephemeral ingest O_DIRECT $c then buffered $d MB/s"
  done
done
r=$(t dd if=$D/src of=$D/raw bs=1M oflag=direct conv=fsync); echo "ext4 dd O_DIRECT+fsync $r MB/s"
rm -rf $D
