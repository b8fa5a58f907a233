#!/usr/bin/env bash
# The GPU machine's runs that the code on main has not had yet, in parts that
# each fit one device call (10 minutes): every CUDA path written since the
# last device session, and the figures the open issues ask for. Results and
# logs under $OUT/<part>. From the repo root, with DEVRUN (default .devrun)
# built as tools/bench/device.md says (Release, CUDA sm_90, libraries
# bundled into DEVRUN/devlibs) from this commit:
#
#   tools/bench/pending_gpu_runs.sh tests        # CUDA cases of the Python suites (~5 min)
#   tools/bench/pending_gpu_runs.sh memio        # issue 41.1/41.5: memory I/O and GPU hashing (~3 min)
#   tools/bench/pending_gpu_runs.sh mount        # issue 40: meta-bench 8 threads, cold reads, torch.load (~8 min)
#   tools/bench/pending_gpu_runs.sh checkpoints  # issue 42: dcp_bench, background_save_bench (~8 min)
#   tools/bench/pending_gpu_runs.sh ablation     # issue 41.3: the feature cache's ablation (~9 min)
#
# Each part's exit status is non-zero when one of its commands failed; the
# parts are independent (run those the session has time for, in this order).
set -uo pipefail
part=${1:?usage: pending_gpu_runs.sh tests|memio|mount|checkpoints|ablation}
case "$part" in
  tests | memio | mount | checkpoints | ablation) ;;
  *)
    echo "pending_gpu_runs.sh: unknown part '$part' (tests, memio, mount, checkpoints or ablation)" >&2
    exit 2
    ;;
esac
devrun=${DEVRUN:-.devrun}
out=${OUT:-$PWD/gpu-run}/$part
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$devrun/devlibs:$PWD/$devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SPILLFS_BIN=$PWD/$devrun/bin/spillfs SPILLFS_CLIENT_LIB=$PWD/$devrun/lib/libspillfs_client.so
export PYTHONPATH=$PWD/clients/python${PYTHONPATH:+:$PYTHONPATH}
status=0
step() {  # name, command...: runs it with its output in $out/name.log, the tail shown
  local name=$1
  shift
  echo "== $name: $*"
  "$@" >"$out/$name.log" 2>&1 || { echo "FAILED: $name (exit $?)"; status=1; }
  tail -n 15 "$out/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
case "$part" in
  tests)
    # background saves' CUDA snapshot, DCP (gloo ranks; the writer's CUDA tensors),
    # safetensors on CUDA, MixedPolicy's CUDA marks (52321e6), the crash tests
    step pytest python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_background_save.py \
      tests/python/test_dcp.py tests/python/test_safetensors.py tests/python/test_checkpoint_crash.py \
      tests/python/test_activation_offload.py -k "cuda or CUDA or mixed or background or dcp or crash"
    # GPU hashing of direct-path writes (41.1) and a non-root CUDA save through memory I/O (41.5)
    step pytest_cuda python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda_serialization.py \
      tests/python/test_serialization.py -k "cuda or not_root"
    step segment_gpu env DEVRUN="$devrun" OUT="$out" clients/run_device_tests.sh
    ;;
  memio)
    step memio python3 tools/bench/memory_io_bench.py --dir /var/tmp/miobench --spillfs "$devrun/bin/spillfs" \
      --json-out "$out/memory_io.json"
    ;;
  mount)
    # the record cache and the kernel's listing cache with 8 threads; cold reads and
    # torch.load against the raw disk and ext4 (issue 40's H100 targets)
    step meta "$devrun/bin/spillfs-meta-bench" --spillfs "$PWD/$devrun/bin/spillfs" --dir /root/meta --threads 8 \
      --json "$out/meta.json"
    step bench "$devrun/bin/spillfs-bench" --spillfs "$devrun/bin/spillfs" --dir /root/sb --python python3 \
      --torch-script tools/bench/torch_bench.py --size 2G --files 8 --file-size 256M --rand-size 4G \
      --rand-seconds 2 --repeat 2 --json-out "$out/whole.json"
    ;;
  checkpoints)
    step dcp python3 tools/bench/dcp_bench.py --dir /root/dcpbench --spillfs "$devrun/bin/spillfs" \
      --json-out "$out/dcp.json"
    step background python3 tools/bench/background_save_bench.py --dir /root/bgbench --spillfs "$devrun/bin/spillfs" \
      --json-out "$out/background_save.json"
    ;;
  ablation)
    step feature python3 tools/bench/feature_bench.py --dir /root/featbench --parts gather --seconds 25 \
      --budget-seconds 560 --contenders raw,fs-hybrid,fs-hybrid-novictim,fs-hybrid-nohot,fs-hybrid-nowindow,fs-hybrid-nohot-novictim,fs-hybrid-novictim-nowindow,fs-hybrid-nohot-nowindow,fs-hybrid-nohot-novictim-nowindow,fs-lru,fs-lru-novictim,fs-lru-nohot-novictim-nowindow \
      --json-out "$out/ablation.json" --png-out "$out/ablation.png"
    ;;
esac
echo "== $part: results in $out (status $status)"
exit $status
