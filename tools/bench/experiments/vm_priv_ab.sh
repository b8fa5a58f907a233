#!/usr/bin/env bash
# Ran on the CPU VM on 2026-12-04 (third session): OLD = daemon of 8d6a2dd (RelWithDebInfo, built in a
# worktree), NEW = build/bin/spillfs, first at e4debdd+ (privilege lookups on every direct write), then
# at 214a67a (once per privilege epoch).
# VM: daemon of 8d6a2dd against e4debdd+ (per-write privilege lookups on write-only handles), alternated.
OLD=/tmp/wt8/build/bin/spillfs NEW=/work/main/build/bin/spillfs
D=/var/tmp/privab; rm -rf $D; mkdir -p $D/m
$NEW mkfs $D/vol --size 8G >/dev/null || exit 1
head -c 1G /dev/urandom > $D/src
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b -v n=1073741824 'BEGIN{printf "%5.0f", n/(b-a)/1e6}'; }
for r in 1 2 3 4; do for mode in old new; do
  S=$NEW; [ $mode = old ] && S=$OLD
  $S mount $D/vol $D/m --ram-tier 4G >/dev/null || exit 1
  mkdir -p $D/m/e && /usr/bin/python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  a=$(mb dd if=$D/src of=$D/m/e/w bs=1M); rm $D/m/e/w
  b=$(mb dd if=$D/src of=$D/m/e/w bs=1M); rm $D/m/e/w
  c=$(mb dd if=$D/src of=$D/m/e/w bs=64K); rm $D/m/e/w
  echo "round $r $mode: 1 GiB into an ephemeral dir, write-only handle: bs=1M $a, again $b, bs=64K $c MB/s"
  $S umount $D/m >/dev/null
done; done
rm -rf $D
