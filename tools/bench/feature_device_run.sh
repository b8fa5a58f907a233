#!/usr/bin/env bash
# spillfs.gnn.FeatureStore on the GPU machine: the GPU cache's C++ test, the
# Python tests (CUDA and PyG cases run there; a skip of them is a failure),
# then the feature benchmark (tools/bench/feature_bench.py), from binaries
# built on the development machine (Release, CUDA for sm_90) and carried in
# $DEVRUN (bin/, lib/, devlibs/: ../shared/device/README.md). From the repo root:
#   tools/bench/feature_device_run.sh       # results under $OUT/feature (or ./feature-device-run)
# Environment: DEVRUN (default .devrun), BENCH (0: no benchmark), BENCH_DIR
# (default /root/featbench: the generated graph and table stay there), BENCH_ARGS
# (default: 2^23 nodes, 134 M edges, a 4 GiB float32 table of 128 columns in a
# 2.5 GiB cgroup, 512 MiB of GPU cache, 12 s a contender: about 4 minutes).
set -uo pipefail
devrun=${DEVRUN:-.devrun}
out=${OUT:-$PWD/feature-device-run}/feature
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$devrun/devlibs:$PWD/$devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SPILLFS_CLIENT_LIB=$PWD/$devrun/lib/libspillfs_client.so
export SPILLFS_BIN=$PWD/$devrun/bin/spillfs
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

echo "== feature_cache_gpu_test"
"$devrun/bin/feature_cache_gpu_test" --gtest_output="xml:$out/feature_cache_gpu_test.xml" \
  >"$out/feature_cache_gpu_test.log" 2>&1 || status=1
grep -E "^\[ +(OK|PASSED|SKIPPED|FAILED) +\]|Failure$" "$out/feature_cache_gpu_test.log"
if grep -q "SKIPPED \] MissesFill\|SKIPPED \] RowBytes" "$out/feature_cache_gpu_test.log"; then
  echo "FAIL: GPU tests skipped on the GPU machine"; status=1
fi

echo "== pytest test_feature_store.py test_feature_store_pyg.py"
python3 -m pytest -q -rs -p no:cacheprovider --junitxml="$out/pytest.xml" \
  tests/python/test_feature_store.py tests/python/test_feature_store_pyg.py >"$out/pytest.log" 2>&1 || status=1
tail -n 25 "$out/pytest.log"
if grep -E "SKIPPED.*(no CUDA device|no PyG)" "$out/pytest.log"; then
  echo "FAIL: CUDA or PyG cases skipped on the GPU machine"; status=1
fi

if [ "${BENCH:-1}" != 0 ]; then
  echo "== feature_bench.py ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  python3 tools/bench/feature_bench.py --dir "${BENCH_DIR:-/root/featbench}" \
    ${BENCH_ARGS:---scale 23 --width 128 --gpu-cache 512M --host-bytes 512M --memory-max 2560M --seconds 12 --batches 20} \
    --json-out "$out/feature_bench.json" 2>&1 | tee "$out/feature_bench.log" || status=1
fi
echo "== results in $out (status $status)"
exit $status
