#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 (third session) from the repo root, with Release binaries in .devrun/
# (tools/bench/README.md has the recipe). The daemon is an experiment build of aff03ad with three
# getenv switches, never committed: EXP_DIO=1 opens write-only handles with direct_io;
# EXP_RA_WIN (MiB), EXP_RA_AHEAD, EXP_RA_THREADS override ReadAhead::Options.
# 1) write-only direct_io on/off, alternated: torch.save (torch_bench.py), dd buffered + fsync, ephemeral ingest;
# 2) read-ahead settings, alternated: cold 4 GiB reads through the mount, raw dd beside them;
# 3) mount random reads with 16 (default) and 64 FUSE workers (spillfs-bench --sections random).
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
S=$PWD/.devrun/bin/spillfs
D=/root/ab; mkdir -p $D/m $D/host; $S mkfs $D/vol --size 30G >/dev/null || exit 1
head -c 2G /dev/urandom > $D/src
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b -v n=$BYTES 'BEGIN{printf "%5.0f", n/(b-a)/1e6}'; }
eph() { mkdir -p $D/m/e && python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"; }
echo "== 1) write-only handles: base vs direct_io (MB/s)"
BYTES=2147483648
for r in 1 2 3; do for mode in base dio; do
  E=""; [ $mode = dio ] && E="EXP_DIO=1"
  env $E $S mount $D/vol $D/m >/dev/null || exit 1
  t=$(python3 tools/bench/torch_bench.py --host-dir $D/host --mount-dir $D/m --size 1G --json 2>&1 | tail -1 | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print("save ext4 %.0f mount %.0f (%.2f) load ext4 %.0f mount %.0f" % (j["host"]["save_GBps"]*1e3, j["mount"]["save_GBps"]*1e3, j["save_ratio_mount_to_host"], j["host"]["load_GBps"]*1e3, j["mount"]["load_GBps"]*1e3))')
  a=$(mb dd if=$D/src of=$D/m/g bs=1M conv=fsync); rm $D/m/g
  eph; b=$(mb dd if=$D/src of=$D/m/e/g bs=1M); rm $D/m/e/g
  $S umount $D/m >/dev/null
  echo "round $r $mode: dd buffered+fsync $a | ephemeral buffered ingest $b | torch $t"
done; done
if command -v strace >/dev/null; then
  EXP_DIO=1 $S mount $D/vol $D/m >/dev/null
  strace -f -e trace=write,pwrite64 -o $D/st.txt python3 tools/bench/torch_bench.py --host-dir $D/host --mount-dir $D/m --size 256M >/dev/null 2>&1
  echo "torch write syscalls (fd>2), sizes:"; grep -E "write\([3-9]|write\([1-9][0-9]" $D/st.txt | awk '{print $NF}' | sort | uniq -c | sort -rn | head -8
  $S umount $D/m >/dev/null
fi
echo "== 2) read-ahead settings: cold 4 GiB reads (MB/s): raw dd iflag=direct | mount O_DIRECT | mount buffered"
$S mount $D/vol $D/m >/dev/null && cat $D/src $D/src > $D/m/f && sync $D/m/f && $S umount $D/m >/dev/null
cat $D/src $D/src > $D/raw && sync
BYTES=4294967296
for r in 1 2; do for cfg in "base" "EXP_RA_AHEAD=8" "EXP_RA_WIN=8" "EXP_RA_THREADS=8 EXP_RA_AHEAD=8"; do
  E=""; [ "$cfg" != base ] && E="$cfg"
  env $E $S mount $D/vol $D/m >/dev/null || exit 1
  drop; a=$(mb dd if=$D/raw of=/dev/null bs=1M iflag=direct)
  drop; b=$(mb dd if=$D/m/f of=/dev/null bs=1M iflag=direct)
  drop; c=$(mb dd if=$D/m/f of=/dev/null bs=1M)
  $S umount $D/m >/dev/null
  echo "round $r [$cfg]: $a | $b | $c"
done; done
rm -rf $D
echo "== 3) mount random reads, default vs --threads 64"
for t in 16 64; do
  .devrun/bin/spillfs-bench --spillfs $S --dir /root/sb --sections random --rand-size 4G --rand-seconds 2 --mount-args "--threads $t" 2>&1 | grep -E "^random" | sed "s/^/threads $t: /"
done
