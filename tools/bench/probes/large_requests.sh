#!/usr/bin/env bash
# FUSE requests larger than 1 MiB (`spillfs mount --max-request`), against ext4.
# libfuse 3.14's loop caps a request at 1 MiB; Linux 6.12+ allows fs.fuse.max_pages_limit pages,
# raised here to 8 MiB (2048 pages) for the run and put back after. The kernel serves one large
# write() or read() as synchronous requests of at most that size, one round trip each.
# Per round, for ext4 (the directory that holds the volume) and for each --max-request:read_ahead_kb
# pair of CONFIGS (the kernel's read-ahead is set on the mount's bdi after mounting; the mount sets
# it to the request size): one write() of 1 GiB from a touched buffer + fsync (as torch.save writes a
# storage); one read() of it after the page cache is dropped, into a fresh buffer (as torch.load
# reads it) and again into the same buffer (its pages faulted in), then once with O_DIRECT into a
# touched buffer (the kernel sends the requests of one direct read() in parallel, up to
# max_background: what a direct_io read handle would give torch.load); a stream of 1 MiB read()s; and
# torch_bench.py when PY (a python with torch) is given.
# Usage: [S=spillfs] [PY=/usr/bin/python3] [ROUNDS=3] [DIR=/var/tmp/lrq] [MIB=1024] [CONFIGS=...]
#   tools/bench/probes/large_requests.sh   (as root, from the repository root)
set -u
CONFIGS=${CONFIGS:-1M:1024 4M:1024 4M:4096 8M:2048 8M:8192}
S=${S:-build/bin/spillfs}; PY=${PY:-}; ROUNDS=${ROUNDS:-3}; D=${DIR:-/var/tmp/lrq}; MIB=${MIB:-1024}
KNOB=/proc/sys/fs/fuse/max_pages_limit
old_limit=$(cat $KNOB) || exit 1
trap 'echo $old_limit > $KNOB' EXIT
echo 2048 > $KNOB
umount -l $D/m 2>/dev/null; rm -rf $D; mkdir -p $D/m $D/ext4
$S mkfs $D/vol --size 8G >/dev/null || exit 1
big_io() {  # DIR: one write() + fsync, then one read() twice, each after dropping the page cache
  python3 -c "import os,sys,time
n=$MIB<<20; b=bytearray(os.urandom(n)); r=bytearray(n); p=sys.argv[1]+'/big'
fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644); t=time.perf_counter(); os.write(fd,b); os.fsync(fd); w=time.perf_counter()-t; os.close(fd)
print(f'one write+fsync {n/w/1e9:.3f} GB/s', end='; ')
for what in ('fresh', 'touched'):
    os.sync(); open('/proc/sys/vm/drop_caches','w').write('3'); r[:8]=b'unread!!'
    fd=os.open(p,os.O_RDONLY); t=time.perf_counter(); got=os.readv(fd,[r]); rd=time.perf_counter()-t; os.close(fd)
    assert got==n and r==b, 'read back differs'
    print(f'one read, {what} buffer {n/rd/1e9:.3f} GB/s', end='; ')
import mmap; a=mmap.mmap(-1,n); a[:]=b
os.sync(); open('/proc/sys/vm/drop_caches','w').write('3'); a[:8]=b'unread!!'
fd=os.open(p,os.O_RDONLY|os.O_DIRECT); t=time.perf_counter(); got=os.readv(fd,[a]); rd=time.perf_counter()-t; os.close(fd)
assert got==n and a[:]==b, 'O_DIRECT read back differs'
print(f'one O_DIRECT read {n/rd/1e9:.3f} GB/s', end='; ')" "$1"
}
stream_read() {  # FILE: 1 MiB read()s after dropping the page cache
  sync; echo 3 > /proc/sys/vm/drop_caches
  python3 -c "import os,sys,time
fd=os.open(sys.argv[1],os.O_RDONLY); n=0; t=time.perf_counter()
while True:
    k=len(os.read(fd,1<<20))
    if k==0: break
    n+=k
print(f'1 MiB reads {n/(time.perf_counter()-t)/1e9:.3f} GB/s', end='; ')" "$1"
}
for r in $(seq 1 $ROUNDS); do
  echo -n "round $r ext4: "; big_io $D/ext4; stream_read $D/ext4/big; echo; rm -f $D/ext4/big
  for c in $CONFIGS; do
    q=${c%:*}; ra=${c#*:}
    $S mount $D/vol $D/m --max-request $q >/dev/null || exit 1
    echo $ra > /sys/class/bdi/$(mountpoint -d $D/m)/read_ahead_kb
    echo -n "round $r mount --max-request $q, read_ahead_kb $ra: "
    big_io $D/m; stream_read $D/m/big
    $S stat --json $D/m | python3 -c 'import json,sys; d=json.load(sys.stdin); print("requests: %d writes, %d reads" % (d["writes"], d["reads"]))'
    rm -f $D/m/big
    if [ -n "$PY" ]; then echo -n "  torch: "; $PY tools/bench/torch_bench.py --host-dir $D/ext4 --mount-dir $D/m --size ${MIB}M | tr '\n' ' '; echo; fi
    $S umount $D/m >/dev/null
  done
done
rm -rf $D
