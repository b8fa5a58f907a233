#!/usr/bin/env bash
# H200, 2026-12-05 (sixth session), from the repo root with Release binaries in .devrun/
# (tools/bench/README.md has the recipe), plus .devrun/bin/stream_io (stream_io.c) and
# .devrun/bin/perf with its libraries in .devrun/perflibs (Debian's perf, bundled the same way).
#   part probe: where mount writes lose against raw. One mount; each figure is stream_io, 4 GiB:
#     raw O_DIRECT to a file on the root filesystem (the bench's raw is io_uring at depth; this is
#     one synchronous stream, for scale); an ephemeral file written with no SSD write and read back
#     from the RAM tier (the FUSE path alone); a durable file written buffered and O_DIRECT, then
#     read back; then perf -a during a durable write and during an O_DIRECT read.
#   part ring: h200_fuse_ring_ab.sh (FUSE over io_uring against /dev/fuse), 3 rounds.
#   part reread: a durable file read right after its write, then after a remount (as the bench does).
# Reports go to $OUT (or ./out).
set -u
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/.devrun/devlibs
O=${OUT:-out}; mkdir -p $O
S=.devrun/bin/spillfs; T=.devrun/bin/stream_io
perf() { LD_LIBRARY_PATH=$PWD/.devrun/perflibs .devrun/bin/perf "$@"; }
case "${1:-probe}" in
probe)
  echo "kernel $(uname -r); $(grep -m1 'model name' /proc/cpuinfo); nproc $(nproc); paranoid $(cat /proc/sys/kernel/perf_event_paranoid)"
  umount -l /root/pm 2>/dev/null; rm -rf /root/pv; mkdir -p /root/pm
  $S mkfs /root/pv --size 20G >/dev/null && $S mount /root/pv /root/pm || exit 1
  pid=$(pgrep -n -f "spillfs mount /root/pv"); echo "daemon pid $pid"
  python3 -c "import os; os.mkdir('/root/pm/eph'); os.setxattr('/root/pm/eph', 'user.spillfs.ephemeral', b'1')"
  for r in 1 2; do
    echo "-- round $r"
    $T w /root/rawfile 4096 direct; $T r /root/rawfile 4096 direct; rm -f /root/rawfile
    $T w /root/pm/eph/a 4096 nosync; $T r /root/pm/eph/a 4096 direct; $T r /root/pm/eph/a 4096; rm /root/pm/eph/a
    $T w /root/pm/d 4096; $T r /root/pm/d 4096 direct; $T w /root/pm/d 4096 direct; rm /root/pm/d
  done
  echo "-- perf: durable buffered write"
  perf record -a -g -F 499 -o /root/pw.data -- $T w /root/pm/p 4096 2>&1 | grep -v "^\[ perf"
  echo "-- perf: O_DIRECT read of it"
  echo 3 > /proc/sys/vm/drop_caches
  perf record -a -g -F 499 -o /root/pr.data -- $T r /root/pm/p 4096 direct 2>&1 | grep -v "^\[ perf"
  for f in pw pr; do
    perf report -i /root/$f.data --stdio --no-children --sort comm -g none 2>/dev/null | grep -v "^#" | head -25 > $O/${f}_comm.txt
    perf report -i /root/$f.data --stdio --no-children --sort comm,dso,sym -g none 2>/dev/null | grep -v "^#" | head -120 > $O/${f}_sym.txt
    perf report -i /root/$f.data --stdio --no-children --sort sym -g caller,0.5,callee --percent-limit 3 2>/dev/null | head -400 > $O/${f}_callers.txt
  done
  head -25 $O/pw_comm.txt; head -40 $O/pw_sym.txt; head -15 $O/pr_comm.txt; head -30 $O/pr_sym.txt
  $S stat /root/pm | head -40 > $O/stat.txt
  umount /root/pm; rm -rf /root/pv /root/pw.data /root/pr.data ;;
ring)
  bash tools/bench/experiments/h200_fuse_ring_ab.sh > $O/ring.txt 2>&1; grep -E "x[0-9.]+ raw" $O/ring.txt ;;
reread)
  # Why the bench's mount reads (after a remount) fall short of reads right after the write.
  umount -l /root/pm 2>/dev/null; rm -rf /root/pv; mkdir -p /root/pm
  $S mkfs /root/pv --size 20G >/dev/null && $S mount /root/pv /root/pm || exit 1
  for mib in 4096 2048; do
    echo "-- $mib MiB"
    $T w /root/rawfile $mib direct >/dev/null; echo 3 > /proc/sys/vm/drop_caches; echo -n "raw stream: "; $T r /root/rawfile $mib direct
    $T w /root/pm/d $mib >/dev/null
    echo 3 > /proc/sys/vm/drop_caches; echo -n "mounted since the write: "; $T r /root/pm/d $mib direct
    umount /root/pm; $S mount /root/pv /root/pm >/dev/null
    for k in 1 2; do echo 3 > /proc/sys/vm/drop_caches; echo -n "after a remount: "; $T r /root/pm/d $mib direct; done
    echo 3 > /proc/sys/vm/drop_caches; echo -n "after a remount, buffered: "; $T r /root/pm/d $mib
    echo -n "raw stream again: "; echo 3 > /proc/sys/vm/drop_caches; $T r /root/rawfile $mib direct
    rm -f /root/pm/d /root/rawfile
  done
  umount /root/pm; rm -rf /root/pv ;;
esac
