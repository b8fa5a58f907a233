#!/usr/bin/env python3
"""GNN feature gathers from storage: the mmap baseline against spillfs.gnn.FeatureStore
(each eviction policy, with and without the hot-node and victim buffers and the
window), the raw 4 KiB random-read IOPS of the device, cached gathers against HBM
bandwidth, and GraphSAGE training over the same batches, in one run.

    python3 tools/bench/feature_bench.py --dir /root/featbench --json-out $OUT/feature_bench.json \\
        --png-out $OUT/feature_bench.png            # the issue's scale and budgets (defaults)
    python3 tools/bench/feature_bench.py --device cpu --dir /tmp/fb --scale 14 --width 64 \\
        --gpu-cache 4M --host-bytes 2M --memory-max none --seconds 3 --batches 20 --train-batches 4 \\
        --hbm-copy-bytes 32M --hbm-cached 2M --model torch     # a smoke run without a GPU

1. Data (tools/bench/gnn_graph.py; kept in --dir for later runs with the same
   parameters): an RMAT graph (Graph500 parameters) of 2^scale nodes in CSR and
   its (nodes, width) feature table feat.npy, generated on the GPU in chunks
   and written with O_DIRECT (host memory bounded whatever the table's size).
   Defaults: scale 25 (33.5 M nodes, 537 M edges), 128 float32 columns: a
   17.2 GB table (bytes = 2^scale x width x 4), 2.4 GB of CSR.
2. --batches batches of --batch seed nodes, sampled on the device with
   --fanouts (gnn_graph.sample: uniform, with replacement, torch ops): the same
   node lists for every contender, each gone through once (never wrapped: a
   cache that saw the list would make later passes hits); the first
   --train-batches keep their edge_index for training.
3. Each contender runs in a child process in a cgroup whose memory.max (page
   cache included) is --memory-max (default 4G: the issue's budget; "none":
   no cgroup), after the page cache was dropped, for --seconds at most (the time
   box; setup such as filling the hot buffer is outside it and reported):
   - raw: spill_file_read_rows of 4 KiB rows at random offsets of feat.npy
     (io_uring O_DIRECT, queue depth 128): the device's random-read IOPS;
   - mmap: np.load(mmap_mode="r")[nodes] then .to(device) (the usual PyG path);
   - fs-<policy>[-nohot][-novictim][-nowindow]: FeatureStore(device) with
     --gpu-cache of HBM and --host-bytes of pinned host memory, prefetch of
     the next --window batches; hot rows by reverse PageRank (20 iterations,
     damping 0.85, computed once by the parent on the device) filling 3/4 of
     --host-bytes (the victim buffer a quarter);
   - hbm (outside the cgroup): a FeatureStore whose GPU cache holds --hbm-cached
     bytes of random lines (warmed by gathering them, checked to be all cache
     hits), timed gathers of batches of only those rows (a sampled batch's
     size and up to 2^20 rows) against a device-to-device copy of
     --hbm-copy-bytes (dst.copy_(src)) and torch.index_select on a table
     tensor in HBM of --gpu-cache bytes. Bytes counted: read + write, i.e. 2 x
     the row bytes a row (2 x the bytes for the copy); indices not counted;
   - train-mmap, train-fs-hybrid: a 3-layer GraphSAGE (PyG SAGEConv, hidden
     256, 16 classes, Adam) step per batch on the gathered features, over the
     first --train-batches batches (the "epoch": those batches, not the whole
     graph). Where the time box ends first, the epoch time is estimated (and
     flagged) as batches x (rows a batch / the rows/s gathered + the mean
     compute step). --model torch: the same mean-aggregation layer in plain
     torch (where PyG is absent); without PyG and without it these skip.
   With --mount (root, /dev/fuse, SPILLFS_BIN or build/bin/spillfs), after the
   ext4 place's contenders, a spillfs volume is made under --dir (mkfs
   --no-dedup: the generated rows repeat every 1021 rows, which dedup would
   fold) and fs-hybrid, mmap and raw run there too (--places mount: only
   there; the FeatureStore reads the ext4 file with io_uring O_DIRECT, the
   mount's through the direct path). --mount-table copy (the default) copies
   the ext4 table in: two copies on the disk, about 2 minutes at 17 GB.
   --mount-table generate writes the table into the volume as gnn_graph
   wrote the ext4 one (the same rows; O_DIRECT through the mount), deleting
   the ext4 table first where both do not fit, and removes the volume at the
   end: so a 20-40 GB table (--width 160-256, or --width auto: the widest
   that fits) runs on both places of the 64 GB disk. The GPU machine's run
   of the issue's 20-40 GB configuration, in one call of about 7.5 minutes:

       python3 tools/bench/feature_bench.py --dir /root/featbench --width auto --places ext4,mount \
           --mount-table generate --seconds 15 --budget-seconds 470 --json-out $OUT/feature_bench.json \
           --png-out $OUT/feature_bench.png   # = PRESET=big tools/bench/feature_device_run.sh
4. Prints a table (rows/s, useful GB/s, hit rate per tier, read amplification,
   x mmap, the miss path's IOPS while it reads = ssd_reads / stall_seconds
   and against raw, and the run-averaged ssd_reads / run seconds), then the HBM
   and training tables. --json-out is rewritten after every contender (a run
   cut short keeps what it measured); --png-out draws rows/s (log axis), hit
   rates per tier, HBM GB/s and epoch times.

Splitting the run: --parts (data, gather, hbm, train: data alone makes the
data and exits) and --contenders pick what runs; --budget-seconds skips the
contenders that would no longer fit (said so); --merge A.json B.json ...
joins the JSONs of split runs into one table, --json-out and --png-out.
"""

import argparse
import json
import math
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
from sizes import parse_size  # noqa: E402

GIB = 1 << 30
START = time.time()
DEFAULT_CONTENDERS = ("raw,fs-hybrid,mmap,fs-lru,fs-static,hbm,train-fs-hybrid,train-mmap,"
                      "fs-hybrid-nohot-novictim-nowindow")


def part_of(contender):
    if contender.startswith("train-"):
        return "train"
    if contender == "hbm":
        return "hbm"
    return "gather"


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (--device cpu runs the smoke mode)")
    return name


def log(msg):
    print(f"# [{time.time() - START:6.1f} s] {msg}", flush=True)


# ---- the parent: data, batches, cgroup, children -------------------------------


