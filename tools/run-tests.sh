#!/usr/bin/env bash
# Installs what is missing (Debian's packages and the .venv of tools/install-deps.sh),
# builds, checks the thread-safety annotations (tools/check-thread-safety.sh:
# clang-14 -Wthread-safety -Werror over fs/), and runs the whole test suite with
# ctest; the Python suites run under .venv's torch 2.x. Ends with the skips counted
# by reason (tools/skip-summary.py), then ctest's summary again. Any failure fails
# the run.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
echo "== thread-safety check (tools/check-thread-safety.sh)"
tools/check-thread-safety.sh
echo "== tests (ctest)"
log=build/ctest-output.log
status=0
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@" 2>&1 | tee "$log" || status=$?
echo
python3 tools/skip-summary.py build "$log" || true
echo
echo "== ctest's summary (again)"
sed -n '/tests passed, /,$p' "$log"
exit "$status"
