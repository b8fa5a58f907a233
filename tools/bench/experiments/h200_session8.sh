#!/usr/bin/env bash
# H200, for the first session that is lent a device after the eighth (2026-12-05), from the repo
# root with Release binaries in .devrun/ (tools/bench/README.md has the recipe):
#   .devrun/bin/spillfs, spillfs-bench, libspillfs_client.so  at the code to measure
#   .devrun/bin/spillfs-old                                   the daemon at b1f4c5a, before the eighth
#                                                             session's flush pipeline (a worktree:
#                                                             git worktree add /tmp/old b1f4c5a)
# Parts (each fits one 600 s call):
#   whole: the whole bench (the fifth session's command, --repeat 2). The mount write rows now note
#          the daemon's data syncs and the time spent in them (data_sync_seconds).
#   ab:    seq only, 2 GiB, alternated old / new daemon, 3 rounds: what four flush batches
#          in flight and the streamed background flush buy on NVMe, where a sync is a cache flush
#          of the device and not the host's write-back of a virtual disk (7-99 ms on the CPU VM).
# Full outputs go to $OUT (or ./out).
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=.devrun/bin/spillfs-bench; O=${OUT:-out}; mkdir -p /root/sb $O
echo "disk: $(lsblk -dno NAME,SIZE,ROTA 2>/dev/null | tr '\n' ';') nproc $(nproc)"
case "${1:-whole}" in
whole)
  exec bash tools/bench/experiments/h200_session5.sh whole ;;  # the same command
ab)
  for r in 1 2 3; do for mode in old new; do
    bin=.devrun/bin/spillfs; [ $mode = old ] && bin=.devrun/bin/spillfs-old
    $B --spillfs $bin --dir /root/sb --sections seq --size 2G --repeat 1 > $O/ab_${r}_$mode.txt 2>&1
    grep -E "^ +(raw|spillfs mount|spillfs direct)" $O/ab_${r}_$mode.txt | grep write | sed "s/^/round $r $mode: /"
    grep -E "^seq .*spillfs (mount|direct).*write" $O/ab_${r}_$mode.txt | sed "s/^/round $r $mode: /"
  done; done ;;
esac
