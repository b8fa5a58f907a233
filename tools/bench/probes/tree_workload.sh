#!/usr/bin/env bash
# The tree workload of issue 40 on the host filesystem and through the mount, side by
# side: untar of /usr/include (about 8,200 files, 135 MB) then `sync`, `ls -lR` cold
# (remounted, page cache dropped), read-all cold (`tar c | cat`), `rm -rf`; seconds each,
# one run. BINS lists spillfs binaries to compare (e.g. a build of main and one of a
# change), each on a fresh volume. Needs root (mounts, drop_caches).
# Usage: [BINS="build/bin/spillfs"] [DIR=/var/tmp/tree] [SRC=/usr/include] tree_workload.sh
set -u
BINS=${BINS:-build/bin/spillfs}; D=${DIR:-/var/tmp/tree}; SRC=${SRC:-/usr/include}
name=$(basename "$SRC")
umount -l $D/m 2>/dev/null; rm -rf $D; mkdir -p $D/m $D/host
tar cf $D/tree.tar -C "$(dirname "$SRC")" "$name" || exit 1
secs() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; printf "%.2f" "$(echo "$(date +%s.%N) - $s" | bc)"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
u=$(secs sh -c "tar xf $D/tree.tar -C $D/host && sync"); cold
l=$(secs ls -lR $D/host/$name); cold
r=$(secs sh -c "tar cf - -C $D/host $name | cat >/dev/null")
x=$(secs rm -rf $D/host/$name)
echo "host fs: untar+sync $u s, ls -lR $l s, read-all $r s, rm -rf $x s"
for S in $BINS; do
  rm -rf $D/vol; $S mkfs $D/vol --size 8G >/dev/null || exit 1
  $S mount $D/vol $D/m >/dev/null || exit 1
  u=$(secs sh -c "tar xf $D/tree.tar -C $D/m && sync")
  $S umount $D/m >/dev/null; cold; $S mount $D/vol $D/m >/dev/null
  l=$(secs ls -lR $D/m/$name)
  $S umount $D/m >/dev/null; cold; $S mount $D/vol $D/m >/dev/null
  r=$(secs sh -c "tar cf - -C $D/m $name | cat >/dev/null")
  x=$(secs rm -rf $D/m/$name)
  $S umount $D/m >/dev/null
  echo "$S: untar+sync $u s, ls -lR $l s, read-all $r s, rm -rf $x s"
done
