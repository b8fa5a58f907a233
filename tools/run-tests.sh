#!/usr/bin/env bash
# Installs what is missing, builds, checks the thread-safety annotations
# (tools/check-thread-safety.sh: clang-14 -Wthread-safety -Werror over fs/),
# and runs the whole test suite with ctest. Any failure fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
echo "== thread-safety check (tools/check-thread-safety.sh)"
tools/check-thread-safety.sh
echo "== tests (ctest)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
