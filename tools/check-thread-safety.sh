#!/usr/bin/env bash
# Checks Clang's thread-safety annotations (GUARDED_BY, REQUIRES, ...:
# common/include/spillfs/common/thread_annotations.h, mutex.h): builds the
# daemon's layers, the fs/ targets spillfs_store, spillfs_core,
# spillfs_inspect, spillfs_control and spillfs_fuse (and spillfs_kvindex under
# them), with clang and -Wthread-safety -Werror=thread-safety (CMake option
# SPILLFS_THREAD_SAFETY). Exits non-zero when a lock is missing where the
# annotations say it is needed. First it makes sure the check can fail at all:
# tests/thread_safety/unguarded_access.cc must be rejected. Only these
# libraries are built: a few minutes, less with ccache.
#
#   tools/check-thread-safety.sh
#
# Environment: SPILLFS_TSA_BUILD_DIR (default build-thread-safety), CLANG
# (default clang-14), CLANGXX (default clang++-14), JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SPILLFS_TSA_BUILD_DIR:-build-thread-safety}
clangxx=${CLANGXX:-clang++-14}
command -v "$clangxx" >/dev/null || { echo "check-thread-safety: no $clangxx (set CLANGXX)" >&2; exit 2; }
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety -Icommon/include)
if "$clangxx" "${flags[@]}" tests/thread_safety/unguarded_access.cc 2>/dev/null; then
  echo "check-thread-safety: $clangxx accepted tests/thread_safety/unguarded_access.cc: the check would catch nothing" >&2
  exit 1
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -DSPILLFS_THREAD_SAFETY=ON -DSPILLFS_BUILD_TESTS=OFF \
  -DCMAKE_C_COMPILER="${CLANG:-clang-14}" -DCMAKE_CXX_COMPILER="$clangxx" "${launcher[@]}" >/dev/null
cmake --build "$dir" -j"${JOBS:-$(nproc)}" \
  --target spillfs_store spillfs_core spillfs_inspect spillfs_control spillfs_fuse
echo "check-thread-safety: no thread-safety warnings in the fs/ layers"
