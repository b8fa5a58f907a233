"""One feature cache over several processes: :class:`ShardedFeatureStore`
(exported by :mod:`spillfs.gnn`), on ``torch.distributed``.

    # torchrun --nproc-per-node 4 train.py   (one process per GPU)
    import torch, torch.distributed as dist
    from spillfs.gnn import ShardedFeatureStore
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    feats = ShardedFeatureStore("/mnt/spill/feat.npy", device=f"cuda:{local_rank}",
                                gpu_cache_bytes=4 << 30, host_bytes=8 << 30, hot=1_000_000,
                                score=score, window=4)        # every rank, same arguments
    feats.prefetch(next_batch_nodes)                          # collective
    x = feats.gather(batch_nodes)                             # collective: (len, width) on the device
    print(feats.stats(aggregate=True))                        # collective: sums over the ranks

Ownership: the table is cut into the lines of :class:`spillfs.gnn.FeatureStore`
(``rows_per_line`` consecutive rows, about 4 KiB), and each line has one owning
rank: ``partition="hash"`` (the default) gives line ``l`` to rank
``l % world_size`` (lines dealt round-robin: an even spread whatever the id
order, RMAT's high-degree low ids included); ``partition="range"`` gives each
rank a contiguous block of ``ceil(lines / world_size)`` lines. Each rank keeps
a :class:`~spillfs.gnn.FeatureStore` (its *shard*) that is only ever asked for
rows it owns, so its cache tiers (GPU lines, hot-node buffer, victim buffer,
host cache on ``device="cpu"``) hold only those: the ranks' caches together
act as one cache of ``world_size`` times the budget of one (budgets, ``hot``
included, are per rank). Hybrid eviction, the hot-node buffer and the victim
prefetch are the shard's own, driven by a window holding the requests of every
rank for its lines.

One :meth:`~ShardedFeatureStore.gather`: the index is deduplicated and split
by owner; one ``all_to_all_single`` of request counts (with an error flag), one
of the requested row ids and one of the response rows (as bytes) go through
the process group; each owner makes one gather of its shard for the union of
what every rank (itself included) asked of it, so a row asked by several ranks
is read once. Rows a rank owns itself never cross the group. NCCL tensors are
on the store's GPU; gloo's on the CPU. Routing is done on the host (numpy).

Collective: every rank of the group must call ``gather``, ``prefetch`` (when
``window`` > 0), ``stats(aggregate=True)`` and the constructor, in the same
order; a rank with an empty batch still calls ``gather`` (with an empty
index). An index out of range on any rank makes every rank raise
``IndexError`` naming it and the rank that gave it (the gather is skipped
everywhere, so the ranks stay in step). A peer that died or stopped calling
makes the others raise :class:`PeerError` (naming this rank, the exchange and
the timeout): at once when its connections close (gloo), else after the
process group's timeout; the store is unusable after it.

The group: ``group=`` a process group, or the default one, made here from the
launcher's environment (``env://``: torchrun's MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE) when it does not exist yet: NCCL for a CUDA device, gloo
for the CPU, with ``timeout`` (default 300 s). Before an NCCL group is used the
store sets ``NCCL_NVLS_ENABLE=0`` (no NVLink multicast) and, for a group it
makes, ``TORCH_NCCL_BLOCKING_WAIT=1`` (``NCCL_BLOCKING_WAIT`` before torch 2.2)
so that a timeout raises here instead of aborting the process.

Tables: ``path`` is the whole table (a ``.npy`` or a raw file with
``shape``/``dtype``, the same on every host: one spillfs volume per host
holding it) or a directory made by :func:`write_shards`: one file per rank
holding only the lines it owns, so a host's volume need only hold its ranks'
shards.
"""

import datetime
import json
import os
import threading
import time
from collections import namedtuple

import numpy as np

from .feature_store import FeatureStore, score_rows
from .index import as_index, rows_by_index
from .table import open_table, torch_dtype

