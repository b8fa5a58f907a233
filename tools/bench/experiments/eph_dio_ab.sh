#!/usr/bin/env bash
# Run on the H200 on 2026-12-04 (third session) from the repo root, Release binaries in .devrun/:
# .devrun/old/spillfs = the experiment build of aff03ad (dio_ra_ab.sh; no switches set = aff03ad),
# .devrun/bin/spillfs = a448212 plus one experiment-only switch, EXP_DIO_ALL=1: every write-only
# handle (not only those of ephemeral files) gets direct_io. Alternated, fresh mount per row:
#   old | new (ephemeral write-only handles direct_io, edge blocks past EOF zeroed) | new+EXP_DIO_ALL.
# Then the whole bench with the new daemon (default settings), 3 rounds.
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
OLD=$PWD/.devrun/old/spillfs NEW=$PWD/.devrun/bin/spillfs
D=/root/ab; mkdir -p $D/m; $NEW mkfs $D/vol --size 20G >/dev/null || exit 1
head -c 2G /dev/urandom > $D/src
cat > $D/w.py <<'PY'
import os, sys, time, torch, numpy as np
kind, path = sys.argv[1], sys.argv[2]
n = 1 << 30
if kind == "oswrite":  # one 1 GiB write at offset 320, as torch 1.13 does; + fsync
    buf = np.random.default_rng().integers(0, 255, n, dtype=np.uint8)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, b"h" * 320)
    done, mv = 0, memoryview(buf)
    while done < n: done += os.write(fd, mv[done:])
    os.fsync(fd); os.close(fd)
else:
    t = torch.rand(n // 4, device=kind)
    if kind == "cuda": torch.cuda.synchronize()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(t, f); f.flush(); os.fsync(f.fileno())
print("%5.0f" % (n / (time.perf_counter() - t0) / 1e6), end="")
PY
mb() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a=$a -v b=$b -v n=2147483648 'BEGIN{printf "%5.0f", n/(b-a)/1e6}'; }
echo "MB/s: plain dir: torch.save cuda+fsync | 1 GiB write at 320 + fsync || ephemeral dir: dd 2 GiB bs=1M | torch.save cuda (+fsync) | 1 GiB write at 320"
for r in 1 2 3; do for mode in old new new+dioall; do
  S=$NEW; E=""; [ $mode = old ] && S=$OLD; [ $mode = new+dioall ] && E="EXP_DIO_ALL=1"
  env $E $S mount $D/vol $D/m >/dev/null || exit 1
  mkdir -p $D/m/e && python3 -c "import os; os.setxattr('$D/m/e','user.spillfs.ephemeral',b'1')"
  a=$(python3 $D/w.py cuda $D/m/x); rm $D/m/x
  b=$(python3 $D/w.py oswrite $D/m/x); rm $D/m/x
  c=$(mb dd if=$D/src of=$D/m/e/g bs=1M); rm $D/m/e/g
  d=$(python3 $D/w.py cuda $D/m/e/x); rm $D/m/e/x
  e=$(python3 $D/w.py oswrite $D/m/e/x); rm $D/m/e/x
  echo "round $r $mode: $a | $b || $c | $d | $e   ssd-written $(grep '^spillfs_bytes_written_ssd ' $D/m/.spillfs/stats | awk '{print $2}')"
  $S umount $D/m >/dev/null
done; done
rm -rf $D
echo "== whole bench, new daemon"
.devrun/bin/spillfs-bench --spillfs $NEW --dir /root/sb --python python3 --size 2G --files 8 --file-size 256M \
  --rand-size 4G --rand-seconds 2 --repeat 3 --json-out $OUT/bench.json 2>&1 | tee $OUT/bench.txt | sed -n '/^section/,$p'
