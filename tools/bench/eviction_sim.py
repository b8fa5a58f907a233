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
The victim buffer serves rows two ways: at the miss path (``victim``: the
rows FeatureStore.stats() counts as victim_hits) and by restore_victims,
which copies the victims the next batch uses back into the cache ahead of it
(their rows then count as cache hits there; ``restored`` here: the rows of a
batch on lines restored for it, so ``victim`` + ``restored`` is what the
buffer served). The graph and the batches are kept in --dir for later runs.

Ablation (--ablation): for each policy, the hot-node buffer, the victim
buffer and the window on or off (all eight combinations: each alone, all on,
all off), one table. Off means as feature_bench.py's -nohot / -novictim /
-nowindow contenders: no hot lines (they may enter the cache instead), a
victim buffer of 0 lines, a window of 0 (no prefetch: hybrid is then the
static score's rank with recency for ties). A victim buffer without a window
keeps nothing (it takes only evicted lines the window reuses).

Workloads with reuse (--epochs, --order, --block): a fixed training set of
--train-nodes seeds (default --batches x --batch: --batches batches an
epoch) gone through --epochs times, reshuffled each epoch, each batch sampled
afresh (as a NeighborLoader with shuffle=True). --order random: seeds
shuffled over the whole set; --order bfs: the seeds sorted by a BFS order of
the graph (neighbours next to each other), cut into blocks of --block
batches, the blocks shuffled each epoch and the seeds inside a block (so the
--block consecutive batches of a block draw from one neighbourhood of the
graph and reuse each other's lines within the window: the locality knob;
--block 1: each batch one neighbourhood, no reuse across batches from it).
With --epochs 1 --order random (the defaults) the batches are the benchmark's
(random seeds a batch, with repeats across batches), as before.
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


def _legacy(a):
    return a.epochs == 1 and a.order == "random" and not a.train_nodes


def bfs_order(indptr, indices, root):
    """Node ids in BFS order from ``root`` over the out-edges (the sampler's
    direction), children of a node next to each other; nodes it does not reach
    after, in id order (ids are permuted: random)."""
    n = len(indptr) - 1
    seen = np.zeros(n, dtype=bool)
    seen[root] = True
    order, frontier = [np.array([root])], np.array([root])
    while len(frontier):
        start, end = indptr[frontier], indptr[frontier + 1]
        deg = end - start
        if deg.sum() == 0:
            break
        idx = np.repeat(start - np.concatenate(([0], np.cumsum(deg)[:-1])), deg) + np.arange(deg.sum())
        nbr = indices[idx]
        nbr = nbr[~seen[nbr]]
        _, first = np.unique(nbr, return_index=True)
        frontier = nbr[np.sort(first)]
        seen[frontier] = True
        order.append(frontier)
    order.append(np.flatnonzero(~seen))
    return np.concatenate(order)


def epoch_seeds(a, n, indptr, indices, rng):
    """The seeds of each batch of --epochs epochs over one training set."""
    train = rng.choice(n, size=min(n, a.train_nodes or a.batches * a.batch), replace=False)
    if a.order == "bfs":
        rank = np.empty(n, dtype=np.int64)
        rank[bfs_order(indptr, indices, int(np.argmax(np.diff(indptr))))] = np.arange(n)
        train = train[np.argsort(rank[train], kind="stable")]
    out = []
    for _ in range(a.epochs):
        if a.order == "bfs":
            size = a.block * a.batch
            blocks = [train[i:i + size] for i in range(0, len(train), size)]
            seeds = np.concatenate([rng.permutation(blocks[j]) for j in rng.permutation(len(blocks))])
        else:
            seeds = rng.permutation(train)
        out += [seeds[i:i + a.batch] for i in range(0, len(seeds), a.batch)]
    return out


def load_trace(a):
    """(batches of node ids, per-row score), made once and kept in --dir."""
    os.makedirs(a.dir, exist_ok=True)
    tag = f"s{a.scale}_e{a.edge_factor}"
    gpath = os.path.join(a.dir, f"graph_{tag}.npz")
    bpath = os.path.join(a.dir, f"batches_{tag}_b{a.batch}_f{a.fanouts}_n{a.batches}_g{a.seed}.npz")
    if not _legacy(a):
        bpath = bpath[:-4] + f"_E{a.epochs}_T{a.train_nodes}_{a.order}{a.block if a.order == 'bfs' else ''}.npz"
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
    if _legacy(a):
        seed_lists = (torch.randint(0, n, (a.batch,), generator=g) for _ in range(a.batches))
        what = f"{a.batches} of {a.batch} random seeds"
    else:
        t = time.perf_counter()
        seed_lists = [torch.from_numpy(x) for x in epoch_seeds(a, n, indptr.numpy(), indices.numpy(),
                                                                 np.random.default_rng(a.seed))]
        what = (f"{len(seed_lists)} of {a.batch} seeds: {a.epochs} epochs over {a.train_nodes or a.batches * a.batch}"
                f" seeds, order {a.order}" + (f", blocks of {a.block} batches" if a.order == "bfs" else "")
                + f" ({time.perf_counter() - t:.0f} s)")
    for seeds in seed_lists:
        batches.append(gnn_graph.sample(indptr, indices, seeds, fanouts, generator=g)[0].numpy())
    offs = np.cumsum([0] + [len(b) for b in batches])
    np.savez(bpath, nodes=np.concatenate(batches), offsets=offs, score=score)
    print(f"batches: {what}, fanouts ({a.fanouts}): "
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
              victims_stored=0, victims_restored=0, restored_hits=0)
    restored = np.zeros(n_lines, dtype=bool)  # lines restore_victims copied back for the next batch
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
        st["restored_hits"] += int((c & restored[lines]).sum())
        restored[:] = False
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
            restored[back[adm]] = True
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
    st["restored_hit_rate"] = st["restored_hits"] / req
    st["victims_dropped"] = victims.dropped
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
    p.add_argument("--ablation", action="store_true",
                   help="each policy with the hot buffer, the victim buffer and the window on or off (8 rows)")
    p.add_argument("--epochs", type=int, default=1, help="passes over one training set (see the doc)")
    p.add_argument("--train-nodes", type=int, default=0, help="seeds of the training set (0: --batches x --batch)")
    p.add_argument("--order", default="random", choices=("random", "bfs"),
                   help="an epoch's seed order: random, or bfs (blocks of --block batches from one neighbourhood)")
    p.add_argument("--block", type=int, default=4, help="--order bfs: batches a block (the locality knob)")
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
    if a.ablation:
        return ablation(a, batches, n_lines, line_score, hot, rpl, victim)
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


ABLATION = ((0, 0, 0, "all off"), (1, 0, 0, "hot alone"), (0, 1, 0, "victim alone"), (0, 0, 1, "window alone"),
            (1, 0, 1, "hot+window"), (0, 1, 1, "victim+window"), (1, 1, 0, "hot+victim"), (1, 1, 1, "all on"))


def ablation(a, batches, n_lines, line_score, hot, rpl, victim):
    """The eight on/off combinations of hot buffer, victim buffer and window, per policy and cache ratio."""
    is_hot = np.zeros(n_lines, dtype=bool)
    is_hot[hot] = True
    per = [np.unique(np.asarray(b, dtype=np.int64) // rpl) for b in batches]
    cold = np.mean([(~is_hot[u]).sum() for u in per])
    print(f"lines a batch: {np.mean([len(u) for u in per]):.0f} ({cold:.0f} not hot); the window's lines not hot "
          f"(window x that) against the cache: " + ", ".join(
              f"{a.window * cold / max(1, round(float(r) * n_lines)):.2f} at {r}" for r in a.cache_ratios.split(",")))
    print(f"{'cache':>6} {'policy':>7} {'config':>14} {'hit':>6} {'cache':>6} {'hot':>6} {'victim':>6} {'restor':>6}"
          f" {'stored':>8} {'restord':>8} {'dropped':>8} {'evict':>9} {'s':>5}")
    print("(victim: rows served from the victim buffer at the miss path; restor: rows of lines restored from it "
          "ahead of their batch, counted in cache; stored/restord/dropped: lines)")
    for ratio in [float(x) for x in a.cache_ratios.split(",")]:
        for policy in a.policies.split(","):
            for h, v, w, name in ABLATION:
                t = time.perf_counter()
                s = simulate(batches, n_lines, line_score, hot if h else hot[:0], rpl, int(round(ratio * n_lines)),
                             victim if v else 0, a.window if w else 0, policy)
                print(f"{ratio:6.3f} {policy:>7} {name:>14} {s['hit_rate']:6.4f} {s['cache_hit_rate']:6.4f}"
                      f" {s['hot_hit_rate']:6.4f} {s['victim_hit_rate']:6.4f} {s['restored_hit_rate']:6.4f}"
                      f" {s['victims_stored']:8d} {s['victims_restored']:8d} {s['victims_dropped']:8d}"
                      f" {s['evictions']:9d} {time.perf_counter() - t:5.1f}", flush=True)


def _first(per_batch, n):
    if not n:
        return ""
    req, storage, cache = per_batch[:n].sum(axis=0)
    return f"   {n:4d} {(req - storage) / max(1, req):6.4f} {cache / max(1, req):6.4f}"


if __name__ == "__main__":
    sys.exit(main())
