#!/usr/bin/env bash
# Where a sequential reader through the mount waits: reads of a 2 GiB
# file with dd bs=1M, O_DIRECT and buffered, each after a remount and a drop of the page cache, then
# the daemon's read-ahead figures from `spillfs stat --json` (read_ahead_waits and
# read_ahead_wait_seconds: reads that found their window still being fetched, and how long they
# waited). Beside them, the same file on the host filesystem read with dd O_DIRECT (QD1, as the
# mount's O_DIRECT reader is). READ_AHEADS lists the --read-ahead sizes to try. WRITER=direct
# writes the file into the mount with dd oflag=direct bs=1M (as spillfs-bench's O_DIRECT row does)
# instead of cp; the volume's extent count is printed after.
# Usage: [S=spillfs] [ROUNDS=2] [DIR=/var/tmp/rw] [READ_AHEADS="16M 64M"] [WRITER=cp|direct] read_waits.sh
set -u
S=${S:-build/bin/spillfs}; ROUNDS=${ROUNDS:-2}; D=${DIR:-/var/tmp/rw}; RAS=${READ_AHEADS:-16M 64M}; W=${WRITER:-cp}
umount -l $D/m 2>/dev/null; rm -rf $D; mkdir -p $D/m $D/host
$S mkfs $D/vol --size 8G >/dev/null || exit 1
head -c 2G /dev/urandom > $D/host/f
$S mount $D/vol $D/m >/dev/null || exit 1
if [ $W = direct ]; then dd if=$D/host/f of=$D/m/f bs=1M oflag=direct status=none; else cp $D/host/f $D/m/f; fi
sync; echo "written with $W: $($S stat --json $D/m | python3 -c 'import json,sys; print(json.load(sys.stdin)["extents"])') extents"
$S umount $D/m >/dev/null || exit 1
rate() { dd "$@" of=/dev/null bs=1M 2>&1 | tail -1 | awk '{print $(NF-1), $NF}'; }
for r in $(seq 1 $ROUNDS); do
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo "round $r host O_DIRECT: $(rate if=$D/host/f iflag=direct)"
  for ra in $RAS; do for mode in direct buffered; do
    $S mount $D/vol $D/m --read-ahead $ra >/dev/null || exit 1
    sync; echo 3 > /proc/sys/vm/drop_caches
    flag=""; [ $mode = direct ] && flag="iflag=direct"
    echo -n "round $r mount --read-ahead $ra $mode: $(rate if=$D/m/f $flag); "
    $S stat --json $D/m | python3 -c 'import json,sys; d=json.load(sys.stdin); print("ssd read %d MiB, fetched %d MiB, served %d MiB, %d reads waited %.0f ms (windows of %d KiB)" % (d["bytes_read_ssd"]>>20, d["read_ahead_bytes_fetched"]>>20, d["read_ahead_bytes_served"]>>20, d["read_ahead_waits"], d["read_ahead_wait_seconds"]*1e3, d["read_ahead_window_bytes"]>>10))'
    $S umount $D/m >/dev/null
  done; done
done
rm -rf $D
