#!/usr/bin/env bash
# Configures and builds spillfs into build/ (binaries in build/bin, libraries in build/lib).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" ${CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
