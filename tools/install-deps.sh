#!/usr/bin/env bash
# Installs the Debian 12 packages spillfs builds and tests with (as root).
# Skips apt-get entirely when everything is already installed.
set -euo pipefail
packages=(
  build-essential cmake pkg-config git
  libfuse3-dev fuse3 liburing-dev librocksdb-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  attr xfsprogs
  help2man dpkg-dev  # the man page and the .deb (cpack, dpkg-shlibdeps)
  python3-pytest python3-numpy python3-torch
  clang-14 libclang-rt-14-dev  # the fuzz smoke run (tools/run-fuzz.sh, ctest label fuzz)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# FUSE needs its device node; containers sometimes lack it.
[ -e /dev/fuse ] || mknod -m 666 /dev/fuse c 10 229
