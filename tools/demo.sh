#!/usr/bin/env bash
# Installs what is missing, builds, makes the default volume (if absent),
# mounts it and shows the main job: spill a file, read it back, list, usage.
#   VOLUME (default /var/lib/spillfs/default), MOUNTPOINT (default /mnt/spill), SIZE (default 8G)
set -euo pipefail
cd "$(dirname "$0")/.."
VOLUME=${VOLUME:-/var/lib/spillfs/default}
MOUNTPOINT=${MOUNTPOINT:-/mnt/spill}
SIZE=${SIZE:-8G}
tools/install-deps.sh
tools/build.sh >/dev/null
spillfs=build/bin/spillfs
[ -e "$VOLUME/index/CURRENT" ] || $spillfs mkfs "$VOLUME" --size "$SIZE"
mkdir -p "$MOUNTPOINT"
grep -q " $MOUNTPOINT fuse.spillfs " /proc/self/mountinfo || $spillfs mount "$VOLUME" "$MOUNTPOINT"
set -x
mkdir -p "$MOUNTPOINT/demo"
head -c 256M /dev/urandom > /tmp/spillfs-demo.bin
dd if=/tmp/spillfs-demo.bin of="$MOUNTPOINT/demo/activation-0.bin" bs=1M conv=fsync status=progress
cmp /tmp/spillfs-demo.bin "$MOUNTPOINT/demo/activation-0.bin" && echo "read back: identical"
ls -l "$MOUNTPOINT/demo"
df -h "$MOUNTPOINT"
rm -f /tmp/spillfs-demo.bin "$MOUNTPOINT/demo/activation-0.bin"
set +x
echo "spillfs is mounted on $MOUNTPOINT; unmount with: $spillfs umount $MOUNTPOINT"
