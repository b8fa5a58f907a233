#!/usr/bin/env python3
"""Where torch.load's time goes, per directory.

    torch_load_probe.py DIR [DIR ...] [--size 1G] [--rounds 2]

torch.save of one tensor (CUDA when available) into DIR/probe.pt with fsync, the page cache
dropped (root), then torch.load through a file object that times every read, readinto, seek
and tell torch makes. Prints, per directory and round: the load's total time, the time and
bytes in reads (the largest read apart), and the rest (unpickling, checksums, the copy to
the device). torch.load(path) reads through a Python file object too, so the calls are the
same ones.
"""

import argparse
import os
import time

import torch


class TimedFile:
    def __init__(self, path):
        self.f = open(path, "rb")
        self.calls = []  # (what, bytes, seconds)

    def _timed(self, what, fn, *args):
        t = time.perf_counter()
        result = fn(*args)
        n = len(result) if isinstance(result, (bytes, bytearray)) else (result if what == "readinto" else 0)
        self.calls.append((what, n or 0, time.perf_counter() - t))
        return result

    def read(self, *args):
        return self._timed("read", self.f.read, *args)

    def readinto(self, b):
        return self._timed("readinto", self.f.readinto, b)

    def seek(self, *args):
        return self._timed("seek", self.f.seek, *args)

    def tell(self):
        return self.f.tell()

    def readable(self):
        return True

    def seekable(self):
        return True

    def close(self):
        self.f.close()


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(args.size[:-1]) * units[args.size[-1]] if args.size[-1] in units else int(args.size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensor = torch.randn(size // 4, device=device)
    for r in range(1, args.rounds + 1):
        for d in args.dirs:
            path = os.path.join(d, "probe.pt")
            with open(path, "wb") as f:
                torch.save(tensor, f)
                f.flush()
                os.fsync(f.fileno())
            drop_caches()
            timed = TimedFile(path)
            t = time.perf_counter()
            loaded = torch.load(timed, map_location=device)
            if device == "cuda":
                torch.cuda.synchronize()
            total = time.perf_counter() - t
            timed.close()
            assert torch.equal(loaded, tensor), f"{path} read back different bytes"
            del loaded
            os.unlink(path)
            reads = [c for c in timed.calls if c[0] in ("read", "readinto")]
            in_reads = sum(c[2] for c in reads)
            big = max(reads, key=lambda c: c[1])
            print(f"round {r} {d}: load {size / total / 1e9:.3f} GB/s ({total:.3f} s); {len(reads)} reads, "
                  f"{sum(c[1] for c in reads) >> 20} MiB in {in_reads:.3f} s; largest {big[1] >> 20} MiB in "
                  f"{big[2]:.3f} s ({big[1] / max(big[2], 1e-9) / 1e9:.3f} GB/s); rest {total - in_reads:.3f} s; "
                  f"{len(timed.calls) - len(reads)} seeks")


if __name__ == "__main__":
    main()
