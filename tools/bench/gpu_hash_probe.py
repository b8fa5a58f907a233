#!/usr/bin/env python3
"""GPU unit hashes inside a save, timed: 243 bf16 CUDA tensors (3.23 GiB) hashed by one
_io.hash_units_many call (4 times) and a hash_units call a tensor (twice); both must
agree. Not a test: prints figures (needs CUDA and libspillfs_client; PYTHONPATH=clients/python)."""
import time, torch
from spillfs import _io
torch.manual_seed(0)
ts = []
sizes = [4096 * 4096] * 60 + [4096 * 11008 // 4] * 60 + [4096] * 120 + [32000 * 4096 // 8] * 3
for n in sizes:
    ts.append(torch.randn(n, device="cuda", dtype=torch.bfloat16))
total = sum(t.numel() * 2 for t in ts)
print(f"{len(ts)} tensors, {total / 2**30:.2f} GiB")
stream = torch.cuda.current_stream().cuda_stream
bufs = [(t.data_ptr(), t.numel() * 2) for t in ts]
for k in range(4):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    h = _io.hash_units_many(bufs, 0, stream)
    t1 = time.perf_counter()
    print(f"hash_units_many #{k}: {1e3 * (t1 - t0):.2f} ms, {sum(len(x) for x in h) // 2} units")
for k in range(2):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    h2 = [_io.hash_units(p, n, 0, stream) for p, n in bufs]
    print(f"hash_units each #{k}: {1e3 * (time.perf_counter() - t0):.2f} ms")
assert [list(a) for a in h] == [list(b) for b in h2]
