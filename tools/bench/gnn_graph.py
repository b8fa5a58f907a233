#!/usr/bin/env python3
"""Synthetic power-law graphs and neighbour sampling for the GNN feature benchmark.

    python3 tools/bench/gnn_graph.py --out DIR --scale 22 --edge-factor 16 --width 256 --dtype float32

writes DIR/indptr.npy (int64, n+1), DIR/indices.npy (int32 where n < 2^31, else
int64): the CSR of an RMAT graph with Graph500's parameters (a, b, c, d) =
(0.57, 0.19, 0.19, 0.05), 2^scale nodes, edge_factor x 2^scale edges (self
loops and duplicates kept, node ids permuted so hubs are spread), and
DIR/feat.npy: the (n, width) feature table, a 2-D C-order .npy whose row i
is a function of i (``expected_rows``: checkable without reading the file),
its header padded so the rows start at byte 4096 (block aligned).
Generation runs on the GPU where there is one (torch ops), in chunks.

``sample(indptr, indices, seeds, fanouts)``: uniform neighbour sampling with
replacement (torch ops, on the tensors' device): per layer, k neighbours of
every frontier node; returns the sorted unique nodes of the subgraph, the
edges (2, E) in local ids (neighbour -> node, as PyG's message direction),
and where the seeds lie among the nodes.
"""

import argparse
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

GRAPH500 = (0.57, 0.19, 0.19, 0.05)


def rmat_edges(scale, n_edges, seed, device, chunk=1 << 24):
    """(src, dst) int64 tensors of an RMAT graph, node ids permuted. Filled in
    place chunk by chunk (no concatenation: peak memory two edge arrays, the
    permutation and one chunk's temporaries)."""
    a, b, c, _ = GRAPH500
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    src = torch.zeros(n_edges, dtype=torch.int64, device=device)
    dst = torch.zeros(n_edges, dtype=torch.int64, device=device)
    for start in range(0, n_edges, chunk):
        m = min(chunk, n_edges - start)
        s, d = src[start:start + m], dst[start:start + m]
        for bit in range(scale):
            r = torch.rand(m, generator=g, device=device)
            down = r >= a + b                                  # quadrants c, d: source bit set
            right = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d: target bit set
            s |= down.to(torch.int64) << bit
            d |= right.to(torch.int64) << bit
    n = 1 << scale
    perm = torch.randperm(n, generator=g, device=device)
    src = perm[src]
    dst = perm[dst]
    return src, dst


def to_csr(src, dst, n):
    order = torch.argsort(src)
    indices = dst[order]
    counts = torch.bincount(src, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=src.device)
    indptr[1:] = torch.cumsum(counts, 0)
    return indptr, indices


def expected_rows(rows, width, dtype):
    """Row i of the generated table: (i * 7 + j) mod 1021, scaled (exact in every dtype)."""
    rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1, 1)
    j = torch.arange(width, dtype=torch.int64, device=rows.device).reshape(1, -1)
    v = (rows * 7 + j) % 1021
    if dtype.is_floating_point:
        return (v.to(torch.float32) / 8).to(dtype)
    return (v % 127).to(dtype)


