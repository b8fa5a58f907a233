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
# mountinfo: field 5 is the mount point, the type follows " - ".
mounted() { awk -v m="$MOUNTPOINT" '$5 == m && / - fuse\.spillfs / { f = 1 } END { exit !f }' /proc/self/mountinfo; }
if mounted && ! stat "$MOUNTPOINT" >/dev/null 2>&1; then
  echo "$MOUNTPOINT: a spillfs mount whose daemon is gone (killed?): detaching it" >&2
  umount -l "$MOUNTPOINT"
fi
mkdir -p "$MOUNTPOINT"
mounted || $spillfs mount "$VOLUME" "$MOUNTPOINT"
# The trainer's side: checkpoints saved with spillfs.save into the mount,
# read back by torch.load, and what the volume shared (tools/demo.py), under
# the environment tools/install-deps.sh made (.venv: torch 2.x, spillfs installed).
# PYTHONPATH: a script's own folder comes first on sys.path, and tools/spillfs/
# (the CLI's sources) would be imported as a namespace package named spillfs
# ahead of the editable install's finder.
PYTHONPATH=clients/python SPILLFS_CLIENT_LIB=build/lib/libspillfs_client.so \
  "${SPILLFS_VENV:-.venv}/bin/python" tools/demo.py "$MOUNTPOINT" --spillfs "$spillfs"
echo
$spillfs stat "$MOUNTPOINT"
echo "spillfs is mounted on $MOUNTPOINT; unmount with: $spillfs umount $MOUNTPOINT"
