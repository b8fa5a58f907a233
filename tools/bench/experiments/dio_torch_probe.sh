#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 (third session) from the repo root, Release binaries in .devrun/, the
# daemon the experiment build of dio_ra_ab.sh (EXP_DIO=1: write-only handles opened with direct_io).
# Why did direct_io make torch.save slower there (run 19) and 3x faster on the CPU VM? Counts the
# write requests the daemon saw (spillfs stats) for torch.save of CUDA and CPU tensors and for one
# 1 GiB os.write at offset 320 (torch 1.13's pattern), base vs direct_io.
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
S=$PWD/.devrun/bin/spillfs
uname -r; python3 -c "import torch; print(torch.__version__)"
D=/root/probe; mkdir -p $D/m; $S mkfs $D/vol --size 20G >/dev/null || exit 1
stat_of() { grep -E "^spillfs_($1) " $D/m/.spillfs/stats | awk '{print $2}'; }
cat > $D/w.py <<'PY'
import os, sys, time, torch, numpy as np
kind, path = sys.argv[1], sys.argv[2]
n = 1 << 30
if kind == "oswrite":
    buf = np.random.randint(0, 255, n, dtype=np.uint8)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, b"h" * 320)
    done = 0
    mv = memoryview(buf)
    while done < n: done += os.write(fd, mv[done:])
    os.fsync(fd); os.close(fd)
else:
    t = torch.rand(n // 4, device=kind)
    if kind == "cuda": torch.cuda.synchronize()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(t, f); f.flush(); os.fsync(f.fileno())
print("%.0f MB/s" % (n / (time.perf_counter() - t0) / 1e6), end="")
PY
for r in 1 2; do for mode in base dio; do for kind in cuda cpu oswrite; do
  E=""; [ $mode = dio ] && E="EXP_DIO=1"
  env $E $S mount $D/vol $D/m >/dev/null || exit 1
  w0=$(stat_of writes); b0=$(stat_of bytes_written)
  v=$(python3 $D/w.py $kind $D/m/x 2>&1 | tail -1)
  w1=$(stat_of writes); b1=$(stat_of bytes_written)
  echo "round $r $mode $kind: $v; write requests $((w1-w0)), mean $(( (b1-b0) / (w1-w0 > 0 ? w1-w0 : 1) )) bytes"
  rm $D/m/x; $S umount $D/m >/dev/null
done; done; done
rm -rf $D