def npy_header(header, data_offset=4096):
    """A version 1.0 .npy header padded so the data starts at ``data_offset``
    (rows aligned to 4 KiB blocks: a 4 KiB line is one block read, not two);
    np.load reads it as any other."""
    text = "{" + ", ".join(f"'{k}': {header[k]!r}" for k in ("descr", "fortran_order", "shape")) + ", }"
    body = data_offset - 10
    if len(text) + 1 > body or body > 65535:
        raise ValueError("header does not fit")
    text = text + " " * (body - len(text) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + body.to_bytes(2, "little") + text.encode("latin1")


def write_table(path, n, width, dtype, device, chunk_bytes=256 << 20):
    """Writes the (n, width) table chunk by chunk: rows computed on ``device``
    (expected_rows), copied into one of two host buffers (pinned where the
    device is a GPU) and written by a writer thread while the next chunk is
    made; O_DIRECT where the file system takes it (no page cache: the host
    holds at most two chunks of the table, however large it is), else
    buffered. Returns "direct" or "buffered"."""
    import queue
    import threading
    npdt = torch.empty(0, dtype=dtype).numpy().dtype
    row_bytes = width * npdt.itemsize
    header = {"descr": np.lib.format.dtype_to_descr(npdt), "fortran_order": False, "shape": (n, width)}
    rows_per_chunk = max(1, chunk_bytes // row_bytes)
    step = 4096 // math.gcd(row_bytes, 4096)  # rows a whole number of blocks takes
    if rows_per_chunk >= step:
        rows_per_chunk -= rows_per_chunk % step  # whole blocks a chunk (O_DIRECT)
    cap = -(-rows_per_chunk * row_bytes // 4096) * 4096
    cuda = torch.device(device).type == "cuda"
    total = 4096 + n * row_bytes
    with open(path, "wb") as f:
        f.write(npy_header(header, 4096))
    mode = "buffered"
    fd = None
    if hasattr(os, "O_DIRECT") and (rows_per_chunk * row_bytes) % 4096 == 0:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
            mode = "direct"
        except OSError:
            fd = None
    if fd is None:
        fd = os.open(path, os.O_WRONLY)
    # Page-aligned buffers (O_DIRECT): pinned ones come aligned; numpy ones are cut to a page.
    bufs = []
    for _ in range(2):
        if cuda:
            t = torch.empty(cap, dtype=torch.uint8, pin_memory=True)
            bufs.append((t, t.numpy()))
        else:
            raw = np.empty(cap + 4096, dtype=np.uint8)
            skip = (-raw.ctypes.data) % 4096
            arr = raw[skip:skip + cap]
            bufs.append((torch.from_numpy(arr), arr))
    free, todo, errors = queue.Queue(), queue.Queue(), []
    for i in range(len(bufs)):
        free.put(i)
    state = {"fd": fd, "mode": mode}

    def writer():
        while True:
            job = todo.get()
            if job is None:
                return
            i, nbytes, offset = job
            try:
                padded = -(-nbytes // 4096) * 4096
                view = memoryview(bufs[i][1])[:padded if state["mode"] == "direct" else nbytes]
                done = 0
                while done < len(view):
                    try:
                        done += os.pwrite(state["fd"], view[done:], offset + done)
                    except OSError as e:
                        if state["mode"] != "direct" or e.errno != 22 or done:
                            raise
                        # EINVAL: this file system refuses O_DIRECT after all: buffered from here on.
                        os.close(state["fd"])
                        state.update(fd=os.open(path, os.O_WRONLY), mode="buffered")
                        view = view[:nbytes]
            except Exception as e:  # noqa: BLE001: raised by the caller
                errors.append(e)
            free.put(i)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for start in range(0, n, rows_per_chunk):
            stop = min(n, start + rows_per_chunk)
            block = expected_rows(torch.arange(start, stop, device=device), width, dtype).reshape(-1)
            i = free.get()
            if errors:
                raise errors[0]
            nbytes = (stop - start) * row_bytes
            bufs[i][0][:nbytes].copy_(block.view(torch.uint8))
            todo.put((i, nbytes, 4096 + start * row_bytes))
    finally:
        todo.put(None)
        thread.join()
    if errors:
        raise errors[0]
    fd = state["fd"]
    os.ftruncate(fd, total)  # an O_DIRECT tail was padded to a block
    os.fsync(fd)
    os.close(fd)
    return state["mode"]


def bytes_needed(scale, edge_factor, width, dtype):
    """Bytes generate() writes: the table (4 KiB header) and the CSR."""
    n = 1 << scale
    itemsize = torch.empty(0, dtype=dtype).element_size()
    idx = 4 if n < (1 << 31) else 8
    return 4096 + n * width * itemsize + (n + 1) * 8 + edge_factor * n * idx + 256


def generate(out, scale, edge_factor, width, dtype, seed=1, device=None, chunk_bytes=256 << 20):
    """Writes the CSR and the table (see the module's doc) into ``out``, after
    checking the file system has room; returns sizes and timings."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(out, exist_ok=True)
    need = bytes_needed(scale, edge_factor, width, dtype)
    have = shutil.disk_usage(out).free + sum(
        os.path.getsize(os.path.join(out, f)) for f in ("feat.npy", "indptr.npy", "indices.npy")
        if os.path.exists(os.path.join(out, f)))
    if need + (1 << 30) > have:
        raise SystemExit(f"gnn_graph: scale {scale} width {width} needs {need / 2**30:.1f} GiB (+1 GiB spare) "
                         f"in {out}, which has {have / 2**30:.1f} GiB free")
    n = 1 << scale
    t0 = time.time()
    src, dst = rmat_edges(scale, edge_factor * n, seed, device)
    indptr, indices = to_csr(src, dst, n)
    del src, dst
    idx_dtype = torch.int32 if n < (1 << 31) else torch.int64
    indices = indices.to(idx_dtype)
    edges = int(indptr[-1])
    np.save(os.path.join(out, "indptr.npy"), indptr.cpu().numpy())
    del indptr
    np.save(os.path.join(out, "indices.npy"), indices.cpu().numpy())
    del indices
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    t1 = time.time()
    mode = write_table(os.path.join(out, "feat.npy"), n, width, dtype, device, chunk_bytes)
    t2 = time.time()
    return {"nodes": n, "edges": edges, "graph_seconds": t1 - t0, "table_seconds": t2 - t1,
            "table_bytes": os.path.getsize(os.path.join(out, "feat.npy")), "table_write": mode,
            "generate_device": str(device)}


def sample(indptr, indices, seeds, fanouts, generator=None):
    """Uniform neighbour sampling with replacement (see the module's doc)."""
    device = indptr.device
    seeds = seeds.to(device, torch.int64)
    frontier = seeds
    src_all, dst_all = [], []
    for k in fanouts:
        start = indptr[frontier]
        deg = indptr[frontier + 1] - start
        r = torch.rand((len(frontier), k), device=device, generator=generator)
        pick = start[:, None] + (r * deg[:, None]).to(torch.int64)
        ok = (deg > 0)[:, None].expand(-1, k)
        nbr = indices[pick[ok]].to(torch.int64)
        dst_all.append(frontier[:, None].expand(-1, k)[ok])
        src_all.append(nbr)
        frontier = torch.unique(nbr)
    src = torch.cat(src_all) if src_all else seeds[:0]
    dst = torch.cat(dst_all) if dst_all else seeds[:0]
    nodes, inverse = torch.unique(torch.cat([seeds, src, dst]), return_inverse=True)
    s = len(seeds)
    seed_local = inverse[:s]
    edge_index = torch.stack([inverse[s:s + len(src)], inverse[s + len(src):]])
    return nodes, edge_index, seed_local


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--scale", type=int, default=20)
    p.add_argument("--edge-factor", type=int, default=16)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default=None)
    a = p.parse_args(argv)
    info = generate(a.out, a.scale, a.edge_factor, a.width, getattr(torch, a.dtype), a.seed, a.device)
    print(info)


if __name__ == "__main__":
    sys.exit(main())
