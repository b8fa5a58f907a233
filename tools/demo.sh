#!/usr/bin/env bash
# Installs what is missing, builds, makes the default volume (if absent),
# mounts it and shows the main job (tools/demo.py): what a trainer gets.
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
# The trainer's side: checkpoints saved with spillfs.save into the mount,
# read back by torch.load, and what the volume shared (tools/demo.py).
PYTHONPATH=clients/python SPILLFS_CLIENT_LIB=build/lib/libspillfs_client.so \
  /usr/bin/python3 tools/demo.py "$MOUNTPOINT" --spillfs "$spillfs"
echo
$spillfs stat "$MOUNTPOINT"
echo "spillfs is mounted on $MOUNTPOINT; unmount with: $spillfs umount $MOUNTPOINT"
