#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 from the repo root, with Release binaries in .devrun/
# (ignored by git; tools/bench/README.md has the build-and-bundle recipe): .devrun/bin holds
# the daemon of 9d7c677 ("old"), .devrun/new that of b124dae ("new"), .devrun/devlibs the
# bundled libraries. Outputs: tools/bench/results/h200_2026-12-04_*; figures in RESULTS.md.
# Device exploration: torch.save request sizes, writeback cache with the bdi dirty limits lifted, worker threads.
set -u
cd "$(dirname "$0")/../../.."  # the repo root
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
B=$PWD/.devrun/bin; S=$B/spillfs
D=/root/x; mkdir -p $D/m $D/host
$S mkfs $D/vol --size 24G >/dev/null
dd if=/dev/urandom of=$D/src bs=1M count=4096 status=none
st() { grep -E "^spillfs_(writes|bytes_written) " $D/m/.spillfs/stats | awk '{printf "%s ", $2}'; }
t() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b 'BEGIN{printf "%.0f MB/s", 4294967296/(b-a)/1e6}'; }
bdi() { local dev; dev=$(awk -v m=$D/m '$5==m {print $3}' /proc/self/mountinfo); echo /sys/class/bdi/$dev; }
echo "== torch.save request sizes (torch $(python3 -c 'import torch;print(torch.__version__)'))"
$S mount $D/vol $D/m >/dev/null
echo "bdi knobs: $(ls $(bdi) | tr '\n' ' ') max_ratio=$(cat $(bdi)/max_ratio) strict=$(cat $(bdi)/strict_limit 2>/dev/null) max_bytes=$(cat $(bdi)/max_bytes 2>/dev/null)"
echo "before $(st)"
python3 - <<PY
import torch, os, time
t = torch.randn(256 << 20, device="cuda")
with open("$D/m/t.pt", "wb") as f:
    torch.save(t, f); f.flush(); os.fsync(f.fileno())
PY
echo "after 1 GiB torch.save (writes bytes): $(st)"
command -v strace >/dev/null && strace -f -e trace=write,writev,pwrite64 -o $OUT/torch_strace.txt python3 -c "
import torch; t=torch.randn(64<<20, device='cuda'); f=open('$D/m/s.pt','wb'); torch.save(t,f); f.close()" && awk '{print \$NF}' $OUT/torch_strace.txt | sort | uniq -c | sort -rn | head -5
rm -f $D/m/*.pt; $S umount $D/m >/dev/null
for mode in default wb wb-lifted default wb-lifted; do
  args=""; [ $mode != default ] && args="--writeback-cache"
  $S mount $D/vol $D/m $args >/dev/null 2>&1
  if [ $mode = wb-lifted ]; then b=$(bdi); echo 0 > $b/strict_limit; echo 100 > $b/max_ratio; fi
  dd if=$D/src of=$D/m/w bs=1M count=1024 status=none; rm $D/m/w
  bw=$(t dd if=$D/src of=$D/m/g bs=1M conv=fsync); rm $D/m/g
  tb=$(python3 tools/bench/torch_bench.py --host-dir $D/host --mount-dir $D/m --size 1G --json 2>&1 | tail -1)
  echo "$mode: buffered dd 4G+fsync $bw | torch $tb"
  $S umount $D/m >/dev/null
done
for th in 16 4 1 16 4 1; do
  $S mount $D/vol $D/m --threads $th >/dev/null; mkdir -p $D/m/e; python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  dd if=$D/src of=$D/m/e/w bs=1M oflag=direct status=none; rm $D/m/e/w
  a=$(t dd if=$D/src of=$D/m/e/f bs=1M oflag=direct); rm $D/m/e/f
  b=$(t dd if=$D/src of=$D/m/e/f bs=1M); rm $D/m/e/f
  echo "threads $th: ingest O_DIRECT $a buffered $b"
  $S umount $D/m >/dev/null
done
