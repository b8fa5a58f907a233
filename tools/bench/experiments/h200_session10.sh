#!/usr/bin/env bash
# H200, tenth session (2026-12-05), from the repo root with Release binaries in .devrun/
# (tools/bench/README.md has the recipe):
#   .devrun/bin/spillfs, spillfs-bench, libspillfs_client.so  the code to measure (FuseDeviceLoop)
#   .devrun/bin/spillfs-base                                  the daemon at 3e517f9: libfuse's own
#                                                             loop (fuse_session_loop_mt)
# Part loop: seq + random sections, 2 GiB / 4 GiB, alternated base / new, 2 rounds: does the
#   daemon's own /dev/fuse loop (blocking reads on a clone per worker, as libfuse's) cost anything?
# Part rand: the random section alone, alternated base / new, 3 rounds (the pool that grows).
# Part big: experiments/large_requests_ab.sh, --max-request 1M against 4M (read-ahead 4 MiB), with
#   torch_bench.py, 3 rounds.
# Part tload: experiments/torch_load_probe.py on ext4 and the mount (default options), 1 GiB CUDA
#   tensor, 3 rounds: how much of torch.load's time is its one large read, on each.
# Full outputs go to $OUT (or ./out).
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=.devrun/bin/spillfs-bench; O=${OUT:-out}; mkdir -p /root/sb $O
case "${1:-loop}" in
loop)
  for r in 1 2; do for mode in base new; do
    bin=.devrun/bin/spillfs; [ $mode = base ] && bin=.devrun/bin/spillfs-base
    $B --spillfs $bin --dir /root/sb --sections seq,random --size 2G --rand-size 4G --rand-seconds 3 --repeat 1 \
      > $O/loop_${r}_$mode.txt 2>&1
    grep -E "^(seq|random) .*(raw|spillfs mount)" $O/loop_${r}_$mode.txt | sed "s/^/round $r $mode: /"
  done; done ;;
rand)
  for r in $(seq 1 ${RAND_ROUNDS:-3}); do for mode in base new; do
    bin=.devrun/bin/spillfs; [ $mode = base ] && bin=.devrun/bin/spillfs-base
    $B --spillfs $bin --dir /root/sb --sections random --rand-size 4G --rand-seconds 3 --repeat 1 \
      > $O/rand_${r}_$mode.txt 2>&1
    grep -E "^random .*(raw|spillfs mount)" $O/rand_${r}_$mode.txt | sed "s/^/round $r $mode: /"
  done; done ;;
big)
  S=.devrun/bin/spillfs PY=python3 ROUNDS=${ROUNDS:-3} DIR=/root/lrq CONFIGS="1M:1024 4M:4096" \
    bash tools/bench/experiments/large_requests_ab.sh ;;
tload)
  umount -l /root/pm 2>/dev/null; rm -rf /root/pv /root/hd; mkdir -p /root/pm /root/hd
  .devrun/bin/spillfs mkfs /root/pv --size 8G >/dev/null && .devrun/bin/spillfs mount /root/pv /root/pm || exit 1
  python3 tools/bench/experiments/torch_load_probe.py /root/hd /root/pm --size 1G --rounds 3
  .devrun/bin/spillfs umount /root/pm; rm -rf /root/pv /root/hd ;;
esac
