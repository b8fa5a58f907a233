#!/usr/bin/env bash
# Copies into DEST the shared libraries that the given binaries and .so files
# load (as ldd resolves them here), so that they run on a machine that lacks
# them (tools/bench/device.md): libfuse3, liburing, librocksdb and what those
# pull in, and this compiler's libstdc++ (the other machine's may be older).
# Left out: the C runtime and the loader, which every Linux host has in a
# compatible version, and the GPU driver's libraries, which must be the
# host's own.
#
#   tools/bench/bundle-libs.sh build/devlibs build/bin/spillfs build/lib/libspillfs_client.so
#
# Then, on the other machine: LD_LIBRARY_PATH=$PWD/build/devlibs.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DEST FILE..." >&2
  exit 2
fi
dest=$1
shift
mkdir -p "$dest"
host_own='/(ld-linux[^/]*|libc|libm|libdl|libpthread|librt|libcuda|libnvidia-[^/]*)\.so'
libs=$(for f in "$@"; do ldd "$f"; done | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p' | grep -vE "$host_own" | sort -u)
libs+=$'\n'$(${CXX:-g++} -print-file-name=libstdc++.so.6)
while read -r lib; do
  [ -n "$lib" ] && cp -L --update "$lib" "$dest/"
done <<<"$libs"
du -sh "$dest"
ls "$dest"
