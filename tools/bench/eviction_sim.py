#!/usr/bin/env python3
"""Trace-driven simulation of FeatureStore's eviction policies: the hit rates
of ``lru``, ``static`` and ``hybrid`` on sampled GNN batches, without a table,
a GPU or any I/O, in minutes on a CPU.

    python3 tools/bench/eviction_sim.py --scale 21 --cache-ratios 0.10,0.25

What it shares with the device benchmark (tools/bench/feature_bench.py):
the graph (gnn_graph.rmat_edges / to_csr: RMAT, Graph500 parameters, edge
factor 16), the batches (make_batches' procedure: --batch random seeds, torch
generator seed 7, gnn_graph.sample with --fanouts, each batch once, never
cycled), the static score (spillfs.gnn.reverse_pagerank: 20 iterations,
damping 0.85), a line's score (the highest of its rows', as FeatureStore
computes it) and the hot lines (those of the top rows by score, best first, as
FeatureStore._hot_lines), and the policy code itself: spillfs.gnn._store.line_cache's
LineDirectory, Window and VictimBuffer driven the way spillfs.gnn._store.gpu_cache's
GpuTiers drives them (hits stamped by the gather, the misses of a batch
admitted per staging load, evicted lines the window reuses parked in the
victim buffer, victims the next batch uses restored ahead of it, the victim
buffer aged after each batch). The budgets are ratios of the table's lines:
the device run's defaults are a 4 GB cache (25 % of the lines), a hot buffer
of 393,216 lines (9.375 %) and a victim buffer of 131,072 (3.125 %), window 4.

Hit rate = (cache + hot + victim rows) / rows asked, as FeatureStore.stats().
The graph and the batches are kept in --dir for later runs.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))

import gnn_graph  # noqa: E402
from spillfs.gnn._store import line_cache as _line_cache  # noqa: E402
from spillfs.gnn import reverse_pagerank  # noqa: E402


def load_trace(a):
    """(batches of node ids, per-row score), made once and kept in --dir."""
    os.makedirs(a.dir, exist_ok=True)
    tag = f"s{a.scale}_e{a.edge_factor}"
    gpath = os.path.join(a.dir, f"graph_{tag}.npz")
    bpath = os.path.join(a.dir, f"batches_{tag}_b{a.batch}_f{a.fanouts}_n{a.batches}_g{a.seed}.npz")
    if os.path.exists(bpath):
        z = np.load(bpath)
        offs = z["offsets"]
        return [z["nodes"][offs[i]:offs[i + 1]] for i in range(len(offs) - 1)], z["score"]
    n = 1 << a.scale
    t = time.perf_counter()
    if os.path.exists(gpath):
        z = np.load(gpath)
        indptr, indices, score = torch.from_numpy(z["indptr"]), torch.from_numpy(z["indices"]), z["score"]
    else:
        src, dst = gnn_graph.rmat_edges(a.scale, a.edge_factor * n, a.graph_seed, "cpu")
        indptr, indices = gnn_graph.to_csr(src, dst, n)
        del src, dst
        score = reverse_pagerank(indptr, indices)
        np.savez(gpath, indptr=indptr.numpy(), indices=indices.numpy(), score=score)
        print(f"graph: 2^{a.scale} nodes, {int(indptr[-1])} edges, reverse PageRank: "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    g = torch.Generator()
    g.manual_seed(a.seed)
    fanouts = [int(x) for x in a.fanouts.split(",")]
    batches = []
    for _ in range(a.batches):
        seeds = torch.randint(0, n, (a.batch,), generator=g)
        batches.append(gnn_graph.sample(indptr, indices, seeds, fanouts, generator=g)[0].numpy())
    offs = np.cumsum([0] + [len(b) for b in batches])
    np.savez(bpath, nodes=np.concatenate(batches), offsets=offs, score=score)
    print(f"batches: {a.batches} of {a.batch} seeds, fanouts ({a.fanouts}): "
          f"{np.mean([len(b) for b in batches]):.0f} rows a batch", flush=True)
    return batches, score


def line_layout(score, rows_per_line, hot_lines_n):
    """Line scores (max of the rows') and the hot lines, as FeatureStore makes them."""
    rows = len(score)
    n_lines = -(-rows // rows_per_line)
    padded = np.full(n_lines * rows_per_line, -np.inf)
    padded[:rows] = score
    line_score = padded.reshape(n_lines, rows_per_line).max(axis=1)
    lines = np.argsort(-score, kind="stable") // rows_per_line
    _, first = np.unique(lines, return_index=True)
    hot = lines[np.sort(first)][:hot_lines_n]
    return n_lines, line_score, hot


def simulate(batches, n_lines, line_score, hot, rows_per_line, cache_lines, victim_lines, window, policy,
             staging=16384):
    """One pass over the batches through GpuTiers' use of the directory; returns stats."""
    directory = _line_cache.LineDirectory(n_lines, cache_lines, policy, line_score)
    victims = _line_cache.VictimBuffer(victim_lines)
    win = _line_cache.Window(window)
    is_hot = np.zeros(n_lines, dtype=bool)
    is_hot[hot] = True
    st = dict(requests=0, gpu_hits=0, hot_hits=0, victim_hits=0, storage_rows=0, evictions=0,
              victims_stored=0, victims_restored=0)
    lines_of = [np.asarray(b, dtype=np.int64) // rows_per_line for b in batches]
    for b in lines_of[:window]:
        win.push(b)
    stamp = 0
    per_batch = np.zeros((len(lines_of), 3), dtype=np.int64)  # requests, storage rows, cache hits
    full_at = None
    for i, lines in enumerate(lines_of):
        before = (st["requests"], st["storage_rows"], st["gpu_hits"])
        if window and i + window < len(lines_of):
            win.push(lines_of[i + window])
        stamp += 1
        win.pop()
        st["requests"] += len(lines)
        # The gather kernel: hot rows, cached rows (their lines stamped), the rest to the ring.
        h = is_hot[lines]
        st["hot_hits"] += int(h.sum())
        slot = directory.lookup(lines)
        c = (slot >= 0) & ~h
        st["gpu_hits"] += int(c.sum())
        directory.touch(slot[c], stamp)
        miss = lines[~h & ~c]
        if len(miss):
            ul, counts = np.unique(miss, return_counts=True)
            for c0 in range(0, len(ul), staging):
                chunk, cnt = ul[c0:c0 + staging], counts[c0:c0 + staging]
                vs = victims.take(chunk)
                fromv = vs >= 0
                victims.release(vs[fromv])
                st["victim_hits"] += int(cnt[fromv].sum())
                st["storage_rows"] += int(cnt[~fromv].sum())
                slots, ev, ev_slots, ev_reuse = directory.admit(chunk, stamp, win)
                st["evictions"] += len(ev)
                if len(ev):
                    st["victims_stored"] += int((victims.place(ev, ev_reuse) >= 0).sum())
        # restore_victims: victim lines the next batch uses go back ahead of it.
        back = victims.needed_next(win)[:staging]
        if len(back) and directory.capacity:
            vs = victims.take(back)
            slots, ev, ev_slots, ev_reuse = directory.admit(back, stamp, win)
            adm = slots >= 0
            victims.release(vs[adm])
            victims.put_back(back[~adm], vs[~adm])
            if len(ev):
                st["victims_stored"] += int((victims.place(ev, ev_reuse) >= 0).sum())
            st["evictions"] += len(ev)
            st["victims_restored"] += int(adm.sum())
        victims.age(win)
        per_batch[i] = (st["requests"] - before[0], st["storage_rows"] - before[1], st["gpu_hits"] - before[2])
        if full_at is None and directory.capacity and (directory.line_of_slot >= 0).all():
            full_at = i + 1
    st["per_batch"] = per_batch
    st["full_at"] = full_at
    req = max(1, st["requests"])
    st["hit_rate"] = (req - st["storage_rows"]) / req
    st["cache_hit_rate"] = st["gpu_hits"] / req
    st["hot_hit_rate"] = st["hot_hits"] / req
    st["victim_hit_rate"] = st["victim_hits"] / req
    return st


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/eviction_sim")
    p.add_argument("--scale", type=int, default=21)
    p.add_argument("--edge-factor", type=int, default=16)
    p.add_argument("--graph-seed", type=int, default=1, help="gnn_graph.generate's seed")
    p.add_argument("--width", type=int, default=128, help="float32 columns (rows a 4 KiB line = 4096 // (4 x width))")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5,5")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--seed", type=int, default=7, help="the batches' generator seed (feature_bench: 7)")
    p.add_argument("--cache-ratios", default="0.10,0.25", help="cache lines / table lines (device: 0.25)")
    p.add_argument("--hot-ratio", type=float, default=393216 / 4194304)
    p.add_argument("--victim-ratio", type=float, default=131072 / 4194304)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--policies", default=",".join(_line_cache.POLICIES))
    p.add_argument("--served", default="",
                   help="also the rates over each policy's first N batches, e.g. lru:114,hybrid:101,static:101 "
                        "(what a time box let each serve)")
    a = p.parse_args(argv)
    batches, score = load_trace(a)
    rpl = max(1, 4096 // (4 * a.width))
    n_lines = -(-len(score) // rpl)
    n_lines, line_score, hot = line_layout(score, rpl, int(round(a.hot_ratio * n_lines)))
    victim = int(round(a.victim_ratio * n_lines))
    print(f"{n_lines} lines of {rpl} rows; hot {len(hot)}, victim {victim}, window {a.window}; "
          f"{len(batches)} batches, {np.mean([len(b) for b in batches]):.0f} rows a batch")
    served = dict((k, int(v)) for k, v in (x.split(":") for x in a.served.split(",") if x))
    print(f"{'cache':>6} {'policy':>7} {'hit':>6} {'cache':>6} {'hot':>6} {'victim':>6} {'evict':>9} {'full at':>7}"
          f" {'s':>5}" + ("   over the first N batches: N hit cache" if served else ""))
    for ratio in [float(x) for x in a.cache_ratios.split(",")]:
        for policy in a.policies.split(","):
            t = time.perf_counter()
            s = simulate(batches, n_lines, line_score, hot, rpl, int(round(ratio * n_lines)), victim, a.window,
                         policy)
            print(f"{ratio:6.3f} {policy:>7} {s['hit_rate']:6.4f} {s['cache_hit_rate']:6.4f} {s['hot_hit_rate']:6.4f}"
                  f" {s['victim_hit_rate']:6.4f} {s['evictions']:9d} {str(s['full_at']):>7} {time.perf_counter() - t:5.1f}"
                  + _first(s["per_batch"], served.get(policy)), flush=True)


def _first(per_batch, n):
    if not n:
        return ""
    req, storage, cache = per_batch[:n].sum(axis=0)
    return f"   {n:4d} {(req - storage) / max(1, req):6.4f} {cache / max(1, req):6.4f}"


if __name__ == "__main__":
    sys.exit(main())
