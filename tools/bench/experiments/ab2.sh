#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 from the repo root, with Release binaries in .devrun/
# (ignored by git; tools/bench/README.md has the build-and-bundle recipe): .devrun/bin holds
# the daemon of 9d7c677 ("old"), .devrun/new that of b124dae ("new"), .devrun/devlibs the
# bundled libraries. Outputs: tools/bench/results/h200_2026-12-04_*; figures in RESULTS.md.
# Read-path A/B, old (.devrun/bin) vs new (.devrun/new) daemon, alternated; one volume, one 4 GiB file.
set -u
cd "$(dirname "$0")/../../.."  # the repo root
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
OLD=$PWD/.devrun/bin/spillfs NEW=$PWD/.devrun/new/spillfs
D=/root/ab; mkdir -p $D/m; $OLD mkfs $D/vol --size 24G >/dev/null
dd if=/dev/urandom of=$D/src bs=1M count=4096 status=none
$OLD mount $D/vol $D/m >/dev/null && cp $D/src $D/m/f && sync $D/m/f && cp $D/src $D/raw && sync && $OLD umount $D/m >/dev/null
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b -v n=$BYTES 'BEGIN{printf "%5.0f", n/(b-a)/1e6}'; }
echo "cold SSD reads of 4 GiB, 1 MiB requests (MB/s): raw-direct | mount O_DIRECT | mount buffered"
BYTES=4294967296
for r in 1 2 3 4; do for d in old new; do
  S=$OLD; [ $d = new ] && S=$NEW
  $S mount $D/vol $D/m >/dev/null
  drop; a=$(mb dd if=$D/raw of=/dev/null bs=1M iflag=direct)
  drop; b=$(mb dd if=$D/m/f of=/dev/null bs=1M iflag=direct)
  drop; c=$(mb dd if=$D/m/f of=/dev/null bs=1M)
  echo "round $r $d: $a | $b | $c"
  $S umount $D/m >/dev/null
done; done
echo "RAM-tier reads of 2 GiB just written to an ephemeral dir (MB/s): O_DIRECT | buffered"
BYTES=2147483648
for r in 1 2 3; do for d in old new; do
  S=$OLD; [ $d = new ] && S=$NEW
  $S mount $D/vol $D/m --ram-tier 8G >/dev/null; mkdir -p $D/m/e; python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  dd if=$D/src of=$D/m/e/a bs=1M count=2048 status=none
  b=$(mb dd if=$D/m/e/a of=/dev/null bs=1M iflag=direct)
  drop; c=$(mb dd if=$D/m/e/a of=/dev/null bs=1M)
  echo "round $r $d: $b | $c   ssd-written $(grep '^spillfs_bytes_written_ssd ' $D/m/.spillfs/stats | awk '{print $2}')"
  rm $D/m/e/a; $S umount $D/m >/dev/null
done; done