def ensure_data(a):
    meta_path = os.path.join(a.dir, "meta.json")
    want = {"scale": a.scale, "edge_factor": a.edge_factor, "width": a.width, "dtype": a.dtype}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if {k: meta.get(k) for k in want} == want and os.path.exists(os.path.join(a.dir, "feat.npy")):
            log(f"data: reusing {a.dir} (generated in {meta.get('graph_seconds', 0):.1f} + "
                f"{meta.get('table_seconds', 0):.1f} s)")
            return meta
        os.unlink(meta_path)  # a half-written or other data set: made again
    for f in ("score.npy",):
        if os.path.exists(os.path.join(a.dir, f)):
            os.unlink(os.path.join(a.dir, f))
    for f in os.listdir(a.dir):
        if f.startswith(("batches_", "hot_")):
            os.unlink(os.path.join(a.dir, f))
    need = gnn_graph.bytes_needed(a.scale, a.edge_factor, a.width, getattr(torch, a.dtype))
    log(f"data: generating scale {a.scale} width {a.width} {a.dtype} on {a.device} "
        f"({need / 1e9:.1f} GB into {a.dir})")
    info = gnn_graph.generate(a.dir, a.scale, a.edge_factor, a.width, getattr(torch, a.dtype), device=a.device)
    meta = dict(want, **info)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    log(f"data: graph {info['graph_seconds']:.1f} s, table {info['table_seconds']:.1f} s "
        f"({info['table_bytes'] / 1e9 / max(1e-9, info['table_seconds']):.2f} GB/s, {info['table_write']})")
    return meta


def batches_path(a):
    return os.path.join(a.dir, f"batches_{a.batch}_{a.fanouts}_{a.batches}_{a.train_batches}.npz")


def make_batches(a):
    """The sampled batches, once: nodes (int32, flat, with offsets) of every
    batch; edge_index and the seeds' local ids of the first --train-batches."""
    path = batches_path(a)
    if os.path.exists(path):
        return path
    t = time.perf_counter()
    dev = a.device
    indptr = torch.from_numpy(np.load(os.path.join(a.dir, "indptr.npy"))).to(dev)
    indices = torch.from_numpy(np.load(os.path.join(a.dir, "indices.npy"))).to(dev)
    n = len(indptr) - 1
    g = torch.Generator(device=dev)
    g.manual_seed(7)
    fanouts = [int(x) for x in a.fanouts.split(",")]
    nodes_all, eis, seeds_local = [], [], []
    for i in range(a.batches):
        seeds = torch.randint(0, n, (a.batch,), device=dev, generator=g)
        nodes, edge_index, seed_local = gnn_graph.sample(indptr, indices, seeds, fanouts, generator=g)
        nodes_all.append(nodes.to(torch.int32).cpu().numpy())
        if i < a.train_batches:
            eis.append(edge_index.to(torch.int32).cpu().numpy())
            seeds_local.append(seed_local.cpu().numpy())
    del indptr, indices
    off = lambda parts: np.cumsum([0] + [p.shape[-1] for p in parts]).astype(np.int64)  # noqa: E731
    tmp = path + ".tmp.npz"
    np.savez(tmp, nodes=np.concatenate(nodes_all), offsets=off(nodes_all),
             ei=np.concatenate(eis, axis=1) if eis else np.zeros((2, 0), np.int32), ei_offsets=off(eis),
             seeds=np.concatenate(seeds_local) if seeds_local else np.zeros(0, np.int64),
             seed_offsets=off(seeds_local))
    os.replace(tmp, path)
    if dev == "cuda":
        torch.cuda.empty_cache()
    rows = np.diff(off(nodes_all))
    log(f"batches: {a.batches} of {a.batch} seeds, fanouts ({a.fanouts}): {rows.mean():.0f} rows a batch "
        f"(min {rows.min()}, max {rows.max()}), sampled in {time.perf_counter() - t:.1f} s")
    return path


