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
import os
import sys
import time

import numpy as np
import torch

GRAPH500 = (0.57, 0.19, 0.19, 0.05)


def rmat_edges(scale, n_edges, seed, device, chunk=1 << 24):
    """(src, dst) int64 tensors of an RMAT graph, node ids permuted."""
    a, b, c, _ = GRAPH500
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    srcs, dsts = [], []
    for start in range(0, n_edges, chunk):
        m = min(chunk, n_edges - start)
        src = torch.zeros(m, dtype=torch.int64, device=device)
        dst = torch.zeros(m, dtype=torch.int64, device=device)
        for bit in range(scale):
            r = torch.rand(m, generator=g, device=device)
            down = r >= a + b                                  # quadrants c, d: source bit set
            right = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d: target bit set
            src |= down.to(torch.int64) << bit
            dst |= right.to(torch.int64) << bit
        srcs.append(src)
        dsts.append(dst)
    src, dst = torch.cat(srcs), torch.cat(dsts)
    n = 1 << scale
    perm = torch.randperm(n, generator=g, device=device)
    return perm[src], perm[dst]


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
    npdt = torch.empty(0, dtype=dtype).numpy().dtype
    header = {"descr": np.lib.format.dtype_to_descr(npdt), "fortran_order": False, "shape": (n, width)}
    with open(path, "wb") as f:
        f.write(npy_header(header, 4096))
        rows_per_chunk = max(1, chunk_bytes // (width * npdt.itemsize))
        for start in range(0, n, rows_per_chunk):
            stop = min(n, start + rows_per_chunk)
            block = expected_rows(torch.arange(start, stop, device=device), width, dtype)
            f.write(block.cpu().numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())


def generate(out, scale, edge_factor, width, dtype, seed=1, device=None):
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(out, exist_ok=True)
    n = 1 << scale
    t0 = time.time()
    src, dst = rmat_edges(scale, edge_factor * n, seed, device)
    indptr, indices = to_csr(src, dst, n)
    del src, dst
    idx_dtype = torch.int32 if n < (1 << 31) else torch.int64
    np.save(os.path.join(out, "indptr.npy"), indptr.cpu().numpy())
    np.save(os.path.join(out, "indices.npy"), indices.to(idx_dtype).cpu().numpy())
    t1 = time.time()
    write_table(os.path.join(out, "feat.npy"), n, width, dtype, device)
    t2 = time.time()
    return {"nodes": n, "edges": int(indptr[-1]), "graph_seconds": t1 - t0, "table_seconds": t2 - t1,
            "table_bytes": os.path.getsize(os.path.join(out, "feat.npy"))}


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
