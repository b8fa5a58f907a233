#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 from the repo root, with Release binaries in .devrun/
# (ignored by git; tools/bench/README.md has the build-and-bundle recipe): .devrun/bin holds
# the daemon of 9d7c677 ("old"), .devrun/new that of b124dae ("new"), .devrun/devlibs the
# bundled libraries. Outputs: tools/bench/results/h200_2026-12-04_*; figures in RESULTS.md.
# Final device run: read-path A/B (old vs new daemon, alternated), activation A/B, whole bench at the new code.
set -u
cd "$(dirname "$0")/../../.."  # the repo root
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
OLD=$PWD/.devrun/bin/spillfs NEW=$PWD/.devrun/new/spillfs B=$PWD/.devrun/new/spillfs-bench
run() { $B --dir /root/sb --python python3 "$@"; }
for d in old new old new; do
  S=$OLD; [ $d = new ] && S=$NEW
  echo "=== seq $d"; run --spillfs $S --size 2G --sections seq --json-out $OUT/ab_seq_${d}_$RANDOM.json | grep -E "^seq" | grep -E "read|mount"
done
for d in old new old new; do
  S=$OLD; [ $d = new ] && S=$NEW
  echo "=== activation $d"; run --spillfs $S --files 8 --file-size 256M --sections activation | grep -E "^activation"
done
echo "=== whole bench, new"
run --spillfs $NEW --size 2G --files 8 --file-size 256M --rand-size 4G --rand-seconds 2 --json-out $OUT/bench_new.json | tail -40
