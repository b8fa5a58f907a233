#!/usr/bin/env python3
"""One feature cache shared by the GPUs (spillfs.gnn.ShardedFeatureStore) against
independent per-GPU caches (one spillfs.gnn.FeatureStore per GPU over the whole
table), same per-GPU budgets, same batches: issue 27's benchmark.

    # the several-GPU machine: one process per GPU (NCCL), table made by feature_bench.py's data step
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 4 tools/bench/sharded_feature_bench.py \\
        --dir /root/featbench --scale 22 --width 256 --gpu-cache 512M --host-bytes 1G --batches 40 \\
        --json-out $OUT/sharded_bench.json
    # anywhere, tiny, gloo on the CPU (a smoke run: launches 2 processes itself)
    python3 tools/bench/sharded_feature_bench.py --spawn 2 --dir /tmp/shbench --scale 12 --width 32 \\
        --batch 64 --batches 6 --gpu-cache 256K --host-bytes 256K

Each rank samples its own --batches batches of --batch seeds with --fanouts
(seeds differ per rank, as a DistributedSampler's would) and, per contender,
prefetches --window batches ahead and gathers every batch (a GraphSAGE step
on top with --train, when torch_geometric is importable; gradients all-reduced
by DDP where there are several ranks):

- shared: ShardedFeatureStore (--partition hash|range), each rank caching the
  lines it owns, misses asked of the owners in one all_to_all a batch;
- independent: FeatureStore on each rank, caching whatever its batches need
  (rows hot on several GPUs are cached on each).

Hot rows by reverse PageRank (score.npy, made once) fill 3/4 of --host-bytes on
each rank. Rank 0 prints and writes (--json-out) per contender: rows/s summed
over ranks, per-rank rows/s, hit rate (rows not read from storage), SSD reads
and bytes, bytes exchanged between ranks, epoch seconds (the slowest rank's).
Data: tools/bench/gnn_graph.py via feature_bench.py (kept in --dir).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import feature_bench  # noqa: E402
import gnn_graph  # noqa: E402
from sizes import parse_size  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(a, argv):
    """Launches --spawn ranks of this script on this host (what torchrun does)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(a.spawn),
               NCCL_NVLS_ENABLE="0")
    args = [x for i, x in enumerate(argv) if x != "--spawn" and (i == 0 or argv[i - 1] != "--spawn")
            and not x.startswith("--spawn=")]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(a.spawn)]
    rcs = [p.wait() for p in procs]
    return max(rcs)


def batches_of(a, rank, dev):
    indptr = torch.from_numpy(np.load(os.path.join(a.dir, "indptr.npy"))).to(dev)
    indices = torch.from_numpy(np.load(os.path.join(a.dir, "indices.npy"))).to(dev)
    n = len(indptr) - 1
    g = torch.Generator(device=dev)
    g.manual_seed(1000 + rank)
    fanouts = [int(x) for x in a.fanouts.split(",")]
    out = []
    for _ in range(a.batches):
        seeds = torch.randint(0, n, (a.batch,), device=dev, generator=g)
        nodes, edge_index, seed_local = gnn_graph.sample(indptr, indices, seeds, fanouts, generator=g)
        out.append((nodes.cpu(), edge_index.cpu(), seed_local.cpu()))
    return out


