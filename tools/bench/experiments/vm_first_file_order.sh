#!/usr/bin/env bash
# Ran on the CPU VM on 2026-12-04 (third session), daemon build/bin/spillfs at 404e8bf (RelWithDebInfo):
# is the first file written into a fresh mount slow whatever the handle (write-only = direct_io, or O_DIRECT)?
S=/work/main/build/bin/spillfs
D=/var/tmp/ordab; rm -rf $D; mkdir -p $D/m
$S mkfs $D/vol --size 8G >/dev/null || exit 1
head -c 1G /dev/urandom > $D/src
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b -v n=1073741824 'BEGIN{printf "%5.0f", n/(b-a)/1e6}'; }
for r in 1 2 3; do
  $S mount $D/vol $D/m >/dev/null
  a=$(mb dd if=$D/src of=$D/m/a bs=1M conv=fsync); b=$(mb dd if=$D/src of=$D/m/b bs=1M oflag=direct conv=fsync); rm $D/m/a $D/m/b
  $S umount $D/m >/dev/null; $S mount $D/vol $D/m >/dev/null
  c=$(mb dd if=$D/src of=$D/m/b bs=1M oflag=direct conv=fsync); d=$(mb dd if=$D/src of=$D/m/a bs=1M conv=fsync); rm $D/m/a $D/m/b
  $S umount $D/m >/dev/null
  echo "round $r: fresh mount, write-only first $a then O_DIRECT $b | fresh mount, O_DIRECT first $c then write-only $d (MB/s, + fsync)"
done
rm -rf $D