__all__ = ["ShardedFeatureStore", "PeerError", "write_shards", "PARTITIONS"]

PARTITIONS = ("hash", "range")
SHARDS_JSON = "shards.json"


def _torch():
    import torch
    return torch


class PeerError(RuntimeError):
    """A collective of the sharded store failed: a peer died, or did not make the
    same call within the process group's timeout."""


# What _send_to_owners returns: the items grouped by owner (items[order], rank
# r's at starts[r]:starts[r + 1]), this rank's own (never sent), the counts sent
# to and asked of each rank, and the items the others asked of this one.
_Routed = namedtuple("_Routed", "order starts mine sent asked received")


class _Layout:
    """Which rank owns each line of a table of ``rows`` rows, ``rpl`` rows a line."""

    def __init__(self, rows, rpl, world_size, partition):
        if partition not in PARTITIONS:
            raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, not {partition!r}")
        self.rows, self.rpl, self.world, self.partition = int(rows), int(rpl), int(world_size), partition
        self.n_lines = -(-self.rows // self.rpl)
        self.lines_per_rank = max(1, -(-self.n_lines // self.world))

    def owner_of_lines(self, lines):
        if self.partition == "hash":
            return lines % self.world
        return np.minimum(lines // self.lines_per_rank, self.world - 1)

    def owner_of_rows(self, rows):
        return self.owner_of_lines(np.asarray(rows, dtype=np.int64) // self.rpl)

    def local_lines(self, lines):
        """A line's place among its owner's lines (ascending order kept)."""
        if self.partition == "hash":
            return lines // self.world
        return lines - self.owner_of_lines(lines) * self.lines_per_rank

    def owned_lines(self, rank):
        if self.partition == "hash":
            return np.arange(rank, self.n_lines, self.world, dtype=np.int64)
        return np.arange(rank * self.lines_per_rank, min((rank + 1) * self.lines_per_rank, self.n_lines),
                         dtype=np.int64)

    def owned_rows(self, rank):
        lines = self.owned_lines(rank)
        r = (lines[:, None] * self.rpl + np.arange(self.rpl)[None, :]).reshape(-1)
        return r[r < self.rows]


def _rows_per_line(row_bytes, line_bytes):
    return max(1, int(line_bytes) // max(1, int(row_bytes)))


def write_shards(path, out_dir, world_size, partition="hash", line_bytes=4096, *, shape=None, dtype=None,
                 offset=0):
    """Cuts the table at ``path`` into ``world_size`` shard files in ``out_dir``
    (``shard-<rank>-of-<world_size>.npy``, or ``.bin`` for torch-only dtypes,
    holding the lines that rank owns, in order) and ``shards.json`` (the whole
    table's shape and dtype, the partition, rows per line). Give ``out_dir`` as
    ``path`` of :class:`ShardedFeatureStore` with the same ``world_size``,
    ``partition`` and ``line_bytes``; a host needs only its ranks' shard files
    (and ``shards.json``). Returns the shard paths."""
    info = open_table(path, shape=shape, dtype=dtype, offset=offset)
    rpl = _rows_per_line(info.row_bytes, line_bytes)
    layout = _Layout(info.rows, rpl, world_size, partition)
    raw = np.memmap(info.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.rows, info.row_bytes)) \
        if info.rows else np.empty((0, info.row_bytes), np.uint8)
    os.makedirs(out_dir, exist_ok=True)
    tdt = torch_dtype(info)
    files = []
    for r in range(world_size):
        rows = layout.owned_rows(r)
        if info.dtype is not None:
            name = f"shard-{r}-of-{world_size}.npy"
            out = np.lib.format.open_memmap(os.path.join(out_dir, name), mode="w+", dtype=info.dtype,
                                            shape=(len(rows), info.width))
            dst = out.reshape(len(rows), -1).view(np.uint8) if len(rows) else None
        else:
            name = f"shard-{r}-of-{world_size}.bin"
            out = np.memmap(os.path.join(out_dir, name), dtype=np.uint8, mode="w+",
                            shape=(max(1, len(rows)), info.row_bytes)) if len(rows) else None
            dst = out
        for s in range(0, len(rows), 1 << 16):
            dst[s:s + (1 << 16)] = raw[rows[s:s + (1 << 16)]]
        if out is not None:
            out.flush()
            del out, dst
        if info.dtype is None and not len(rows):
            open(os.path.join(out_dir, name), "wb").close()
        files.append(name)
    meta = {"rows": info.rows, "width": info.width, "dtype": str(tdt).replace("torch.", ""),
            "numpy_dtype": info.dtype.str if info.dtype is not None else None, "world_size": int(world_size),
            "partition": partition, "rows_per_line": rpl, "line_bytes": rpl * info.row_bytes, "files": files,
            "source": os.path.abspath(info.path)}
    with open(os.path.join(out_dir, SHARDS_JSON), "w") as f:
        json.dump(meta, f, indent=1)
    return [os.path.join(out_dir, n) for n in files]


class ShardedFeatureStore:
    """A feature table gathered through the caches of every rank of a
    ``torch.distributed`` process group, each rank caching the lines it owns.
    See the module's documentation (:mod:`spillfs.gnn._store.sharded`).

    Arguments as :class:`spillfs.gnn.FeatureStore`'s (budgets per rank), and:
    ``group`` (a process group; default the default group, made from the
    environment where missing), ``partition`` (``"hash"`` or ``"range"``),
    ``timeout`` (seconds or a timedelta: of the group made here; named in
    :class:`PeerError`), ``backend`` (of the group made here; default NCCL
    for CUDA, gloo for the CPU)."""

    def __init__(self, path, device="cpu", gpu_cache_bytes=None, host_bytes=None, hot=None, window=0,
                 policy="hybrid", *, group=None, partition="hash", timeout=None, backend=None, shape=None, dtype=None,
                 offset=0, score=None, graph=None, victim_bytes=None, line_bytes=4096, posix=None):
        torch = _torch()
        import torch.distributed as dist
        self._dist = dist
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        self.timeout = timeout
        self.group = self._group(group, backend, timeout)
        self.backend = str(dist.get_backend(self.group)).lower()
        if self.backend == "nccl":
            os.environ["NCCL_NVLS_ENABLE"] = "0"  # communicators are made at the first collective
            if self.device.type != "cuda":
                raise ValueError("an NCCL group exchanges CUDA tensors: give device='cuda:<local rank>' "
                                 "(or a gloo group for device='cpu')")
        self.comm_device = self.device if self.backend == "nccl" else torch.device("cpu")
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self._lock = threading.RLock()
        self._broken = None

        # The whole table, or this rank's shard of a write_shards directory.
        shard_path, meta = None, None
        if os.path.isdir(path):
            meta_path = os.path.join(path, SHARDS_JSON)
            if not os.path.exists(meta_path):
                raise ValueError(f"{path}: a directory must hold shards made by write_shards ({SHARDS_JSON})")
            with open(meta_path) as f:
                meta = json.load(f)
            if meta["world_size"] != self.world_size:
                raise ValueError(f"{path}: shards for {meta['world_size']} ranks, but the group has "
                                 f"{self.world_size}")
            partition = meta["partition"]
            shard_path = os.path.join(path, meta["files"][self.rank])
            tdt = getattr(torch, meta["dtype"])
            self.rows, self.width, self.dtype = int(meta["rows"]), int(meta["width"]), tdt
            self.rows_per_line = int(meta["rows_per_line"])
            line_bytes = int(meta["line_bytes"])
            self.row_bytes = line_bytes // self.rows_per_line
        else:
            info = open_table(path, shape=shape, dtype=dtype, offset=offset)
            self.rows, self.width, self.dtype = info.rows, info.width, torch_dtype(info)
            self.row_bytes = info.row_bytes
            self.rows_per_line = _rows_per_line(info.row_bytes, line_bytes)
        self.path = os.fspath(path)
        self.partition = partition
        self.layout = _Layout(self.rows, self.rows_per_line, self.world_size, partition)
        self.sharded_files = shard_path is not None
        self.owned_rows = self.layout.owned_rows(self.rank)

        # Scores and hot rows: this rank's share, in the shard's row numbers.
        row_score = score_rows(score, graph, self.rows, self.device)
        local_score, local_hot = None, hot
        owned = self.owned_rows
        if row_score is not None:
            if shard_path is not None:
                local_score = row_score[owned]
            else:
                local_score = np.full(self.rows, -np.inf)
                local_score[owned] = row_score[owned]
        if isinstance(hot, (int, np.integer)) and not isinstance(hot, bool):
            if hot and row_score is None:
                raise ValueError("hot=<count> needs a score: score=<array>, or graph=(indptr, indices) with "
                                 "score='degree' or 'pagerank'")
            k = min(int(hot), len(owned))
            top = owned[np.argsort(-row_score[owned], kind="stable")[:k]] if k else np.empty(0, np.int64)
            local_hot = self._to_local(top) if k else None
        elif hot is not None:
            rows = as_index(hot, self.rows, "hot row")
            rows = rows[self.layout.owner_of_rows(rows) == self.rank]
            local_hot = self._to_local(rows) if len(rows) else None
        kw = dict(score=local_score, victim_bytes=victim_bytes, line_bytes=line_bytes, posix=posix)
        if shard_path is not None:
            if meta["numpy_dtype"] is None:
                kw.update(shape=(len(owned), self.width), dtype=self.dtype)
            self.local = FeatureStore(shard_path, device=self.device, gpu_cache_bytes=gpu_cache_bytes,
                                           host_bytes=host_bytes, hot=local_hot, window=window, policy=policy, **kw)
            if self.local.info.rows != len(owned) or self.local.info.width != self.width:
                raise ValueError(f"{shard_path}: shape {self.local.info.shape}, but rank {self.rank} owns "
                                 f"{(len(owned), self.width)} of {SHARDS_JSON}")
        else:
            self.local = FeatureStore(path, device=self.device, gpu_cache_bytes=gpu_cache_bytes,
                                           host_bytes=host_bytes, hot=local_hot, window=window, policy=policy,
                                           shape=shape, dtype=dtype, offset=offset, **kw)
        self.device = self.local.device
        if self.backend == "nccl":
            self.comm_device = self.device
        self.window_size = self.local.window_size
        self._st = dict.fromkeys(_STATS, 0)
        self._st["exchange_seconds"] = self._st["gather_seconds"] = 0.0

    # -- the group --------------------------------------------------------------
    def _group(self, group, backend, timeout):
        dist = self._dist
        if group is not None:
            return group
        if not dist.is_initialized():
            if not dist.is_available():
                raise RuntimeError("torch.distributed is not available in this torch build")
            backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
            if backend == "nccl":
                os.environ["NCCL_NVLS_ENABLE"] = "0"
                os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
                os.environ.setdefault("NCCL_BLOCKING_WAIT", "1")
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if v not in os.environ]
            if missing:
                raise RuntimeError(f"no torch.distributed group: start the processes with torchrun (or set "
                                   f"{', '.join(missing)}), or call init_process_group first, or pass group=")
            if self.timeout is None:
                self.timeout = datetime.timedelta(seconds=300)
            dist.init_process_group(backend, init_method="env://", timeout=self.timeout)
        return dist.group.WORLD

    def _fail(self, what, err):
        t = self.timeout
        tt = f"{t.total_seconds():g} s" if t is not None else "the process group's timeout"
        self._broken = PeerError(
            f"ShardedFeatureStore rank {self.rank} of {self.world_size} ({self.backend}): {what} failed: a peer "
            f"died or did not make the same call within {tt}: {err}")
        return self._broken

    def _check(self):
        if self._broken is not None:
            raise PeerError(f"ShardedFeatureStore rank {self.rank}: unusable after an earlier failure: "
                            f"{self._broken}")

    def _a2a(self, what, send, send_splits, recv_splits, dtype):
        torch = _torch()
        out = torch.empty(int(sum(recv_splits)), dtype=dtype, device=self.comm_device)
        send = send.to(self.comm_device)
        t0 = time.perf_counter()
        try:
            self._dist.all_to_all_single(out, send, [int(x) for x in recv_splits], [int(x) for x in send_splits],
                                         group=self.group)
        except Exception as e:  # noqa: BLE001 (gloo and NCCL raise RuntimeError and its kin)
            raise self._fail(what, e) from e
        self._st["exchange_seconds"] += time.perf_counter() - t0
        item = out.element_size()
        self._st["bytes_sent"] += (int(sum(send_splits)) - int(send_splits[self.rank])) * item
        self._st["bytes_received"] += (int(sum(recv_splits)) - int(recv_splits[self.rank])) * item
        return out

    def _header(self, what, counts, error):
        """Exchanges (count, status, bad index) with every rank: returns the
        counts asked of this rank; raises on every rank where one refused its index."""
        torch = _torch()
        w = self.world_size
        h = np.zeros((w, 3), dtype=np.int64)
        h[:, 0] = counts
        if error is not None:
            h[:, 1] = 1
            h[:, 2] = error[1] if error[1] is not None else np.iinfo(np.int64).min
        got = self._a2a(what, torch.from_numpy(h.reshape(-1)), [3] * w, [3] * w, torch.int64).cpu().numpy()
        got = got.reshape(w, 3)
        if error is not None:
            raise error[0]
        bad = np.flatnonzero(got[:, 1])
        if len(bad):
            k = int(bad[0])
            v = int(got[k, 2])
            if v != np.iinfo(np.int64).min:
                raise IndexError(f"index {v} is out of bounds for dimension 0 with size {self.rows} (given by rank "
                                 f"{k}; every rank skips this {what.split()[0]})")
            raise IndexError(f"rank {k} gave an index that was refused; every rank skips this {what.split()[0]}")
        return got[:, 0]

    def _send_to_owners(self, items, owners, error, counts_what, items_what):
        """Sends each rank the ``items`` it owns (``owners``: the rank of each;
        both None with ``error``) in two exchanges: the counts, named
        ``counts_what``, with this rank's ``error`` (every rank raises where
        one had one), then the items, ``items_what``. A :data:`_Routed`."""
        torch = _torch()
        w, me = self.world_size, self.rank
        counts = np.bincount(owners, minlength=w).astype(np.int64) if error is None else np.zeros(w, np.int64)
        sent = counts.copy()
        sent[me] = 0
        asked = self._header(counts_what, sent, error)  # raises on every rank where one had an error
        order = np.argsort(owners, kind="stable")
        grouped = items[order]
        starts = np.concatenate([[0], np.cumsum(counts)])
        mine = grouped[starts[me]:starts[me + 1]]
        others = np.concatenate([grouped[:starts[me]], grouped[starts[me + 1]:]])
        received = self._a2a(items_what, torch.from_numpy(others), sent, asked, torch.int64)
        return _Routed(order, starts, mine, sent, asked, received)

    def _index(self, index, what="index"):
        """(idx, None) or (None, (exception, bad value or None))."""
        try:
            return as_index(index, self.rows, what), None
        except Exception as e:  # noqa: BLE001 (sent to the peers, raised here after)
            bad = None
            if isinstance(e, IndexError):
                try:
                    bad = int(str(e).split(f"{what} ", 1)[1].split(" ", 1)[0])
                except (IndexError, ValueError):
                    bad = None
            return None, (e, bad)

    # -- rows and their owners ---------------------------------------------------------
    def owner(self, index):
        """The rank owning each row of ``index`` (int64 numpy)."""
        return self.layout.owner_of_rows(as_index(index, self.rows))

    def _to_local(self, rows):
        """Rows this rank owns, in its shard's numbering."""
        rows = np.asarray(rows, dtype=np.int64)
        if not self.sharded_files:
            return rows
        lines = rows // self.rows_per_line
        return self.layout.local_lines(lines) * self.rows_per_line + (rows - lines * self.rows_per_line)

    def _tier_hits(self, local_rows):
        """Whether each row's line is in a cache tier of the shard now (before its gather)."""
        tiers = self.local._tiers
        lines = np.asarray(local_rows, dtype=np.int64) // self.rows_per_line
        hit = tiers.directory.lookup(lines) >= 0
        if len(tiers.hot_lines):
            hit |= np.isin(lines, tiers.hot_lines)
        if len(tiers.victims):
            held = np.fromiter(tiers.victims.slot_of_line.keys(), dtype=np.int64)
            hit |= np.isin(lines, held)
        return hit

    # -- the API -----------------------------------------------------------------
    @property
    def shape(self):
        return (self.rows, self.width)

    def size(self, dim=None):
        torch = _torch()
        s = torch.Size(self.shape)
        return s if dim is None else s[dim]

    def __len__(self):
        return self.rows

    def __repr__(self):
        return (f"ShardedFeatureStore({self.path!r}, shape={self.shape}, dtype={self.dtype}, device={self.device}, "
                f"rank={self.rank}/{self.world_size}, backend={self.backend!r}, partition={self.partition!r})")

    def gather(self, index):
        """Rows ``index`` of the table, a ``(len(index), width)`` tensor on the
        store's device. Collective: every rank calls it (an empty index where
        it has no rows to ask)."""
        torch = _torch()
        with self._lock:
            self._check()
            t0 = time.perf_counter()
            st, me, rb = self._st, self.rank, self.row_bytes
            idx, error = self._index(index)
            u, inv = np.unique(idx, return_inverse=True) if error is None else (None, None)
            routed = self._send_to_owners(u, self.layout.owner_of_rows(u) if error is None else None, error,
                                          "gather request counts", "gather request ids")
            mine, recv_ids = routed.mine, routed.received.cpu().numpy()
            # One gather of the shard for the union of what every rank asked of it.
            want = np.concatenate([mine, recv_ids])
            uu, uinv = np.unique(want, return_inverse=True)
            local_rows = self._to_local(uu)
            if len(recv_ids):
                hit = self._tier_hits(local_rows)[uinv[len(mine):]]
                st["remote_hits"] += int(hit.sum())
                st["remote_storage_rows"] += int(len(hit) - hit.sum())
            data = self.local.gather(local_rows)
            dev = data.device
            served = data[torch.from_numpy(uinv).to(dev)] if len(want) else data
            resp = served[len(mine):].contiguous()
            resp_bytes = resp.view(torch.uint8).reshape(-1) if resp.numel() else \
                torch.empty(0, dtype=torch.uint8, device=dev)
            recv = self._a2a("gather responses", resp_bytes, routed.asked * rb, routed.sent * rb, torch.uint8)
            recv = recv.to(dev).reshape(-1, rb).view(self.dtype).reshape(-1, self.width) if recv.numel() else \
                torch.empty((0, self.width), dtype=self.dtype, device=dev)
            # Back into the caller's order.
            if error is None and len(u):
                rows_sorted = torch.empty((len(u), self.width), dtype=self.dtype, device=dev)
                a, b = int(routed.starts[me]), int(routed.starts[me + 1])
                rows_sorted[a:b] = served[:len(mine)]
                rows_sorted[:a] = recv[:a]
                rows_sorted[b:] = recv[a:]
                out_u = torch.empty_like(rows_sorted)
                out_u[torch.from_numpy(routed.order).to(dev)] = rows_sorted
                out = out_u[torch.from_numpy(inv.reshape(-1)).to(dev)]
            else:
                out = torch.empty((0, self.width), dtype=self.dtype, device=dev)
            st["gathers"] += 1
            st["requests"] += len(idx)
            n_local = int((self.layout.owner_of_rows(idx) == me).sum()) if len(idx) else 0
            st["local_rows"] += n_local
            st["remote_rows"] += len(idx) - n_local
            st["remote_unique_rows"] += int(routed.sent.sum())
            st["served_rows"] += len(recv_ids)
            st["gather_seconds"] += time.perf_counter() - t0
            return out

    def prefetch(self, future_index):
        """Announces a batch that a later :meth:`gather` of this rank will ask for
        (in gather order; see :meth:`spillfs.gnn.FeatureStore.prefetch`): the
        lines go to their owners, whose windows hold the union of every
        rank's. Collective when ``window`` > 0 (every rank calls it, an empty
        index where it has nothing to announce)."""
        with self._lock:
            self._check()
            idx, error = self._index(future_index, "prefetch index")
            if self.window_size == 0:
                if error is not None:
                    raise error[0]
                return
            rpl = self.rows_per_line
            lines = np.unique(idx // rpl) if error is None else None
            routed = self._send_to_owners(lines, self.layout.owner_of_lines(lines) if error is None else None, error,
                                          "prefetch line counts", "prefetch lines")
            union = np.unique(np.concatenate([routed.mine, routed.received.cpu().numpy()]))
            self.local.prefetch(self._to_local(union * rpl))  # a line by its first row
            self._st["prefetches"] += 1

    def __getitem__(self, index):
        return rows_by_index(self.gather, index)

    def stats(self, aggregate=False):
        """This rank's counters: as requester, ``requests`` = ``local_rows``
        (rows it owns) + ``remote_rows`` (rows of peers; ``remote_unique_rows``
        sent after deduplication); as owner, ``served_rows`` (rows peers asked
        of it) = ``remote_hits`` (served from its cache tiers) +
        ``remote_storage_rows``; ``bytes_sent``/``bytes_received`` (headers,
        ids and rows exchanged with peers), ``exchange_seconds``,
        ``gather_seconds``; ``shard``: its FeatureStore's stats() (hits per
        tier of the union it gathered). With ``aggregate=True`` (collective):
        every counter summed over the ranks (the shard's too, under
        ``shard``), ``hit_rate`` of the shards together, ``remote_hit_rate``,
        and ``ranks``: each rank's own stats."""
        with self._lock:
            self._check()
            d = dict(self._st)
            d.update(rank=self.rank, world_size=self.world_size, partition=self.partition, backend=self.backend,
                     owned_rows=len(self.owned_rows), shard=self.local.stats())
            if not aggregate:
                return d
            everyone = [None] * self.world_size
            try:
                self._dist.all_gather_object(everyone, d, group=self.group)
            except Exception as e:  # noqa: BLE001
                raise self._fail("stats", e) from e
            total = {k: sum(r[k] for r in everyone) for k in _STATS + ("exchange_seconds", "gather_seconds",
                                                                       "owned_rows")}
            shard = {}
            for k, v in everyone[0]["shard"].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("rows_per_line",
                                                                                          "line_bytes"):
                    shard[k] = sum(r["shard"][k] for r in everyone)
            req = shard.get("requests", 0)
            shard["hit_rate"] = (req - shard["storage_rows"]) / req if req else 0.0
            useful = shard["storage_rows"] * self.row_bytes
            shard["read_amplification"] = shard["ssd_bytes"] / useful if useful else 0.0
            total.update(world_size=self.world_size, partition=self.partition, backend=self.backend, shard=shard,
                         hit_rate=shard["hit_rate"],
                         remote_hit_rate=(total["remote_hits"] / total["served_rows"]) if total["served_rows"]
                         else 0.0, ranks=everyone)
            return total

    def close(self):
        with self._lock:
            self.local.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_STATS = ("gathers", "prefetches", "requests", "local_rows", "remote_rows", "remote_unique_rows", "served_rows",
          "remote_hits", "remote_storage_rows", "bytes_sent", "bytes_received")
