#!/usr/bin/env bash
# cuda/ on the GPU machine: the CPU and GPU test binaries and the bench, from
# binaries built on the development machine (Release, CUDA for sm_90) and
# carried in .devrun/ (bin/ and the bundled libraries in devlibs/, see
# tools/bench/device.md). From the repo root:
#   cuda/run_device_tests.sh            # logs and results under $OUT/cuda (or ./cuda-device-run)
# Environment: DEVRUN (default .devrun), BENCH_ARGS (e.g. "--bytes 268435456").
# Exit status: non-zero when a test binary failed or a GPU test was skipped
# (a skip there means the device was not seen).
set -uo pipefail
devrun=${DEVRUN:-.devrun}
bin=$devrun/bin
out=${OUT:-$PWD/cuda-device-run}/cuda
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$devrun/devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for probe in "$bin/libcuda_probe.so" "$devrun/devlibs/libcuda_probe.so"; do
  [ -f "$probe" ] && export CUDA_PROBE_LIBRARY=$PWD/$probe
done

status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== what the binaries need (no libcudart: the runtime is linked in)"
ldd "$bin/cuda_gpu_test" "$bin/cuda_hash_bench" | tee "$out/ldd.txt"
if grep -q cudart "$out/ldd.txt"; then echo "FAIL: a binary needs libcudart"; status=1; fi

echo "== cuda_test (the CPU half; PinnedPool pinned here)"
"$bin/cuda_test" --gtest_output="xml:$out/cuda_test.xml" >"$out/cuda_test.log" 2>&1 || status=1
tail -n 3 "$out/cuda_test.log"

echo "== cuda_gpu_test"
"$bin/cuda_gpu_test" --gtest_output="xml:$out/cuda_gpu_test.xml" >"$out/cuda_gpu_test.log" 2>&1 || status=1
grep -E "^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ test|^\[  FAILED  \] [A-Z]|Failure$" "$out/cuda_gpu_test.log"
if grep -q "SKIPPED \]" "$out/cuda_gpu_test.log"; then echo "FAIL: GPU tests skipped on the GPU machine"; status=1; fi

echo "== cuda_hash_bench ${BENCH_ARGS:-}"
# shellcheck disable=SC2086
"$bin/cuda_hash_bench" ${BENCH_ARGS:-} | tee "$out/hash_bench.jsonl" || status=1

echo "== results in $out (status $status)"
exit $status
