#!/usr/bin/env python3
"""GNN feature gathers from storage: the mmap baseline against spillfs.gnn.FeatureStore
(each eviction policy, with and without the hot-node and victim buffers and the
window) and the raw 4 KiB random-read IOPS of the device, in one run.

    python3 tools/bench/feature_bench.py --dir /root/featbench --scale 22 --width 256 \\
        --gpu-cache 512M --host-bytes 1G --seconds 20 --json-out $OUT/feature_bench.json

1. Data (tools/bench/gnn_graph.py; kept in --dir for later runs with the same
   parameters): an RMAT graph (Graph500 parameters) of 2^scale nodes in CSR and
   its (nodes, width) feature table feat.npy.
2. --batches batches of --batch seed nodes, sampled on the GPU with --fanouts
   (uniform, with replacement): the same node lists for every contender.
3. Each contender runs in a child process in a cgroup whose memory.max (page
   cache included) is --memory-max (default: host-bytes + 3 GiB, what the
   FeatureStore's pinned buffers and the CUDA context also live in), after the
   page cache was dropped, for --seconds at most:
   - mmap: np.load(mmap_mode="r")[nodes] then .to("cuda") (the usual PyG path);
   - fs-<policy>[-nohot][-novictim][-nowindow]: FeatureStore(device="cuda")
     with prefetch of the next --window batches; hot rows by reverse PageRank
     (20 iterations, damping 0.85, on the GPU, computed once by the parent)
     filling 3/4 of --host-bytes;
   - raw: spill_file_read_rows of 4 KiB rows at random offsets of feat.npy
     (io_uring O_DIRECT, queue depth 128): the device's random-read IOPS;
   - train-mmap, train-fs-hybrid: a 3-layer GraphSAGE (PyG SAGEConv) step per
     batch on top of the gathers (when torch_geometric is importable).
   With --mount (root, /dev/fuse, SPILLFS_BIN or build/bin/spillfs), the table is
   also copied into a spillfs volume made under --dir and mmap and fs-hybrid
   run there too (the direct path, block checksums verified).
4. Prints one line per contender and --json-out writes them: rows/s, useful
   GB/s, hit rates per tier, SSD read amplification, stall seconds, ratios to
   mmap and to the raw IOPS.

Sized for the GPU machine's 64 GB disk by --scale/--width (table bytes =
2^scale x width x 4 for float32). A quick run: --scale 21 --width 128 (1 GiB
table), --seconds 10, --batches 30.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gnn_graph  # noqa: E402

GIB = 1 << 30


def parse_size(text):
    text = str(text).strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# ---- the parent: data, batches, cgroup, children -------------------------------


def ensure_data(a):
    meta_path = os.path.join(a.dir, "meta.json")
    want = {"scale": a.scale, "edge_factor": a.edge_factor, "width": a.width, "dtype": a.dtype}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if {k: meta.get(k) for k in want} == want:
            return meta
    info = gnn_graph.generate(a.dir, a.scale, a.edge_factor, a.width, getattr(torch, a.dtype))
    meta = dict(want, **info)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return meta


def make_batches(a):
    path = os.path.join(a.dir, f"batches_{a.batch}_{a.fanouts}_{a.batches}.pt")
    if os.path.exists(path):
        return path
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    indptr = torch.from_numpy(np.load(os.path.join(a.dir, "indptr.npy"))).to(dev)
    indices = torch.from_numpy(np.load(os.path.join(a.dir, "indices.npy"))).to(dev)
    n = len(indptr) - 1
    g = torch.Generator(device=dev)
    g.manual_seed(7)
    fanouts = [int(x) for x in a.fanouts.split(",")]
    batches = []
    for _ in range(a.batches):
        seeds = torch.randint(0, n, (a.batch,), device=dev, generator=g)
        nodes, edge_index, seed_local = gnn_graph.sample(indptr, indices, seeds, fanouts, generator=g)
        batches.append((nodes.cpu(), edge_index.cpu(), seed_local.cpu()))
    torch.save(batches, path)
    return path


def make_scores(a):
    """Reverse PageRank of the graph (20 iterations, damping 0.85, torch ops on
    the GPU), once: score.npy, what the hot-node buffer is chosen by."""
    from spillfs.gnn import reverse_pagerank
    path = os.path.join(a.dir, "score.npy")
    if os.path.exists(path):
        return None
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    indptr = np.load(os.path.join(a.dir, "indptr.npy"))
    indices = np.load(os.path.join(a.dir, "indices.npy"))
    t = time.perf_counter()
    score = reverse_pagerank(indptr, indices, device=dev)
    seconds = time.perf_counter() - t
    np.save(path, score)
    return seconds


def setup_cgroup(limit):
    """A cgroup v2 with memory.max = limit; its path, or (None, why not)."""
    base = "/sys/fs/cgroup"
    try:
        with open(os.path.join(base, "cgroup.controllers")) as f:
            if "memory" not in f.read().split():
                return None, "no memory controller in cgroup v2"
        try:
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        except OSError:
            pass
        path = os.path.join(base, f"spillfs-featbench-{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "memory.max"), "w") as f:
            f.write(str(limit))
        return path, None
    except OSError as e:
        return None, f"cgroup unavailable: {e}"


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def run_child(a, contender, table, batches, cgroup, label):
    env = dict(os.environ)
    if cgroup:
        env["FEATBENCH_CGROUP"] = cgroup
    drop_caches()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", contender, "--table", table, "--batches-file",
           batches] + a.child_args
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.seconds * 4 + 300)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
    if result is None:
        result = {"error": (proc.stderr or proc.stdout)[-2000:], "rc": proc.returncode}
    result.update(contender=contender, place=label, wall_seconds=time.time() - t0)
    return result


def make_mount(a, table):
    binary = os.environ.get("SPILLFS_BIN", os.path.join(ROOT, "build", "bin", "spillfs"))
    vol, mnt = os.path.join(a.dir, "vol"), os.path.join(a.dir, "mnt")
    subprocess.run([binary, "umount", mnt], capture_output=True)
    shutil.rmtree(vol, ignore_errors=True)
    os.makedirs(mnt, exist_ok=True)
    size = os.path.getsize(table)
    gib = max(2, int(size * 1.3 / GIB) + 2)
    subprocess.run([binary, "mkfs", vol, "--size", f"{gib}G"], check=True, capture_output=True)
    subprocess.run([binary, "mount", vol, mnt], check=True, capture_output=True)
    dst = os.path.join(mnt, "feat.npy")
    shutil.copyfile(table, dst)
    with open(dst, "rb") as f:
        os.fsync(f.fileno())
    return binary, mnt, dst


def parent(a):
    os.makedirs(a.dir, exist_ok=True)
    meta = ensure_data(a)
    table = os.path.join(a.dir, "feat.npy")
    batches = make_batches(a)
    pagerank_seconds = make_scores(a)
    if pagerank_seconds is not None:
        meta["pagerank_seconds"] = pagerank_seconds
    host = parse_size(a.host_bytes)
    limit = parse_size(a.memory_max) if a.memory_max != "auto" else host + 3 * GIB
    cgroup, why = setup_cgroup(limit)
    a.child_args = ["--gpu-cache", a.gpu_cache, "--host-bytes", a.host_bytes, "--seconds", str(a.seconds),
                    "--window", str(a.window), "--graph-dir", a.dir]
    print(f"# table {meta['table_bytes'] / GIB:.2f} GiB, {meta['nodes']} nodes, {meta['edges']} edges; "
          f"memory.max {limit / GIB:.2f} GiB ({cgroup or why})", flush=True)
    contenders = a.contenders.split(",")
    try:
        import torch_geometric  # noqa: F401,F811
    except ImportError:
        skipped = [c for c in contenders if c.startswith("train-")]
        if skipped:
            print(f"# no torch_geometric: skipping {', '.join(skipped)}", flush=True)
        contenders = [c for c in contenders if not c.startswith("train-")]
    results = []
    places = [("ext4", table)]
    mount = None
    if a.mount:
        mount = make_mount(a, table)
        places.append(("mount", mount[2]))
    try:
        for label, path in places:
            for c in contenders:
                if label == "mount" and c not in ("mmap", "fs-hybrid", "raw"):
                    continue
                r = run_child(a, c, path, batches, cgroup, label)
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        if mount:
            subprocess.run([mount[0], "umount", mount[1]], capture_output=True)
        if cgroup:
            try:
                os.rmdir(cgroup)
            except OSError:
                pass
    summarize(results, meta, limit, cgroup or why, a)


def summarize(results, meta, limit, cgroup, a):
    by = {(r["place"], r["contender"]): r for r in results}
    for r in results:
        base = by.get((r["place"], "mmap"), {}).get("rows_per_s")
        raw = by.get((r["place"], "raw"), {}).get("iops")
        if base and r.get("rows_per_s"):
            r["x_mmap"] = r["rows_per_s"] / base
        if raw and r.get("ssd_reads_per_s"):
            r["ssd_iops_of_raw"] = r["ssd_reads_per_s"] / raw
    print("\n%-24s %-6s %12s %9s %8s %8s %8s %8s" % ("contender", "place", "rows/s", "GB/s", "hit", "x mmap",
                                                     "amplif", "iops/raw"))
    for r in results:
        print("%-24s %-6s %12.0f %9.3f %8.3f %8.1f %8.2f %8.2f" % (
            r["contender"], r["place"], r.get("rows_per_s", r.get("iops", 0)), r.get("useful_gb_s", 0),
            r.get("hit_rate", 0), r.get("x_mmap", 0), r.get("read_amplification", 0), r.get("ssd_iops_of_raw", 0)))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"meta": meta, "memory_max": limit, "cgroup": cgroup, "args": vars(a), "results": results}, f,
                      indent=1, default=str)


# ---- the children: one contender each -------------------------------------------


def join_cgroup():
    cg = os.environ.get("FEATBENCH_CGROUP")
    if cg:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def sage_model(width, hidden=256, classes=16):
    from torch_geometric.nn import SAGEConv

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([SAGEConv(width, hidden), SAGEConv(hidden, hidden),
                                              SAGEConv(hidden, classes)])

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = torch.relu(x)
            return x
    return Sage()


def child(a):
    join_cgroup()
    from spillfs._table import RowReader, open_table
    from spillfs.gnn import FeatureStore
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke run
    info = open_table(a.table)
    batches = torch.load(a.batches_file)
    c = a.child
    out = {"table": a.table}
    deadline = time.perf_counter() + a.seconds
    if c == "raw":
        reader = RowReader(open_table(a.table, shape=(-1, 1024), dtype=np.float32, offset=4096, raw=True))
        n_blocks = (os.path.getsize(a.table) - 4096) // 4096
        rng = np.random.default_rng(3)
        ios = 0
        t0 = time.perf_counter()
        per_call = int(max(1, min(1 << 16, n_blocks // 64)))
        while time.perf_counter() < deadline:
            # Distinct blocks, none adjacent: every one a 4 KiB I/O of its own.
            rows = np.unique(2 * rng.integers(0, max(1, n_blocks // 2), per_call))
            before = reader.ios
            reader.read(rows)
            ios += reader.ios - before
        secs = time.perf_counter() - t0
        out.update(iops=ios / secs, gb_s=ios * 4096 / secs / 1e9, seconds=secs, backend=reader.backend)
        print(json.dumps(out))
        return
    train = c.startswith("train-")
    feat = c[len("train-"):] if train else c
    model = opt = None
    if train:
        model = sage_model(info.width).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    store = None
    if feat == "mmap":
        arr = np.load(a.table, mmap_mode="r")
    else:
        parts = feat.split("-")
        policy = parts[1]
        hot = "nohot" not in parts
        window = 0 if "nowindow" in parts else a.window
        host = parse_size(a.host_bytes)
        kwargs = {}
        if hot:  # computed by the parent, outside the cgroup (make_scores)
            score = np.load(os.path.join(a.graph_dir, "score.npy"))
            kwargs.update(score=score, hot=int(host * 3 // 4 // info.row_bytes))
        victim = None if "novictim" not in parts else 0
        store = FeatureStore(a.table, device=dev, gpu_cache_bytes=parse_size(a.gpu_cache), host_bytes=host,
                             window=window, policy=policy, victim_bytes=victim, **kwargs)
        for b in batches[:window]:
            store.prefetch(b[0])
    rows = batches_done = 0
    step_seconds = []
    t0 = time.perf_counter()
    half = None
    i = 0
    while time.perf_counter() < deadline:
        nodes, edge_index, seed_local = batches[i % len(batches)]
        tb = time.perf_counter()
        if store is None:
            idx = nodes.numpy()
            chunks = []
            for s in range(0, len(idx), 4096):  # bounded steps: the deadline holds
                chunks.append(torch.from_numpy(np.ascontiguousarray(arr[idx[s:s + 4096]])).to(dev))
                rows += len(idx[s:s + 4096])
                if time.perf_counter() >= deadline:
                    break
            x = torch.cat(chunks)
            complete = len(x) == len(idx)
        else:
            if store.window_size:
                store.prefetch(batches[(i + store.window_size) % len(batches)][0])
            x = store.gather(nodes.to(dev))
            rows += len(nodes)
            complete = True
        if train and complete:
            y = (nodes[seed_local] % 16).to(dev)
            opt.zero_grad()
            logits = model(x.float(), edge_index.to(dev))[seed_local.to(dev)]
            loss = torch.nn.functional.cross_entropy(logits, y)
            loss.backward()
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if complete:
            batches_done += 1
            step_seconds.append(time.perf_counter() - tb)
        i += 1
        if half is None and time.perf_counter() - t0 > a.seconds / 2:
            half = (rows, time.perf_counter())
    secs = time.perf_counter() - t0
    out.update(rows=rows, seconds=secs, rows_per_s=rows / secs, useful_gb_s=rows * info.row_bytes / secs / 1e9,
               batches=batches_done, mean_rows_per_batch=float(np.mean([len(b[0]) for b in batches])),
               step_seconds=float(np.median(step_seconds)) if step_seconds else None)
    if half is not None:
        out["rows_per_s_second_half"] = (rows - half[0]) / max(1e-9, time.perf_counter() - half[1])
    if store is not None:
        st = store.stats()
        out.update({k: st[k] for k in ("requests", "gpu_hits", "hot_hits", "victim_hits", "storage_rows",
                                       "ssd_reads", "ssd_bytes", "read_amplification", "hit_rate", "stalls",
                                       "stall_seconds", "evictions", "victims_stored", "cache_lines",
                                       "hot_lines", "victim_lines", "backend")})
        req = max(1, st["requests"])
        out.update(gpu_hit_rate=st["gpu_hits"] / req, hot_hit_rate=st["hot_hits"] / req,
                   victim_hit_rate=st["victim_hits"] / req, ssd_reads_per_s=st["ssd_reads"] / secs)
        store.close()
    print(json.dumps(out))


def main(argv=None):
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
    p.add_argument("--memory-max", default="auto")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--contenders", default="raw,mmap,fs-hybrid,fs-lru,fs-static,fs-hybrid-nohot-novictim-nowindow,"
                                           "train-mmap,train-fs-hybrid")
    p.add_argument("--mount", action="store_true")
    p.add_argument("--json-out")
    # Children.
    p.add_argument("--child")
    p.add_argument("--table")
    p.add_argument("--batches-file")
    p.add_argument("--graph-dir")
    a = p.parse_args(argv)
    if a.child:
        child(a)
    else:
        parent(a)


if __name__ == "__main__":
    sys.exit(main())
