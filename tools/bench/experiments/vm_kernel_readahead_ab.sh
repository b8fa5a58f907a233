#!/usr/bin/env bash
# Run on the 2-core CPU VM on 2026-12-04 (fourth session). Until then the mount wrote 8192 to its
# bdi's read_ahead_kb before FUSE's INIT, and INIT lowered it to max_readahead (1 MiB): the 8 MiB was
# never in effect. 1) spillfs-bench --sections seq, alternated, 3 rounds: "old" = 9c58896 (a copy of
# its Release build at /tmp/spillfs-old: 1 MiB in effect) against "new" = an intermediate build,
# never committed, that set 8 MiB once INIT was answered (/tmp/build-rel). 2) a buffered 1 GiB dd
# read through the mount with read_ahead_kb set by hand after INIT, 2 rounds per value (run by hand
# with the intermediate build; any of the builds serves, as the value is set after INIT).
set -u
B=/tmp/build-rel/bin/spillfs-bench
for r in 1 2 3; do for v in old new; do
  S=/tmp/build-rel/bin/spillfs; [ $v = old ] && S=/tmp/spillfs-old
  $B --spillfs $S --dir /var/tmp/sbx --sections seq --size 1G --repeat 1 2>&1 |
    grep -E "^  (raw io_uring O_DIRECT +read|spillfs mount (buffered|O_DIRECT) read)" | sed "s/^/round $r $v: /"
done; done
S=/tmp/spillfs-old; D=/tmp/rt
rm -rf $D && mkdir -p $D/m && $S mkfs $D/vol --size 4G >/dev/null && $S mount $D/vol $D/m >/dev/null
head -c 1G /dev/urandom > $D/m/f && sync && $S umount $D/m >/dev/null
for r in 1 2; do for ra in 128 1024 2048 4096 8192; do
  $S mount $D/vol $D/m >/dev/null; sleep 0.2
  dev=$(awk -v m=$D/m '$5==m{print $3}' /proc/self/mountinfo); echo $ra > /sys/class/bdi/$dev/read_ahead_kb
  sync; echo 3 > /proc/sys/vm/drop_caches
  t=$( { /usr/bin/time -f %e dd if=$D/m/f of=/dev/null bs=1M status=none; } 2>&1 )
  echo "round $r read_ahead_kb $ra: $(awk -v t=$t 'BEGIN{printf "%.0f MB/s", 1073.741824/t}')"
  $S umount $D/m >/dev/null
done; done
