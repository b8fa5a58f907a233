#!/usr/bin/env bash
# H100, eleventh session (2026-12-05): reads of dedup's 256 KiB blobs as merged 1 MiB requests
# (baf2893) against the daemon before it (.devrun/bin/spillfs-before, 6f1ba62), alternated, 2 rounds:
# read_waits.sh (dd O_DIRECT and buffered through the mount, the read-ahead's waits) and the bench's
# seq section (2 GiB). From the repo root with Release binaries in .devrun/; outputs to $OUT.
set -u
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
O=${OUT:-out}; mkdir -p /root/sb $O
for r in 1 2; do for b in before after; do
  bin=.devrun/bin/spillfs; [ $b = before ] && bin=.devrun/bin/spillfs-before
  echo "== round $r $b"; S=$bin ROUNDS=1 DIR=/root/rw READ_AHEADS=16M bash tools/bench/experiments/read_waits.sh 2>&1
  .devrun/bin/spillfs-bench --spillfs $bin --dir /root/sb --sections seq --size 2G --repeat 1 > $O/seq_${r}_$b.txt 2>&1
  grep -E "^seq " $O/seq_${r}_$b.txt
done; done
