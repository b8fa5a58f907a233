"""4 KiB O_DIRECT random preads of FILE from THREADS Python threads for SECONDS; prints IOPS.

Useful to compare files written different ways (through the mount, by spill_write) or two
daemons, without the whole bench:
/usr/bin/python3 tools/bench/probes/mount_randread.py MOUNT/FILE THREADS SECONDS
"""
import os, sys, threading, time, random, mmap
path, threads, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
size = os.path.getsize(path)
count = [0] * threads
stop = time.time() + secs
def worker(i):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    r = random.Random(i)
    n = 0
    while time.time() < stop:
        os.preadv(fd, [buf], r.randrange(size // 4096) * 4096)
        n += 1
    count[i] = n
    os.close(fd)
ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(f"{sum(count)/secs:.0f} IOPS with {threads} threads")