def run(a, contender, table, batches, dev, rank, world, score):
    from spillfs.gnn import FeatureStore, ShardedFeatureStore
    host = parse_size(a.host_bytes)
    row_bytes = np.load(table, mmap_mode="r").shape[1] * np.dtype(a.dtype).itemsize
    kw = dict(device=dev, gpu_cache_bytes=parse_size(a.gpu_cache), host_bytes=host,
              window=a.window, policy=a.policy, score=score, hot=int(host * 3 // 4 // row_bytes))
    if contender == "shared":
        store = ShardedFeatureStore(table, partition=a.partition, **kw)
    else:
        store = FeatureStore(table, **kw)
    model = opt = None
    if a.train:
        width = np.load(table, mmap_mode="r").shape[1]
        model = feature_bench.sage_model(width).to(dev)
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda"
                                                              else None)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    w = a.window
    for b in batches[:w]:
        store.prefetch(b[0])
    dist.barrier()
    rows = 0
    t0 = time.perf_counter()
    for i, (nodes, edge_index, seed_local) in enumerate(batches):
        if w:
            store.prefetch(batches[i + w][0] if i + w < len(batches) else nodes[:0])
        x = store.gather(nodes.to(dev))
        rows += len(nodes)
        if model is not None:
            y = (nodes[seed_local] % 16).to(dev)
            opt.zero_grad()
            logits = model(x.float(), edge_index.to(dev))[seed_local.to(dev)]
            torch.nn.functional.cross_entropy(logits, y).backward()
            opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    dist.barrier()
    epoch = time.perf_counter() - t0
    st = store.stats()
    sh = st.get("shard", st)
    out = {"contender": contender, "rank": rank, "rows": rows, "seconds": secs, "epoch_seconds": epoch,
           "rows_per_s": rows / secs, "requests": st["requests"],
           "storage_rows": sh["storage_rows"], "tier_requests": sh["requests"], "ssd_reads": sh["ssd_reads"],
           "ssd_bytes": sh["ssd_bytes"], "hot_hits": sh["hot_hits"], "victim_hits": sh["victim_hits"],
           "cache_hits": sh["gpu_hits"] + sh["cache_hits"], "bytes_exchanged": st.get("bytes_sent", 0),
           "exchange_seconds": st.get("exchange_seconds", 0.0), "remote_rows": st.get("remote_rows", 0),
           "remote_hits": st.get("remote_hits", 0), "served_rows": st.get("served_rows", 0)}
    store.close()
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/root/featbench")
    p.add_argument("--scale", type=int, default=22)
    p.add_argument("--edge-factor", type=int, default=16)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5,5")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--gpu-cache", default="512M")
    p.add_argument("--host-bytes", default="1G")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--policy", default="hybrid")
    p.add_argument("--partition", default="hash")
    p.add_argument("--contenders", default="independent,shared")
    p.add_argument("--train", action="store_true", help="a GraphSAGE step a batch (needs torch_geometric)")
    p.add_argument("--spawn", type=int, default=0, help="launch this many ranks here (no torchrun)")
    p.add_argument("--json-out")
    a = p.parse_args(argv)
    if a.spawn:
        return spawn(a, argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        os.environ["NCCL_NVLS_ENABLE"] = "0"
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:  # the data, once (feature_bench's: RMAT graph, table, reverse PageRank)
        os.makedirs(a.dir, exist_ok=True)
        meta = feature_bench.ensure_data(a)
        feature_bench.make_scores(a)
    dist.barrier()
    if rank != 0:
        meta = json.load(open(os.path.join(a.dir, "meta.json")))
    table = os.path.join(a.dir, "feat.npy")
    score = np.load(os.path.join(a.dir, "score.npy"))
    batches = batches_of(a, rank, dev)
    if a.train:
        try:
            import torch_geometric  # noqa: F401
        except ImportError:
            if rank == 0:
                print("# no torch_geometric: gathers only", flush=True)
            a.train = False
    results = []
    for c in a.contenders.split(","):
        mine = run(a, c, table, batches, dev, rank, world, score)
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        rows = sum(r["rows"] for r in everyone)
        storage = sum(r["storage_rows"] for r in everyone)
        asked = sum(r["requests"] for r in everyone)
        summary = {"contender": c, "world_size": world, "device": str(dev.type), "rows": rows,
                   "rows_per_s": sum(r["rows_per_s"] for r in everyone),
                   "epoch_seconds": max(r["epoch_seconds"] for r in everyone),
                   "hit_rate": 1 - storage / asked if asked else 0.0,
                   "ssd_reads": sum(r["ssd_reads"] for r in everyone),
                   "ssd_bytes": sum(r["ssd_bytes"] for r in everyone),
                   "bytes_exchanged": sum(r["bytes_exchanged"] for r in everyone),
                   "remote_rows": sum(r["remote_rows"] for r in everyone),
                   "remote_hits": sum(r["remote_hits"] for r in everyone), "ranks": everyone}
        results.append(summary)
        if rank == 0:
            print(json.dumps({k: v for k, v in summary.items() if k != "ranks"}), flush=True)
    if rank == 0:
        print("\n%-12s %6s %12s %8s %10s %12s %12s" % ("contender", "ranks", "rows/s", "hit", "epoch s", "ssd MB",
                                                       "exchanged MB"))
        for r in results:
            print("%-12s %6d %12.0f %8.3f %10.3f %12.1f %12.1f" % (
                r["contender"], r["world_size"], r["rows_per_s"], r["hit_rate"], r["epoch_seconds"],
                r["ssd_bytes"] / 1e6, r["bytes_exchanged"] / 1e6))
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump({"meta": meta, "args": vars(a), "results": results}, f, indent=1, default=str)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
