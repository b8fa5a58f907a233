#!/usr/bin/env bash
# Writes spillfs(8) with help2man from the command's own help: the top-level
# --help and --version, then one section per subcommand (its --help) and the
# hand-written sections of spillfs.h2m (mount helper, files, examples).
#   make-manpage.sh SPILLFS_BINARY OUTPUT
set -euo pipefail
bin=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
include=$(mktemp)
trap 'rm -f "$include"' EXIT
{
  cat "$here/spillfs.h2m"
  echo "[COMMANDS]"
  for cmd in mkfs mount umount fsck stat ls du top; do
    echo ".SS \"spillfs $cmd\""
    echo ".nf"
    # Usage lines name the binary by its build path: say "spillfs" instead.
    "$bin" "$cmd" --help | sed -e "s#^Usage: [^ ]*spillfs#Usage: spillfs#" -e 's/\\/\\\\/g' -e 's/^\./\\\&./'
    echo ".fi"
  done
} >"$include"
mkdir -p "$(dirname "$out")"
help2man --section=8 --no-info --no-discard-stderr \
  --name="make, mount and inspect spillfs volumes" \
  --include="$include" --output="$out" "$bin"
