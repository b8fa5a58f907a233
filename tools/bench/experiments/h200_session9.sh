#!/usr/bin/env bash
# H200, ninth session (2026-12-05), from the repo root with Release binaries in .devrun/
# (tools/bench/README.md has the recipe) plus .devrun/bin/stream_io (gcc -O2 stream_io.c).
#   part ra: the kernel's read-ahead for the mount on 16 cores. The mount asks for 1 MiB
#     (kKernelReadAheadKib), chosen on the 2-core VM, where more was slower (RESULTS.md, fourth
#     session). Here, on one mount, the bdi's read_ahead_kb is set to 1, 2, 4 and 8 MiB in turn
#     (2 rounds), and each time, with the page cache dropped first:
#       - stream: one stream of 1 MiB read()s of a 4 GiB file (stream_io r);
#       - one read: a single read() of 1 GiB into a fresh buffer, as torch.load's fread does,
#         then into the same buffer again (its pages faulted in: the read alone);
#     the same two on ext4 (the root disk, its read-ahead untouched) in each round; then
#     torch_bench.py (1 GiB CUDA tensor) at 1 MiB and at 4 MiB.
# Reports go to $OUT (or ./out).
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
O=${OUT:-out}; mkdir -p $O
S=.devrun/bin/spillfs; T=.devrun/bin/stream_io; MIB=${MIB:-4096}  # the stream files
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
one_read() {  # FILE: one read() of 1 GiB into a fresh buffer (as torch.load's), then into a touched one
  python3 -c "import os,sys,time
def drop():
    os.sync(); open('/proc/sys/vm/drop_caches','w').write('3')
def one(b, what):
    drop(); fd=os.open(sys.argv[1],os.O_RDONLY); t=time.perf_counter(); n=os.readv(fd,[b]); os.close(fd)
    print(f'one read {n>>20} MiB, {what} buffer: {n/(time.perf_counter()-t)/1e9:.3f} GB/s', end='; ')
b=bytearray(1<<30); one(b, 'fresh'); one(b, 'touched'); print()" "$1"
}
case "${1:-ra}" in
ra)
  umount -l /root/pm 2>/dev/null; rm -rf /root/pv /root/hd; mkdir -p /root/pm /root/hd
  $S mkfs /root/pv --size 20G >/dev/null && $S mount /root/pv /root/pm || exit 1
  bdi=/sys/class/bdi/$(mountpoint -d /root/pm)/read_ahead_kb
  src=$(findmnt -no SOURCE /); root=$(lsblk -no PKNAME $src 2>/dev/null | head -1); root=${root:-$(basename $src)}
  echo "mount bdi read_ahead_kb $(cat $bdi); root disk ${root:-?} read_ahead_kb $(cat /sys/block/${root:-none}/queue/read_ahead_kb 2>/dev/null) max_sectors_kb $(cat /sys/block/${root:-none}/queue/max_sectors_kb 2>/dev/null)"
  $T w /root/pm/d $MIB >/dev/null && $T w /root/hd/d $MIB >/dev/null || exit 1
  for r in 1 2; do
    drop; echo -n "round $r ext4 stream: "; $T r /root/hd/d $MIB
    echo -n "round $r ext4 "; one_read /root/hd/d
    for ra in 1024 2048 4096 8192; do
      echo $ra > $bdi
      drop; echo -n "round $r mount ra $ra stream: "; $T r /root/pm/d $MIB
      echo -n "round $r mount ra $ra "; one_read /root/pm/d
    done
  done
  rm -f /root/pm/d /root/hd/d
  for ra in 1024 4096 1024 4096; do
    echo $ra > $bdi
    echo -n "torch ra $ra: "
    python3 tools/bench/torch_bench.py --host-dir /root/hd --mount-dir /root/pm --size 1G
  done 2>&1 | tr '\n' ' ' | sed 's/torch ra/\ntorch ra/g'; echo
  .devrun/bin/spillfs stat /root/pm > $O/stat.txt
  umount /root/pm; rm -rf /root/pv /root/hd ;;
esac
