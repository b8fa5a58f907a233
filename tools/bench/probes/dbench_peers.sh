#!/usr/bin/env bash
# dbench (its default client.txt load) on the host filesystem, through libfuse's
# passthrough_hp over the host filesystem, and through the mount, one after the other,
# each in a fresh directory; prints dbench's throughput line for each. passthrough_hp is
# built from the installed libfuse's own examples (3.14.0 on Debian 12):
#   curl -sSfLO http://deb.debian.org/debian/pool/main/f/fuse3/fuse3_3.14.0.orig.tar.xz
#   tar xf fuse3_3.14.0.orig.tar.xz
#   g++ -O2 -std=c++17 fuse-3.14.0/example/passthrough_hp.cc -I/usr/include/fuse3 -lfuse3 -lpthread -o /tmp/passthrough_hp
# Needs root (mounts) and dbench (apt-get install dbench).
# Usage: [S=build/bin/spillfs] [PTHP=/tmp/passthrough_hp] [DIR=/var/tmp/dbench] [CLIENTS=8] [SECONDS_EACH=30]
#        dbench_peers.sh
set -u
S=${S:-build/bin/spillfs}; PTHP=${PTHP:-/tmp/passthrough_hp}; D=${DIR:-/var/tmp/dbench}
CLIENTS=${CLIENTS:-8}; T=${SECONDS_EACH:-30}
umount -l $D/m $D/pt 2>/dev/null; rm -rf $D; mkdir -p $D/host $D/m $D/pt $D/ptsrc
run() {  # label dir
  local out; out=$(dbench -D "$2" -t "$T" "$CLIENTS" 2>&1 | grep -E "^Throughput")
  echo "$1: ${out:-dbench failed}"
}
run "host fs" $D/host
if [ -x "$PTHP" ]; then
  "$PTHP" $D/ptsrc $D/pt & sleep 1
  run "passthrough_hp" $D/pt
  umount $D/pt; wait
else
  echo "passthrough_hp: not built at $PTHP (see the comment at the top)"
fi
$S mkfs $D/vol --size 8G >/dev/null || exit 1
$S mount $D/vol $D/m >/dev/null || exit 1
run "spillfs ($S)" $D/m
$S umount $D/m >/dev/null
