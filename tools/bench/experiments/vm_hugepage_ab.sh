#!/usr/bin/env bash
# Ran on the CPU VM on 2026-12-04 (third session) with an experiment build of e6d28d8 (never committed):
# EXP_NOHUGE=1 skipped the madvise(MADV_HUGEPAGE) of the RAM-tier slabs (fs/src/buffer_pool.cc).
S=/work/main/build/bin/spillfs
D=/var/tmp/hugeab; rm -rf $D; mkdir -p $D/m
$S mkfs $D/vol --size 8G >/dev/null || exit 1
head -c 1G /dev/urandom > $D/src
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b -v n=1073741824 'BEGIN{printf "%5.0f", n/(b-a)/1e6}'; }
for r in 1 2 3; do for mode in huge nohuge; do
  E=""; [ $mode = nohuge ] && E="EXP_NOHUGE=1"
  env $E $S mount $D/vol $D/m >/dev/null
  mkdir -p $D/m/e && /usr/bin/python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  a=$(mb dd if=$D/src of=$D/m/e/a bs=1M); b=$(mb dd if=$D/src of=$D/m/e/b bs=1M); rm $D/m/e/a $D/m/e/b
  c=$(mb dd if=$D/src of=$D/m/c bs=1M conv=fsync); rm $D/m/c
  $S umount $D/m >/dev/null
  echo "round $r $mode: fresh mount, ephemeral ingest first file $a, second $b | then a file + fsync $c MB/s"
done; done
rm -rf $D
