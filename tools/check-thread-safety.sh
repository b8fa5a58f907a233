#!/usr/bin/env bash
# Checks Clang's thread-safety annotations (GUARDED_BY, REQUIRES, ...:
# common/include/spillfs/common/thread_annotations.h, mutex.h) over the
# daemon's layers, every source under fs/ (store, core, inspect, control,
# fuse): clang -fsyntax-only with -Wthread-safety -Werror=thread-safety, each
# file as the build compiles it (CMake option SPILLFS_THREAD_SAFETY, in a
# build directory of its own that is only configured: nothing is built, so
# it takes a minute or two). Exits non-zero, naming each file and printing
# clang's diagnostics, where a lock is missing where the annotations say it
# is needed. First it makes sure the check can fail at all:
# tests/thread_safety/unguarded_access.cc must be rejected.
#
#   tools/check-thread-safety.sh        (tools/run-tests.sh runs it)
#
# Environment: SPILLFS_TSA_BUILD_DIR (default build-thread-safety), CLANG
# (default clang-14), CLANGXX (default clang++-14), JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SPILLFS_TSA_BUILD_DIR:-build-thread-safety}
clang=${CLANG:-clang-14}
clangxx=${CLANGXX:-clang++-14}
say() { echo "check-thread-safety: $*"; }
command -v "$clangxx" >/dev/null || {
  say "FAILED: no $clangxx (tools/install-deps.sh installs clang-14; or set CLANGXX)" >&2
  exit 2
}
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety -Icommon/include)
if "$clangxx" "${flags[@]}" tests/thread_safety/unguarded_access.cc 2>/dev/null; then
  say "FAILED: $clangxx accepted tests/thread_safety/unguarded_access.cc: the check would catch nothing" >&2
  exit 1
fi
mkdir -p "$dir"
if ! cmake -S . -B "$dir" -DSPILLFS_THREAD_SAFETY=ON -DSPILLFS_BUILD_TESTS=OFF -DSPILLFS_CUDA=OFF \
  -DCMAKE_C_COMPILER="$clang" -DCMAKE_CXX_COMPILER="$clangxx" >"$dir/configure.log" 2>&1; then
  cat "$dir/configure.log" >&2
  say "FAILED: cannot configure $dir" >&2
  exit 2
fi
# Each fs/ source as compile_commands.json compiles it, with -fsyntax-only
# in place of -c and no output file.
exec python3 - "$dir/compile_commands.json" "$PWD/fs/" "${JOBS:-$(nproc)}" <<'EOF'
import concurrent.futures, json, os, shlex, subprocess, sys

commands, prefix, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
entries = []
for entry in json.load(open(commands)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    if not path.startswith(prefix) or not path.endswith(".cc"):
        continue
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif arg == "-c":
            out.append("-fsyntax-only")
        else:
            out.append(arg)
    entries.append((os.path.relpath(path), entry["directory"], out))
if not entries:
    sys.exit("check-thread-safety: FAILED: no fs/ sources in " + commands)

def check(item):
    name, directory, args = item
    run = subprocess.run(args, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return name, run.returncode, run.stdout

failed = []
with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
    for name, rc, output in pool.map(check, sorted(entries)):
        if rc != 0:
            failed.append(name)
            sys.stdout.write(output)
            print("check-thread-safety: error in " + name, flush=True)
if failed:
    print("check-thread-safety: FAILED: %d of %d fs/ sources do not pass %s -Wthread-safety -Werror=thread-safety: %s"
          % (len(failed), len(entries), os.path.basename(entries[0][2][0]), " ".join(failed)))
    sys.exit(1)
print("check-thread-safety: OK: %d fs/ sources pass %s -Wthread-safety -Werror=thread-safety"
      % (len(entries), os.path.basename(entries[0][2][0])))
EOF