def load_batches(path, with_train=True):
    z = np.load(path)
    nodes, offs = z["nodes"], z["offsets"]
    batches = [nodes[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    if not with_train:  # the edges stay on disk (memory.max counts what a child holds)
        return batches, []
    ei, eo, seeds, so = z["ei"], z["ei_offsets"], z["seeds"], z["seed_offsets"]
    train = [(batches[i], ei[:, eo[i]:eo[i + 1]], seeds[so[i]:so[i + 1]]) for i in range(len(eo) - 1)]
    return batches, train


def make_scores(a):
    """Reverse PageRank of the graph (20 iterations, damping 0.85, torch ops on
    the device), once: score.npy, what the hot-node buffer is chosen by."""
    from spillfs.gnn import reverse_pagerank
    path = os.path.join(a.dir, "score.npy")
    if os.path.exists(path):
        return None
    indptr = np.load(os.path.join(a.dir, "indptr.npy"))
    indices = np.load(os.path.join(a.dir, "indices.npy"))
    t = time.perf_counter()
    score = reverse_pagerank(indptr, indices, device=a.device)
    seconds = time.perf_counter() - t
    np.save(path, score)
    if a.device == "cuda":
        torch.cuda.empty_cache()
    log(f"reverse PageRank: {seconds:.1f} s")
    return seconds


def hot_count(host_bytes, row_bytes):
    """Hot rows: as many as fill 3/4 of the host budget (the victim buffer the rest)."""
    return int(host_bytes * 3 // 4 // row_bytes)


def hot_rows_path(graph_dir, k):
    return os.path.join(graph_dir, f"hot_{k}.npy")


def hot_rows(a, row_bytes):
    """The top rows by reverse PageRank, best first (what FeatureStore(hot=k,
    score=...) picks), once in the parent: the children, in the cgroup, need
    not sort the whole score."""
    k = hot_count(parse_size(a.host_bytes), row_bytes)
    path = hot_rows_path(a.dir, k)
    if not os.path.exists(path):
        score = torch.from_numpy(np.load(os.path.join(a.dir, "score.npy"))).to(a.device)
        order = torch.sort(-score, stable=True).indices[:k]  # = np.argsort(-score, kind="stable")[:k]
        np.save(path, order.cpu().numpy())
        del score, order
        if a.device == "cuda":
            torch.cuda.empty_cache()
    return path


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
    if cgroup and contender != "hbm":
        env["FEATBENCH_CGROUP"] = cgroup
    dropped = drop_caches()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", contender, "--table", table, "--batches-file",
           batches] + a.child_args
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(a.seconds * 2, a.seconds + 120))
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr, rc = "timed out", "timeout"
    result = None
    for line in stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
    if result is None:
        result = {"error": (stderr or stdout)[-2000:], "rc": rc}
    result.update(contender=contender, place=label, wall_seconds=time.time() - t0, page_cache_dropped=dropped)
    return result


MOUNT_CONTENDERS = ("fs-hybrid", "mmap", "raw")  # what runs on the mount place, in this order
AUTO_WIDTHS = (256, 192, 160, 128)
MOUNT_WRITE_GB_S = {"generate": 1.0, "copy": 0.14}  # for the budget: the last runs, rounded down


def slack_bytes(table_bytes):
    """Room kept free beside a table (the volume's index, the file systems' own
    needs): 2 GiB at the issue's scale, a quarter of a small table (256 MiB at
    least)."""
    return min(2 * GIB, max(256 << 20, table_bytes // 4))


def mount_paths(a):
    binary = os.environ.get("SPILLFS_BIN", os.path.join(ROOT, "build", "bin", "spillfs"))
    return binary, os.path.join(a.dir, "vol"), os.path.join(a.dir, "mnt")


def clear_mount(a):
    """Unmounts and removes the volume this script made under --dir (a run's
    own scratch: vol/ and mnt/), if one is there."""
    binary, vol, mnt = mount_paths(a)
    if os.path.ismount(mnt):
        subprocess.run([binary, "umount", mnt], capture_output=True)
    if os.path.isdir(vol):
        shutil.rmtree(vol, ignore_errors=True)
        return True
    return False


def disk_bytes(path):
    """Bytes a file or a tree takes on the disk (allocated blocks: a sparse volume image counts what it holds)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def resolve_width(a, mount):
    """--width auto: the widest of AUTO_WIDTHS whose data fits the free space
    of --dir (what earlier runs left there that this one replaces counted as
    free): the table and the CSR (gnn_graph.bytes_needed), the scores and
    batches (16 bytes a node and 256 MiB), a second table where --mount-table
    copy puts one in the volume beside the ext4 one, and slack_bytes.
    --mount-table generate needs no second copy: the ext4 table is deleted
    before the volume's is written, where both do not fit."""
    if a.width != "auto":
        a.width = int(a.width)
        return None
    dtype = getattr(torch, a.dtype)
    free = shutil.disk_usage(a.dir).free
    reuse = sum(disk_bytes(os.path.join(a.dir, f)) for f in ("feat.npy", "indptr.npy", "indices.npy")
                if os.path.exists(os.path.join(a.dir, f)))
    if mount and os.path.isdir(os.path.join(a.dir, "vol")):
        reuse += disk_bytes(os.path.join(a.dir, "vol"))  # removed before the data is made (clear_mount)
    copies = 2 if mount and a.mount_table == "copy" else 1
    itemsize = torch.empty(0, dtype=dtype).element_size()
    rows = []
    for w in AUTO_WIDTHS:
        table = 4096 + (1 << a.scale) * w * itemsize
        need = gnn_graph.bytes_needed(a.scale, a.edge_factor, w, dtype) + (16 << a.scale) + (256 << 20) + \
            (copies - 1) * table + slack_bytes(table)
        rows.append({"width": w, "table_bytes": table, "need_bytes": need})
        if need <= free + reuse:
            a.width = w
            break
    else:
        raise SystemExit(f"--width auto: none of {AUTO_WIDTHS} columns at scale {a.scale} fits the "
                         f"{(free + reuse) / GIB:.1f} GiB free in {a.dir} (the smallest needs "
                         f"{rows[-1]['need_bytes'] / GIB:.1f} GiB)")
    log(f"--width auto: {a.width} columns, a {rows[-1]['table_bytes'] / 1e9:.1f} GB table ({copies} "
        f"cop{'y' if copies == 1 else 'ies'} on the disk at once; {(free + reuse) / GIB:.1f} GiB free in {a.dir} "
        f"counting {reuse / GIB:.1f} GiB of earlier data, {rows[-1]['need_bytes'] / GIB:.1f} GiB needed)")
    return {"free_bytes": free, "reusable_bytes": reuse, "copies": copies, "chosen": a.width, "tried": rows}


def check_rows(path, meta, n=64):
    """A few rows of a table against what gnn_graph wrote (each row a function of its index)."""
    arr = np.load(path, mmap_mode="r")
    rows = np.unique(np.concatenate([[0, len(arr) - 1], np.random.default_rng(5).integers(0, len(arr), n)]))
    want = gnn_graph.expected_rows(torch.from_numpy(rows), meta["width"], getattr(torch, meta["dtype"])).numpy()
    if arr.shape != (meta["nodes"], meta["width"]) or not np.array_equal(np.asarray(arr[rows]), want):
        raise RuntimeError(f"{path}: the table's rows are not the generated ones")
    del arr


def make_mount(a, meta, table):
    """The mount place: a spillfs volume made under --dir (mkfs --no-dedup: the
    generated rows repeat every 1021 rows, so dedup would fold the table into
    about 1021 256-KiB units and the mount would read a few hundred MB of the
    disk where ext4 reads the whole table; the image file is sparse), mounted,
    and the table put in it: copied from the ext4 table (--mount-table copy),
    or generated straight into it (generate: gnn_graph.write_table, O_DIRECT
    through the mount, the same bytes), the ext4 table deleted first where
    the two do not both fit the free space (the ext4 place has run by then;
    the next run makes its table again). Checks a few rows. Returns
    (binary, mountpoint, table path on the mount, what was done)."""
    binary, vol, mnt = mount_paths(a)
    clear_mount(a)
    os.makedirs(mnt, exist_ok=True)
    size = meta["table_bytes"]
    need = size + slack_bytes(size)
    info = {"table": a.mount_table, "dedup": False, "ext4_table_deleted": False}
    free = shutil.disk_usage(a.dir).free
    if need > free and a.mount_table == "generate" and os.path.exists(table):
        os.unlink(table)
        info["ext4_table_deleted"] = True
        log(f"mount: ext4 table deleted ({size / 1e9:.1f} GB; {free / GIB:.1f} GiB were free, the volume's copy "
            f"needs {need / GIB:.1f})")
        free = shutil.disk_usage(a.dir).free
    if need > free:
        raise RuntimeError(f"the table's copy in a volume needs {need / GIB:.1f} GiB and {a.dir} has "
                           f"{free / GIB:.1f} GiB free (--mount-table generate deletes the ext4 table first)")
    gib = max(2, int(size * 1.3 / GIB) + 2)  # the data area's size: the image is sparse, only what is written counts
    subprocess.run([binary, "mkfs", vol, "--size", f"{gib}G", "--no-dedup"], check=True, capture_output=True)
    subprocess.run([binary, "mount", vol, mnt], check=True, capture_output=True)
    dst = os.path.join(mnt, "feat.npy")
    t = time.perf_counter()
    if a.mount_table == "copy":
        shutil.copyfile(table, dst)
        with open(dst, "rb") as f:
            os.fsync(f.fileno())
        info["write"] = "copy"
    else:
        info["write"] = gnn_graph.write_table(dst, meta["nodes"], meta["width"], getattr(torch, meta["dtype"]),
                                              a.device)
        if a.device == "cuda":
            torch.cuda.empty_cache()
    secs = time.perf_counter() - t
    check_rows(dst, meta)
    info.update(seconds=secs, gb_s=size / secs / 1e9, volume_gib=gib, physical_bytes=disk_bytes(vol))
    log(f"mount: table {'copied' if a.mount_table == 'copy' else 'generated'} into the volume in {secs:.1f} s "
        f"({info['gb_s']:.2f} GB/s, {info['write']}; {info['physical_bytes'] / 1e9:.1f} GB on the disk), rows checked")
    return binary, mnt, dst, info


def estimate_seconds(a, contender):
    """What a contender is allowed for the --budget-seconds check: the time box
    and what the last runs spent around it (process start, CUDA, the hot
    buffer's fill, the page cache's drop)."""
    if contender == "hbm":
        return 25
    if contender.startswith("train-"):
        return a.seconds + (17 if contender.startswith("train-fs") else 24)
    if contender.startswith("fs-"):
        return a.seconds + (10 if "nohot" in contender else 20)
    return a.seconds + (11 if contender == "mmap" else 9)


def mount_setup_seconds(a, meta):
    """For the budget: the volume made and the table put in it."""
    return 15 + meta["table_bytes"] / 1e9 / MOUNT_WRITE_GB_S[a.mount_table]


def parent(a):
    os.makedirs(a.dir, exist_ok=True)
    a.device = resolve_device(a.device)
    parts = set(a.parts.split(","))
    unknown = parts - {"data", "gather", "hbm", "train"}
    if unknown:
        raise SystemExit(f"--parts: unknown {', '.join(sorted(unknown))} (data, gather, hbm, train)")
    want_places = set(a.places.split(",")) | ({"mount"} if a.mount else set())
    if want_places - {"ext4", "mount"}:
        raise SystemExit(f"--places: ext4 and/or mount, not {a.places}")
    mount_place = "mount" in want_places and "gather" in parts
    if mount_place and clear_mount(a):
        log(f"mount: removed the volume an earlier run left in {a.dir}")
    width_auto = resolve_width(a, mount_place)
    meta = ensure_data(a)
    table = os.path.join(a.dir, "feat.npy")
    batches = make_batches(a)
    pagerank_seconds = make_scores(a)
    if pagerank_seconds is not None:
        meta["pagerank_seconds"] = pagerank_seconds
    from spillfs.gnn._store.table import open_table
    hot_rows(a, open_table(table).row_bytes)
    if parts == {"data"}:
        log("data only (--parts data)")
        return
    host = parse_size(a.host_bytes)
    if a.memory_max == "none" or a.device == "cpu" and a.memory_max == "auto":
        limit, cgroup, why = None, None, "no cgroup (--memory-max none)" if a.memory_max == "none" else \
            "no cgroup (--device cpu)"
    else:
        limit = parse_size(a.memory_max) if a.memory_max != "auto" else host + 2 * GIB
        cgroup, why = setup_cgroup(limit)
    a.child_args = ["--gpu-cache", a.gpu_cache, "--host-bytes", a.host_bytes, "--seconds", str(a.seconds),
                    "--window", str(a.window), "--graph-dir", a.dir, "--device", a.device, "--model", a.model,
                    "--hbm-copy-bytes", a.hbm_copy_bytes, "--hbm-cached", a.hbm_cached, "--hidden", str(a.hidden)]
    print(f"# table {meta['table_bytes'] / 1e9:.2f} GB ({meta['table_bytes'] / GIB:.2f} GiB), {meta['nodes']} nodes, "
          f"{meta['edges']} edges; device {a.device}; memory.max "
          f"{'-' if limit is None else f'{limit / GIB:.2f} GiB'} ({cgroup or why}); GPU cache {a.gpu_cache}, "
          f"host {a.host_bytes}; time box {a.seconds:g} s a contender", flush=True)
    contenders = [c for c in a.contenders.split(",") if c and part_of(c) in parts]
    train = [c for c in contenders if c.startswith("train-")]
    if train and a.model == "pyg":
        try:
            import torch_geometric  # noqa: F401
        except ImportError:
            print(f"# no torch_geometric (PyG) here: skipping {', '.join(train)} (--model torch runs the same "
                  f"mean-aggregation layers in plain torch)", flush=True)
            contenders = [c for c in contenders if not c.startswith("train-")]
    results = []
    state = {"meta": meta, "memory_max": limit, "cgroup": cgroup or why, "args": vars(a)}
    if width_auto:
        state["width_auto"] = width_auto
    ext4 = [c for c in contenders if "ext4" in want_places]
    on_mount = [c for c in MOUNT_CONTENDERS if c in contenders and "mount" in want_places]
    # Where the mount place follows, the ext4 place leaves it its time (the budget skips ext4 contenders first).
    reserve = mount_setup_seconds(a, meta) + sum(estimate_seconds(a, c) for c in on_mount) if on_mount else 0
    mount = None

    def over_budget(c, more=0.0):
        return a.budget_seconds and time.time() - START + estimate_seconds(a, c) + more > a.budget_seconds

    def skip(c, label, why):
        print(f"# skipped {c} ({label}): {why}", flush=True)
        results.append({"contender": c, "place": label, "skipped": why})

    def run(c, label, path):
        r = run_child(a, c, path, batches, cgroup, label)
        results.append(r)
        log(f"{c} ({label}): {r['wall_seconds']:.1f} s wall" + (" ERROR" if "error" in r else ""))
        print(json.dumps(r), flush=True)
        if a.json_out:
            write_json(a.json_out, state, derive(results))

    try:
        for c in ext4:
            if over_budget(c, reserve):
                skip(c, "ext4", "budget" + (f" (with {reserve:.0f} s kept for the mount place)" if reserve else ""))
            else:
                run(c, "ext4", table)
        if on_mount and over_budget(on_mount[0], mount_setup_seconds(a, meta)):
            for c in on_mount:
                skip(c, "mount", "budget")
        elif on_mount:
            try:
                mount = make_mount(a, meta, table)
                state["mount"] = mount[3]
            except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                why = getattr(e, "stderr", None) or str(e)
                why = why.decode(errors="replace") if isinstance(why, bytes) else why
                for c in on_mount:
                    skip(c, "mount", f"no mount: {why.strip()[-500:]}")
            if mount:
                for c in on_mount:
                    if over_budget(c):
                        skip(c, "mount", "budget")
                    else:
                        run(c, "mount", mount[2])
    finally:
        if mount:
            subprocess.run([mount[0], "umount", mount[1]], capture_output=True)
        if on_mount and a.mount_table == "generate" and clear_mount(a):
            log("mount: volume removed (its table is generated again by the next run)")
        if cgroup:
            try:
                os.rmdir(cgroup)
            except OSError:
                pass
    finish(a, state, results)


def finish(a, state, results):
    results = derive(results)
    print_tables(results)
    if a.json_out:
        write_json(a.json_out, state, results)
    if a.png_out:
        plot(results, state["meta"], a.png_out)


def write_json(path, state, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(state, results=results), f, indent=1, default=str)
    os.replace(tmp, path)


def merge(a):
    """--merge: the results of split runs (same data) in one table, JSON and plot."""
    state, by = None, {}
    for p in a.merge:
        with open(p) as f:
            d = json.load(f)
        if state is None:
            state = {k: v for k, v in d.items() if k != "results"}
            state["merged_from"] = []
        elif {k: d["meta"].get(k) for k in ("scale", "width", "dtype", "edge_factor")} != \
                {k: state["meta"].get(k) for k in ("scale", "width", "dtype", "edge_factor")}:
            raise SystemExit(f"--merge: {p} was measured on other data")
        state["merged_from"].append(p)
        for r in d["results"]:
            if not r.get("skipped"):
                by[(r["place"], r["contender"])] = r
    finish(a, state, list(by.values()))


# ---- derived figures, tables, plot -----------------------------------------------


def derive(results):
    by = {(r["place"], r["contender"]): r for r in results}
    for r in results:
        base = by.get((r["place"], "mmap"), {}).get("rows_per_s")
        raw = by.get((r["place"], "raw"), {}).get("iops") or by.get(("ext4", "raw"), {}).get("iops")
        if base and r.get("rows_per_s") and r["contender"] != "mmap":
            r["x_mmap"] = r["rows_per_s"] / base
        if r.get("ssd_reads") and r.get("stall_seconds"):
            # The miss path's rate while it reads (SSD reads / the seconds gathers waited for them),
            # against the run-averaged rate (SSD reads / the whole time box, hits included).
            r["miss_path_iops"] = r["ssd_reads"] / r["stall_seconds"]
            if raw:
                r["miss_path_of_raw"] = r["miss_path_iops"] / raw
                r["ssd_reads_per_s_of_raw"] = r["ssd_reads_per_s"] / raw
    tm, tf = by.get(("ext4", "train-mmap")), by.get(("ext4", "train-fs-hybrid"))
    if tm and tf and tm.get("epoch_seconds") and tf.get("epoch_seconds"):
        tf["epoch_x_mmap"] = tm["epoch_seconds"] / tf["epoch_seconds"]
        tf["epoch_x_mmap_estimated"] = bool(tm.get("epoch_estimated") or tf.get("epoch_estimated"))
    return results


def _f(v, fmt):
    return fmt % v if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def print_tables(results):
    gather = [r for r in results if part_of(r["contender"]) == "gather"]
    print("\nGather (rows/s over the time box; hit = 1 - storage rows / rows; tiers: cache (GPU, or host on "
          "--device cpu) / hot / victim; miss IOPS = SSD reads / stall seconds, the miss path while it reads; "
          "run IOPS = SSD reads / time box)")
    print("%-34s %-5s %11s %8s %6s %20s %7s %6s %9s %6s %9s %6s %6s" % (
        "contender", "place", "rows/s", "GB/s", "hit", "cache/hot/victim", "x mmap", "amplif", "miss IOPS",
        "/raw", "run IOPS", "/raw", "setup"))
    for r in gather:
        if "error" in r or r.get("skipped"):
            print("%-34s %-5s %s" % (r["contender"], r["place"], "skipped: " + r["skipped"] if r.get("skipped")
                                     else "ERROR " + str(r.get("error", ""))[-300:].replace("\n", " | ")))
            continue
        if r["contender"] == "raw":
            print("%-34s %-5s %11s %8s %6s %20s %7s %6s %9s %6s %9s" % (
                "raw 4 KiB random reads", r["place"], "-", _f(r.get("gb_s"), "%.3f"), "", "", "", "",
                _f(r.get("iops"), "%.0f"), "1.00", ""))
            continue
        tiers = "-" if "cache_hit_rate" not in r else "%.3f/%.3f/%.3f" % (
            r["cache_hit_rate"], r["hot_hit_rate"], r["victim_hit_rate"])
        print("%-34s %-5s %11.0f %8.3f %6s %20s %7s %6s %9s %6s %9s %6s %6s" % (
            r["contender"], r["place"], r.get("rows_per_s", 0), r.get("useful_gb_s", 0),
            _f(r.get("hit_rate"), "%.3f"), tiers, _f(r.get("x_mmap"), "%.1f"),
            _f(r.get("read_amplification"), "%.2f"), _f(r.get("miss_path_iops"), "%.0f"),
            _f(r.get("miss_path_of_raw"), "%.2f"), _f(r.get("ssd_reads_per_s"), "%.0f"),
            _f(r.get("ssd_reads_per_s_of_raw"), "%.2f"), _f(r.get("setup_seconds"), "%.1f")))
    for r in results:
        if r["contender"] != "hbm" or "error" in r or r.get("skipped"):
            if r["contender"] == "hbm":
                print("\nhbm: " + (("skipped: " + r["skipped"]) if r.get("skipped") else
                                   "ERROR " + str(r.get("error", ""))[-500:]))
            continue
        print(f"\nCached gather against memory bandwidth ({r['device']}; GB/s of read + write: 2 x row bytes a "
              f"row, 2 x bytes for the copy; {r['cached_rows']} rows in {r['cached_lines']} cached lines, "
              f"all cache hits: {r['all_cache_hits']})")
        print("%-44s %10s %10s %8s" % ("", "rows", "GB/s", "of copy"))
        print("%-44s %10s %10.1f %8.2f" % (f"copy_ ({r['copy_bytes'] / GIB:.2f} GiB)", "-", r["copy_gb_s"], 1.0))
        for g in r["gather"]:
            print("%-44s %10d %10.1f %8.2f" % ("FeatureStore.gather of cached rows", g["rows"], g["gb_s"],
                                               g["gb_s"] / r["copy_gb_s"]))
        for g in r["index_select"]:
            print("%-44s %10d %10.1f %8.2f" % ("torch.index_select on an HBM table", g["rows"], g["gb_s"],
                                               g["gb_s"] / r["copy_gb_s"]))
    train = [r for r in results if part_of(r["contender"]) == "train"]
    if train:
        print("\nGraphSAGE training over the first sampled batches (an 'epoch' = those batches; est.: the time "
              "box ended first, batches x (rows / gather rows/s + compute step))")
        print("%-20s %-5s %8s %10s %5s %10s %10s %10s %8s" % (
            "contender", "place", "batches", "epoch s", "", "gather s", "compute s", "model", "x mmap"))
        for r in train:
            if "error" in r or r.get("skipped"):
                print("%-20s %-5s %s" % (r["contender"], r["place"], "skipped: " + r["skipped"] if r.get("skipped")
                                         else "ERROR " + str(r.get("error", ""))[-300:].replace("\n", " | ")))
                continue
            print("%-20s %-5s %3d of %-3d %10.2f %5s %10.2f %10.3f %10s %8s" % (
                r["contender"], r["place"], r["batches_done"], r["epoch_batches"], r["epoch_seconds"],
                "est." if r["epoch_estimated"] else "", r["gather_seconds"], r["compute_seconds_per_batch"],
                r["model"], _f(r.get("epoch_x_mmap"), "%.1f")))


def plot(results, meta, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"# no plot: {e} (run --merge on the JSON where matplotlib is installed)", flush=True)
        return
    ok = [r for r in results if "error" not in r and not r.get("skipped")]
    gather = [r for r in ok if part_of(r["contender"]) == "gather" and r.get("rows_per_s")]
    fsr = [r for r in gather if "cache_hit_rate" in r]
    hbm = next((r for r in ok if r["contender"] == "hbm"), None)
    train = [r for r in ok if part_of(r["contender"]) == "train"]
    raw = next((r for r in ok if r["contender"] == "raw"), None)
    fig, ax = plt.subplots(2, 2, figsize=(14, 9))
    label = lambda r: r["contender"] + ("" if r["place"] == "ext4" else f" ({r['place']})")  # noqa: E731
    a0 = ax[0][0]
    h = a0.barh([label(r) for r in gather], [r["rows_per_s"] for r in gather], color="tab:blue")
    a0.bar_label(h, labels=[f"{r['rows_per_s'] / 1e3:.0f} k" for r in gather], fontsize=8)
    a0.set_xscale("log")
    a0.set_xlabel("rows/s (log)")
    if raw:
        a0.axvline(raw["iops"], color="tab:red", ls="--", label=f"raw 4 KiB reads/s ({raw['iops'] / 1e3:.0f} k)")
        a0.legend(loc="lower right", fontsize=8)
    a0.invert_yaxis()
    a0.set_title("gather throughput")
    a1 = ax[0][1]
    names = [label(r) for r in fsr]
    left = np.zeros(len(fsr))
    for key, color, name in (("cache_hit_rate", "tab:green", "cache (GPU)"), ("hot_hit_rate", "tab:orange", "hot"),
                             ("victim_hit_rate", "tab:purple", "victim")):
        vals = np.array([r[key] for r in fsr])
        a1.barh(names, vals, left=left, color=color, label=name)
        left += vals
    a1.barh(names, 1 - left, left=left, color="lightgray", label="storage")
    a1.set_xlim(0, 1)
    a1.invert_yaxis()
    a1.legend(loc="lower right", fontsize=8)
    a1.set_title("hit rate per tier (share of rows)")
    a2 = ax[1][0]
    if hbm:
        bars = [(f"copy_ {hbm['copy_bytes'] / GIB:.2f} GiB", hbm["copy_gb_s"], "tab:gray")]
        bars += [(f"FeatureStore gather {g['rows']} rows", g["gb_s"], "tab:blue") for g in hbm["gather"]]
        bars += [(f"index_select {g['rows']} rows", g["gb_s"], "tab:cyan") for g in hbm["index_select"]]
        h = a2.barh([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
        a2.bar_label(h, fmt="%.0f", fontsize=8)
        a2.invert_yaxis()
        a2.set_xlabel("GB/s (read + write)")
        a2.set_title(f"cached rows vs memory bandwidth ({hbm['device']})")
    else:
        a2.set_axis_off()
    a3 = ax[1][1]
    if train:
        bars = a3.barh([label(r) + (" (est.)" if r["epoch_estimated"] else "") for r in train],
                       [r["epoch_seconds"] for r in train], color="tab:olive")
        a3.bar_label(bars, fmt="%.1f s", fontsize=8)
        a3.invert_yaxis()
        a3.set_xlabel(f"seconds for the first {train[0]['epoch_batches']} batches")
        a3.set_title("GraphSAGE training")
    else:
        a3.set_axis_off()
    fig.suptitle(f"spillfs.gnn.FeatureStore: RMAT scale {meta.get('scale')} ({meta.get('nodes')} nodes), "
                 f"{meta.get('width')} x {meta.get('dtype')}, table {meta.get('table_bytes', 0) / 1e9:.1f} GB")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}", flush=True)


# ---- the children: one contender each -------------------------------------------


def join_cgroup():
    cg = os.environ.get("FEATBENCH_CGROUP")
    if cg:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def sage_model(width, kind, hidden=256, classes=16, layers=3):
    if kind == "pyg":
        from torch_geometric.nn import SAGEConv as Conv
    else:
        class Conv(torch.nn.Module):
            """PyG SAGEConv's default (mean aggregation): lin_l(mean_j x_j) + lin_r(x_i), in torch ops."""

            def __init__(self, cin, cout):
                super().__init__()
                self.lin_l = torch.nn.Linear(cin, cout)
                self.lin_r = torch.nn.Linear(cin, cout, bias=False)

            def forward(self, x, edge_index):
                src, dst = edge_index
                agg = torch.zeros_like(x).index_add_(0, dst, x[src])
                cnt = torch.zeros(len(x), dtype=x.dtype, device=x.device).index_add_(
                    0, dst, torch.ones(len(dst), dtype=x.dtype, device=x.device))
                return self.lin_l(agg / cnt.clamp(min=1)[:, None]) + self.lin_r(x)

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [width] + [hidden] * (layers - 1) + [classes]
            self.convs = torch.nn.ModuleList([Conv(dims[i], dims[i + 1]) for i in range(layers)])

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = torch.relu(x)
            return x
    return Sage()


def make_store(a, feat, info, dev):
    from spillfs.gnn import FeatureStore
    parts = feat.split("-")
    policy = parts[1]
    hot = "nohot" not in parts
    window = 0 if "nowindow" in parts else a.window
    host = parse_size(a.host_bytes)
    kwargs = {}
    if hot:  # chosen by the parent, outside the cgroup (make_scores, hot_rows); the score file-backed
        kwargs.update(score=np.load(os.path.join(a.graph_dir, "score.npy"), mmap_mode="r"),
                      hot=np.load(hot_rows_path(a.graph_dir, hot_count(host, info.row_bytes))))
    victim = None if "novictim" not in parts else 0
    return FeatureStore(a.table, device=dev, gpu_cache_bytes=parse_size(a.gpu_cache), host_bytes=host,
                        window=window, policy=policy, victim_bytes=victim, **kwargs)


def store_stats(store, secs):
    st = store.stats()
    out = {k: st[k] for k in ("requests", "gpu_hits", "cache_hits", "hot_hits", "victim_hits", "storage_rows",
                              "ssd_reads", "ssd_bytes", "read_amplification", "hit_rate", "stalls",
                              "stall_seconds", "evictions", "victims_stored", "victims_restored", "cache_lines",
                              "hot_lines", "victim_lines", "backend")}
    req = max(1, st["requests"])
    out.update(cache_hit_rate=(st["gpu_hits"] + st["cache_hits"]) / req, hot_hit_rate=st["hot_hits"] / req,
               victim_hit_rate=st["victim_hits"] / req, ssd_reads_per_s=st["ssd_reads"] / secs)
    return out


class Gatherer:
    """One contender's gathers of the batch list, in order (mmap or a FeatureStore)."""

    def __init__(self, a, feat, info, dev, batches):
        self.dev, self.batches, self.info = dev, batches, info
        self.store = self.arr = None
        t = time.perf_counter()
        if feat == "mmap":
            self.arr = np.load(a.table, mmap_mode="r")
        else:
            self.store = make_store(a, feat, info, dev)
            for b in batches[:self.store.window_size]:
                self.store.prefetch(b)
        self.setup_seconds = time.perf_counter() - t

    def gather(self, i, deadline):
        """Batch i's rows on the device: (tensor or None where the deadline cut it, rows gathered)."""
        nodes = self.batches[i]
        if self.store is None:
            chunks, rows = [], 0
            for s in range(0, len(nodes), 1024):  # bounded steps: the deadline holds
                chunks.append(torch.from_numpy(np.ascontiguousarray(self.arr[nodes[s:s + 1024]])).to(self.dev))
                rows += len(chunks[-1])
                if time.perf_counter() >= deadline and rows < len(nodes):
                    return None, rows
            return torch.cat(chunks), rows
        w = self.store.window_size
        if w and i + w < len(self.batches):
            self.store.prefetch(self.batches[i + w])
        return self.store.gather(torch.from_numpy(nodes).to(self.dev)), len(nodes)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def child_raw(a, out):
    from spillfs.gnn._store.table import RowReader, open_table
    reader = RowReader(open_table(a.table, shape=(-1, 1024), dtype=np.float32, offset=4096, raw=True))
    n_blocks = (os.path.getsize(a.table) - 4096) // 4096
    rng = np.random.default_rng(3)
    ios = 0
    deadline = time.perf_counter() + a.seconds
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


def child_gather(a, out, feat, info, dev, batches):
    g = Gatherer(a, feat, info, dev, batches)
    out["setup_seconds"] = g.setup_seconds
    rows = done = 0
    t0 = time.perf_counter()
    deadline = t0 + a.seconds
    half = None
    for i in range(len(batches)):
        if time.perf_counter() >= deadline:
            break
        x, n = g.gather(i, deadline)
        sync(dev)
        rows += n
        done += x is not None
        if half is None and time.perf_counter() - t0 > a.seconds / 2:
            half = (rows, time.perf_counter())
    secs = time.perf_counter() - t0
    out.update(rows=rows, seconds=secs, rows_per_s=rows / secs, useful_gb_s=rows * info.row_bytes / secs / 1e9,
               batches=done, batches_listed=len(batches), all_batches_done=done == len(batches),
               mean_rows_per_batch=float(np.mean([len(b) for b in batches])))
    if half is not None:
        out["rows_per_s_second_half"] = (rows - half[0]) / max(1e-9, time.perf_counter() - half[1])
    if g.store is not None:
        out.update(store_stats(g.store, secs))
        g.store.close()


def child_train(a, out, feat, info, dev, batches, train):
    if a.model == "pyg":
        import torch_geometric
        out["model"] = f"pyg-{torch_geometric.__version__}"
    else:
        out["model"] = "torch"
    torch.manual_seed(0)
    model = sage_model(info.width, a.model, hidden=a.hidden).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, ei, seed_local, nodes):
        y = torch.from_numpy(nodes[seed_local].astype(np.int64) % 16).to(dev)
        opt.zero_grad()
        logits = model(x.float(), torch.from_numpy(ei).to(dev, torch.int64))[torch.from_numpy(seed_local).to(dev)]
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        return loss

    # One step on stand-in features first (CUDA kernels and allocator warm for both contenders alike).
    nodes0, ei0, sl0 = train[0]
    step(torch.randn(len(nodes0), info.width, device=dev), ei0, sl0, nodes0)
    sync(dev)
    g = Gatherer(a, feat, info, dev, [t[0] for t in train])
    out["setup_seconds"] = g.setup_seconds
    gather_s = compute_s = 0.0
    rows = done = 0
    losses = []
    t0 = time.perf_counter()
    deadline = t0 + a.seconds
    for i, (nodes, ei, seed_local) in enumerate(train):
        if time.perf_counter() >= deadline:
            break
        tg = time.perf_counter()
        x, n = g.gather(i, deadline)
        sync(dev)
        tc = time.perf_counter()
        gather_s += tc - tg
        rows += n
        if x is None:
            break
        losses.append(float(step(x, ei, seed_local, nodes)))
        sync(dev)
        compute_s += time.perf_counter() - tc
        done += 1
    measured = time.perf_counter() - t0
    if done:
        compute_per = compute_s / done
    else:  # the time box ended inside the first batch's gather: the compute step measured on stand-ins
        tc = time.perf_counter()
        for _ in range(3):
            step(torch.randn(len(nodes0), info.width, device=dev), ei0, sl0, nodes0)
        sync(dev)
        compute_per = (time.perf_counter() - tc) / 3
    n_epoch = len(train)
    mean_rows = float(np.mean([len(t[0]) for t in train]))
    estimated = done < n_epoch
    if estimated:
        epoch = n_epoch * (mean_rows / max(1e-9, rows / max(1e-9, gather_s)) + compute_per)
    else:
        epoch = measured
    out.update(epoch_batches=n_epoch, batches_done=done, epoch_seconds=epoch, epoch_estimated=estimated,
               measured_seconds=measured, gather_seconds=gather_s, compute_seconds=compute_s,
               compute_seconds_per_batch=compute_per, rows=rows, gather_rows_per_s=rows / max(1e-9, gather_s),
               mean_rows_per_batch=mean_rows, losses=losses[:3] + losses[-3:], hidden=a.hidden)
    if g.store is not None:
        out.update(store_stats(g.store, measured))
        g.store.close()


def timed(dev, fn, min_seconds=1.0):
    """Seconds a call of fn: calibrated with synchronized calls, then a run of
    calls long enough for min_seconds timed with CUDA events (wall clock on the
    CPU)."""
    fn()
    sync(dev)
    t = time.perf_counter()
    for _ in range(3):
        fn()
    sync(dev)
    one = max(1e-7, (time.perf_counter() - t) / 3)
    reps = int(min(2000, max(5, math.ceil(min_seconds / one))))
    if dev.type == "cuda":
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / 1e3 / reps
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def child_hbm(a, out, info, dev, batches):
    from spillfs.gnn import FeatureStore
    cache_bytes = parse_size(a.gpu_cache)
    cpu = dev.type == "cpu"
    t = time.perf_counter()
    # No hot or victim buffer: the cache (HBM; host memory on --device cpu) is the only tier before storage.
    store = FeatureStore(a.table, device=dev, gpu_cache_bytes=cache_bytes, host_bytes=cache_bytes if cpu else 0,
                         window=0, policy="lru")
    st = store.stats()
    rpl, rb, lb = st["rows_per_line"], info.row_bytes, st["line_bytes"]
    n_lines = -(-info.rows // rpl)
    k = int(min(n_lines, st["cache_lines"] * 3 // 4, max(1, parse_size(a.hbm_cached) // lb)))
    rng = np.random.default_rng(11)
    lines = np.sort(rng.choice(n_lines, k, replace=False))
    rows = (lines[:, None] * rpl + np.arange(rpl)[None, :]).reshape(-1)
    rows = rows[rows < info.rows]
    chunk = 1 << 20
    for s in range(0, len(rows), chunk):  # warm: the first gathers read the lines from storage
        store.gather(torch.from_numpy(rows[s:s + chunk]).to(dev))
    sync(dev)
    warm = time.perf_counter() - t
    s0 = store.stats()
    for s in range(0, len(rows), chunk):
        store.gather(torch.from_numpy(rows[s:s + chunk]).to(dev))
    sync(dev)
    s1 = store.stats()
    hits = lambda s: s["gpu_hits"] + s["cache_hits"]  # noqa: E731
    all_hits = hits(s1) - hits(s0) == s1["requests"] - s0["requests"] == len(rows)
    sizes = sorted({int(min(len(rows), float(np.mean([len(b) for b in batches])))), int(min(len(rows), 1 << 20))})
    gather = []
    for b in sizes:
        idx = torch.from_numpy(rows[rng.permutation(len(rows))[:b]]).to(dev)
        secs = timed(dev, lambda: store.gather(idx))
        gather.append({"rows": b, "seconds": secs, "rows_per_s": b / secs, "gb_s": 2 * b * rb / secs / 1e9})
    s2 = store.stats()
    all_hits = all_hits and hits(s2) - hits(s1) == s2["requests"] - s1["requests"]
    out.update(cached_lines=k, cached_rows=len(rows), cache_lines=st["cache_lines"], warm_seconds=warm,
               all_cache_hits=bool(all_hits), storage_rows_after_warm=s2["storage_rows"] - s0["storage_rows"],
               gather=gather)
    store.close()
    del store
    # The peers, in the same process: a device-to-device copy and index_select on an HBM table.
    copy_bytes = parse_size(a.hbm_copy_bytes)
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
    src.fill_(1)
    dst = torch.empty_like(src)
    secs = timed(dev, lambda: dst.copy_(src))
    out.update(copy_bytes=copy_bytes, copy_gb_s=2 * copy_bytes / secs / 1e9)
    del src, dst
    table_rows = int(max(1, min(info.rows, cache_bytes // rb)))
    from spillfs.gnn._store.table import torch_dtype
    table = torch.zeros((table_rows, info.width), dtype=torch_dtype(info), device=dev)
    isel = []
    for b in sizes:
        idx = torch.randint(0, table_rows, (b,), device=dev)
        secs = timed(dev, lambda: torch.index_select(table, 0, idx))
        isel.append({"rows": b, "seconds": secs, "rows_per_s": b / secs, "gb_s": 2 * b * rb / secs / 1e9})
    out.update(index_select=isel, index_select_table_rows=table_rows, device=str(dev),
               bytes_counted="read + write: 2 x row bytes a gathered row, 2 x bytes for the copy; indices not counted")
    big = gather[-1]
    out.update(cached_gather_gb_s=big["gb_s"], cached_gather_rows=big["rows"], copy_gb_s=out["copy_gb_s"],
               index_select_gb_s=isel[-1]["gb_s"], cached_gather_of_copy=big["gb_s"] / out["copy_gb_s"],
               index_select_of_copy=isel[-1]["gb_s"] / out["copy_gb_s"],
               cached_gather_of_index_select=big["gb_s"] / isel[-1]["gb_s"])


def child(a):
    join_cgroup()
    from spillfs.gnn._store.table import open_table
    dev = torch.device(a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    info = open_table(a.table)
    c = a.child
    out = {"table": a.table, "device": str(dev)}
    if c == "raw":
        child_raw(a, out)
    else:
        batches, train = load_batches(a.batches_file, with_train=c.startswith("train-"))
        if c == "hbm":
            child_hbm(a, out, info, dev, batches)
        elif c.startswith("train-"):
            child_train(a, out, c[len("train-"):], info, dev, batches, train)
        else:
            child_gather(a, out, c, info, dev, batches)
    print(json.dumps(out), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/root/featbench")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="cpu: a smoke run (FeatureStore's host tiers, CPU peers) where there is no GPU")
    p.add_argument("--scale", type=int, default=25)
    p.add_argument("--edge-factor", type=int, default=16)
    p.add_argument("--width", default="128",
                   help="feature columns; auto: the widest of 256, 192, 160, 128 whose data fits the free space of "
                        "--dir (with the mount place's copy where --mount-table copy makes one, the scores, the "
                        "batches and up to 2 GiB spare)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5,5")
    p.add_argument("--batches", type=int, default=300, help="batches sampled (each contender goes through them once)")
    p.add_argument("--train-batches", type=int, default=40, help="the training 'epoch': the first N batches")
    p.add_argument("--gpu-cache", default="4G")
    p.add_argument("--host-bytes", default="2G")
    p.add_argument("--memory-max", default="4G", help="the cgroup's memory.max; auto: host-bytes + 2G; none")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--seconds", type=float, default=25, help="time box a contender")
    p.add_argument("--budget-seconds", type=float, default=0,
                   help="skip contenders that would end past this many seconds since the start (0: none); "
                        "with the mount place, the ext4 place's contenders leave it the time its volume, table "
                        "and contenders need (estimate_seconds, mount_setup_seconds)")
    p.add_argument("--contenders", default=DEFAULT_CONTENDERS)
    p.add_argument("--parts", default="gather,hbm,train", help="of data, gather, hbm, train")
    p.add_argument("--model", default="pyg", choices=("pyg", "torch"))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--hbm-copy-bytes", default="1G")
    p.add_argument("--hbm-cached", default="1G", help="bytes of lines the hbm part caches and gathers from")
    p.add_argument("--mount", action="store_true", help="also the mount (= --places ext4,mount)")
    p.add_argument("--places", default="ext4",
                   help="ext4 and/or mount (a spillfs volume made under --dir, after the ext4 place ran: "
                        "fs-hybrid, mmap and raw run there)")
    p.add_argument("--mount-table", default="copy", choices=("copy", "generate"),
                   help="how the mount place gets its table: copy: copied from the ext4 one (two copies on the "
                        "disk; about 0.15 GB/s); generate: generated into the volume (gnn_graph.write_table, "
                        "O_DIRECT through the mount: the same rows), the ext4 table deleted first where both do "
                        "not fit, and the volume removed at the end: a table of up to the free space less the "
                        "CSR fits, not half of it")
    p.add_argument("--json-out")
    p.add_argument("--png-out")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="join the JSONs of split runs (no run)")
    # Children.
    p.add_argument("--child")
    p.add_argument("--table")
    p.add_argument("--batches-file")
    p.add_argument("--graph-dir")
    a = p.parse_args(argv)
    if a.child:
        child(a)
    elif a.merge:
        merge(a)
    else:
        parent(a)


if __name__ == "__main__":
    sys.exit(main())
