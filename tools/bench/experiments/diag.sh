#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 from the repo root, with Release binaries in .devrun/
# (ignored by git; tools/bench/README.md has the build-and-bundle recipe): .devrun/bin holds
# the daemon of 9d7c677 ("old"), .devrun/new that of b124dae ("new"), .devrun/devlibs the
# bundled libraries. Outputs: tools/bench/results/h200_2026-12-04_*; figures in RESULTS.md.
# Device diagnostics: mount write ingest vs flush, writeback-cache and thread A/Bs.
set -u
cd "$(dirname "$0")/../../.."  # the repo root
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=$PWD/.devrun/bin; S=$B/spillfs
nproc; uname -r; free -g | head -2; df -h /root | tail -1
D=/root/d; mkdir -p $D/m
$S mkfs $D/vol --size 24G >/dev/null && $S mount $D/vol $D/m --ram-tier 12G || exit 1
mkdir $D/m/e && python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
dd if=/dev/urandom of=$D/src bs=1M count=4096 status=none
t() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b 'BEGIN{printf "%.0f MB/s (%.2fs)", 4294967296/(b-a)/1e6, b-a}'; }
fsync_py() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)" "$1"; }
dd if=$D/src of=$D/m/e/w0 bs=1M oflag=direct status=none; rm $D/m/e/w0   # warm the pool
for r in 1 2; do
  echo "round $r"
  echo "  ingest O_DIRECT ephemeral:   $(t dd if=$D/src of=$D/m/e/f bs=1M oflag=direct)"
  echo "  then fsync of it (flush):    $(t fsync_py $D/m/e/f)"; rm $D/m/e/f
  echo "  ingest buffered ephemeral:   $(t dd if=$D/src of=$D/m/e/f bs=1M)"; rm $D/m/e/f
  echo "  mount O_DIRECT + fsync:      $(t dd if=$D/src of=$D/m/g bs=1M oflag=direct conv=fsync)"; rm $D/m/g
  echo "  mount buffered + fsync:      $(t dd if=$D/src of=$D/m/g bs=1M conv=fsync)"; rm $D/m/g
  echo "  ext4 dd O_DIRECT + fsync:    $(t dd if=$D/src of=$D/raw bs=1M oflag=direct conv=fsync)"; rm $D/raw
done
$S stat $D/m | head -20
$S umount $D/m; rm -rf $D
BENCH="$B/spillfs-bench --spillfs $S --dir /root/sb --python python3"
for wb in "" "--writeback-cache" "" "--writeback-cache"; do
  echo "=== seq,torch mount-args '$wb'"
  $BENCH --size 2G --sections seq,torch --repeat 1 ${wb:+--mount-args "$wb"} --json-out $OUT/seq${wb:+_wb}_$RANDOM.json | tail -16
done
for th in "" "--threads 64"; do
  echo "=== random mount-args '$th'"
  $BENCH --sections random --rand-size 8G --rand-seconds 2 ${th:+--mount-args "$th"} --json-out $OUT/rand${th:+_t64}.json | tail -12
done
