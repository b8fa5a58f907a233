#!/usr/bin/env bash
# libspillfs_client's segment files with CUDA device segments on the GPU
# machine (tests/cuda/segment_gpu_test.cu), from binaries built on the
# development machine with CUDA for sm_90 and carried with the tree
# (tools/bench/device.md: bundle the libraries into DEVRUN/devlibs).
# From the repo root:
#   clients/run_device_tests.sh        # logs under $OUT/clients (or ./clients-device-run)
# Environment: DEVRUN (default build: its bin/, lib/ and devlibs/).
# Exit status: non-zero when a test failed or was skipped (a skip there means
# the device was not seen), or when the library needs libcudart.
set -uo pipefail
devrun=${DEVRUN:-build}
out=${OUT:-$PWD/clients-device-run}/clients
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$devrun/devlibs:$PWD/$devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
lib=$devrun/lib/libspillfs_client.so
ldd "$lib" | tee "$out/ldd.txt"
if grep -q cudart "$out/ldd.txt"; then echo "FAIL: libspillfs_client.so needs libcudart"; status=1; fi
echo "== segment_gpu_test"
"$devrun/bin/segment_gpu_test" --gtest_output="xml:$out/segment_gpu_test.xml" >"$out/segment_gpu_test.log" 2>&1 ||
  status=1
grep -E "^\[ +(OK|PASSED|SKIPPED|FAILED) +\]|Failure$" "$out/segment_gpu_test.log"
if grep -q "SKIPPED \]" "$out/segment_gpu_test.log"; then echo "FAIL: GPU tests skipped on the GPU machine"; status=1; fi
echo "== results in $out (status $status)"
exit $status
