#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan +
# coverage, CMake option SPILLFS_FUZZ) and runs each for a fixed time from its
# seed corpus in tests/fuzz/corpus/<target>/ and the inputs that once made it
# fail, tests/fuzz/repro/<target>/ (all run at start). Exits non-zero when a build
# fails or a target finds a crash, a leak, a sanitizer report or a broken
# property; the input that did it is left in BUILD_DIR/artifacts/.
#
#   tools/run-fuzz.sh [-t SECONDS] [--build-only | --no-build] [TARGET...]
#
# -t SECONDS   time per target (default 20)
# TARGET       records_fuzzer coding_fuzzer inspector_control_fuzzer
#              control_plane_fuzzer (default: all)
# Environment: SPILLFS_FUZZ_BUILD_DIR (default build-fuzz), CLANG (default
# clang-14), CLANGXX (default clang++-14), SPILLFS_FUZZ_SEED (libFuzzer
# -seed, default 1: a fixed seed), SPILLFS_FUZZ_ARGS (more libFuzzer flags,
# e.g. -jobs=2). How far a timed run gets still depends on the machine.
#
# New inputs found during a run go to BUILD_DIR/corpus/<target>/ (kept between
# runs, never into the seed corpus); a run starts from both.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=20
build=1
run=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) seconds="$2"; shift 2 ;;
    --build-only) run=0; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "run-fuzz: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(records_fuzzer coding_fuzzer inspector_control_fuzzer control_plane_fuzzer)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
dir=${SPILLFS_FUZZ_BUILD_DIR:-build-fuzz}
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
cc=${CLANG:-clang-14}
cxx=${CLANGXX:-clang++-14}

if [ "$build" = 1 ]; then
  command -v "$cxx" >/dev/null || { echo "run-fuzz: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
  start=$(date +%s)
  # -O0 and line tables only: the quickest build (the JSON-heavy sources
  # take 20 s each at -O1 on one core), enough for stacks with file:line.
  generator=()
  [ -f "$dir/CMakeCache.txt" ] || ! command -v ninja >/dev/null || generator=(-G Ninja)
  flags="-O0 -gline-tables-only"
  cmake -S . -B "$dir" "${generator[@]}" -DSPILLFS_FUZZ=ON -DSPILLFS_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Fuzz \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_C_FLAGS_FUZZ="$flags" -DCMAKE_CXX_FLAGS_FUZZ="$flags" >/dev/null
  cmake --build "$dir" --target "${targets[@]}" -j"$(nproc)" >"$dir/build.log" 2>&1 || {
    tail -50 "$dir/build.log" >&2
    echo "run-fuzz: build failed (log: $dir/build.log)" >&2
    exit 2
  }
  echo "run-fuzz: built ${targets[*]} in $(($(date +%s) - start)) s ($dir)"
fi
[ "$run" = 1 ] || exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$dir/artifacts"
failed=()
summary=()
for t in "${targets[@]}"; do
  bin="$dir/bin/$t"
  [ -x "$bin" ] || { echo "run-fuzz: $bin missing (build first)" >&2; exit 2; }
  seeds="$root/tests/fuzz/corpus/$t"
  work="$dir/corpus/$t"
  mkdir -p "$work"
  # Inputs that once failed (tests/fuzz/repro/<target>/) run first, every time.
  repro=()
  [ -d "$root/tests/fuzz/repro/$t" ] && repro=("$root/tests/fuzz/repro/$t")
  dict=()
  case "$t" in inspector_control_fuzzer|control_plane_fuzzer) dict=(-dict="$root/tests/fuzz/control.dict") ;; esac
  log="$dir/$t.log"
  echo "run-fuzz: $t for $seconds s"
  rc=0
  # ${SPILLFS_FUZZ_ARGS} is split on purpose: several flags.
  # shellcheck disable=SC2086
  "$bin" -seed="${SPILLFS_FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$t-" "${dict[@]}" ${SPILLFS_FUZZ_ARGS:-} "$work" "$seeds" "${repro[@]}" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$( (grep -oE 'cov: [0-9]+' "$log" || true) | tail -1 | cut -d' ' -f2)
  units=$(find "$work" -type f | wc -l)
  line=$(printf '%-26s %10s execs %8s/s  cov %6s  corpus %5s  rc %s' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "$units" "$rc")
  summary+=("$line")
  if [ "$rc" != 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|property failed' "$log"; then
    failed+=("$t")
    echo "run-fuzz: $t FAILED (rc $rc); log $log; the input is in $dir/artifacts/" >&2
    { grep -nE -B2 -A30 'ERROR: |runtime error:|property failed|terminate called' "$log" || tail -40 "$log"; } |
      cut -c1-300 | head -80 >&2
  fi
done
echo "run-fuzz: summary ($seconds s per target)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "run-fuzz: no crash, leak or sanitizer report"
