#!/usr/bin/env bash
# H200, 2026-12-05 (fifth session), from the repo root with Release binaries in .devrun/
# (tools/bench/README.md has the recipe; .devrun/bin/spillfs-old is the daemon at 99e6f44).
#   part whole: the whole bench at 7216db9 (the third session's command, --repeat 2 to fit a call)
#   part ab:    seq only, alternated: the daemon before the session (99e6f44), after it, and after it
#               with --read-ahead 32M and 64M (read_ahead_depth.sh's question), 2 rounds
# Full outputs go to $OUT (or ./out).
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=.devrun/bin/spillfs-bench; O=${OUT:-out}; mkdir -p /root/sb $O
echo "disk: $(lsblk -dno NAME,SIZE,ROTA 2>/dev/null | tr '\n' ';') nproc $(nproc)"
case "${1:-whole}" in
whole)
  $B --spillfs .devrun/bin/spillfs --dir /root/sb --python python3 --torch-script tools/bench/torch_bench.py \
    --size 2G --files 8 --file-size 256M --rand-size 4G --rand-seconds 2 --repeat 2 \
    --json-out $O/whole.json > $O/whole.txt 2>&1
  echo "rc $?"; sed -n '/^section/,$p' $O/whole.txt ;;
ab)
  for r in 1 2; do for mode in before after ra32 ra64; do
    bin=.devrun/bin/spillfs; args=""
    [ $mode = before ] && bin=.devrun/bin/spillfs-old
    [ $mode = ra32 ] && args="--read-ahead 32M"
    [ $mode = ra64 ] && args="--read-ahead 64M"
    $B --spillfs $bin --dir /root/sb --sections seq --size 2G --repeat 1 --mount-args "$args" > $O/ab_${r}_$mode.txt 2>&1
    grep -E "^ +(raw|spillfs mount|host fs)" $O/ab_${r}_$mode.txt | sed "s/^/round $r $mode: /"
  done; done ;;
esac
