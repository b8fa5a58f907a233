"""The single-process store of :mod:`spillfs.gnn`: :class:`FeatureStore` over
its tiers (:class:`_HostTiers` here for ``device="cpu"``; :mod:`.gpu_cache`'s
``GpuTiers`` for CUDA), with the hot-row scores :func:`degree_score` and
:func:`reverse_pagerank`. The user's view (tiers, hot rows, eviction, errors,
threading) is :mod:`spillfs.gnn`'s docstring.
"""

import os
import threading
import time

import numpy as np

from . import line_cache
from .gpu_cache import GpuTiers
from .index import as_index, rows_by_index
from .table import RowReader, open_table, torch_dtype

__all__ = ["FeatureStore", "degree_score", "reverse_pagerank", "score_rows"]


def _torch():
    import torch
    return torch


def degree_score(indptr):
    """Out-degree of each node of a CSR ``indptr`` (float64 numpy)."""
    indptr = np.asarray(indptr.cpu() if hasattr(indptr, "cpu") else indptr, dtype=np.int64)
    return np.diff(indptr).astype(np.float64)


def reverse_pagerank(indptr, indices, iterations=20, damping=0.85, device=None):
    """Reverse PageRank of a graph in CSR (``indptr``, ``indices``: row u's
    neighbours), computed with torch ops on ``device`` (default: where
    ``indices`` is): mass flows from a node to the neighbours a sampler picks
    from its row, so rows often sampled score high (GIDS's hot-node score:
    20 iterations, damping 0.85). Returns a float64 numpy array."""
    torch = _torch()
    indptr = torch.as_tensor(indptr)
    indices = torch.as_tensor(indices)
    dev = torch.device(device) if device is not None else indices.device
    indptr = indptr.to(dev, torch.int64)
    indices = indices.to(dev, torch.int64)
    n = indptr.numel() - 1
    if n <= 0:
        return np.zeros(0)
    deg = (indptr[1:] - indptr[:-1]).to(torch.float64)
    src = torch.repeat_interleave(torch.arange(n, device=dev), indptr[1:] - indptr[:-1])
    x = torch.full((n,), 1.0 / n, dtype=torch.float64, device=dev)
    dangling = deg == 0
    inv_deg = torch.where(dangling, torch.zeros_like(deg), 1.0 / deg.clamp(min=1))
    for _ in range(int(iterations)):
        share = (x * inv_deg)[src]
        nxt = torch.zeros_like(x).index_add_(0, indices, share)
        lost = x[dangling].sum()
        x = (1.0 - damping) / n + damping * (nxt + lost / n)
    return x.cpu().numpy()



def score_rows(score, graph, rows, device):
    """The score of each of a table's ``rows`` (float64 numpy) from a store's
    ``score=`` and ``graph=`` (see :mod:`spillfs.gnn`): an array, ``"degree"``
    or ``"pagerank"`` (on ``device`` where it is CUDA), the degree where only
    the graph is given, None where neither is."""
    if score is None:
        return degree_score(graph[0])[:rows] if graph is not None else None
    if isinstance(score, str):
        if graph is None:
            raise ValueError(f"score={score!r} needs graph=(indptr, indices)")
        if score == "degree":
            s = degree_score(graph[0])
        elif score == "pagerank":
            s = reverse_pagerank(graph[0], graph[1], device=device if device.type == "cuda" else None)
        else:
            raise ValueError(f"score must be an array, 'degree' or 'pagerank', not {score!r}")
    else:
        s = score.detach().cpu().numpy() if hasattr(score, "detach") else score
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    if len(s) != rows:
        raise ValueError(f"score has {len(s)} values for a table of {rows} rows")
    return s

class _Stats:
    FIELDS = ("gathers", "requests", "gpu_hits", "cache_hits", "hot_hits", "victim_hits", "storage_rows",
              "ssd_reads", "ssd_bytes", "stalls", "stall_seconds", "gather_seconds", "evictions",
              "victims_stored", "victims_restored", "victims_dropped", "prefetches")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, 0)


class _HostTiers:
    """device="cpu": a host cache of lines (its hot part never evicted), a victim
    part, then storage."""

    def __init__(self, store, host_bytes, victim_bytes, hot_lines):
        info, lb = store.info, store.line_bytes
        budget = max(0, int(host_bytes)) // lb
        n_hot = min(len(hot_lines), budget // 2 if victim_bytes is None or budget > 0 else budget)
        n_hot = min(len(hot_lines), max(n_hot, 0))
        self.hot_lines = np.asarray(hot_lines[:n_hot], dtype=np.int64)
        if victim_bytes is None:
            victim_bytes = (host_bytes // 8) if store.window_size > 0 else 0
        n_victim = min(int(victim_bytes) // lb, max(0, budget - n_hot))
        n_cache = max(0, budget - n_hot - n_victim)
        shape = (store.rows_per_line, info.row_bytes)
        self.hot = np.empty((n_hot,) + shape, dtype=np.uint8)
        self.cache = np.empty((n_cache,) + shape, dtype=np.uint8)
        self.victim_data = np.empty((n_victim,) + shape, dtype=np.uint8)
        self.hot_slot = np.full(store.n_lines, -1, dtype=np.int64)
        self.hot_slot[self.hot_lines] = np.arange(n_hot)
        if n_hot:
            store._read_lines(self.hot_lines, self.hot)
        self.directory = line_cache.LineDirectory(store.n_lines, n_cache, store.policy, store.line_score)
        self.victims = line_cache.VictimBuffer(n_victim)

    def gather(self, store, idx, st):
        n = len(idx)
        rpl, rb = store.rows_per_line, store.info.row_bytes
        out = np.empty((n, rb), dtype=np.uint8)
        if n == 0:
            return out
        lines = idx // rpl
        within = idx - lines * rpl
        ul, inv = np.unique(lines, return_inverse=True)
        hot = self.hot_slot[ul]
        slot = self.directory.lookup(ul)
        slot[hot >= 0] = -1
        row_hot = hot[inv]
        row_slot = slot[inv]
        m = row_hot >= 0
        if m.any():
            out[m] = self.hot[row_hot[m], within[m]]
            st.hot_hits += int(m.sum())
        m = row_slot >= 0
        if m.any():
            out[m] = self.cache[row_slot[m], within[m]]
            st.cache_hits += int(m.sum())
            self.directory.touch(slot[slot >= 0], store.stamp)
        missing_u = np.flatnonzero((hot < 0) & (slot < 0))
        if len(missing_u) == 0:
            return out
        missing = ul[missing_u]
        staged = np.empty((len(missing), rpl, rb), dtype=np.uint8)
        vslots = self.victims.take(missing)
        from_victim = vslots >= 0
        if from_victim.any():
            staged[from_victim] = self.victim_data[vslots[from_victim]]
        need = ~from_victim
        if need.any():
            t0 = time.perf_counter()
            ios, io_bytes = store.reader.ios, store.reader.io_bytes
            store._read_lines(missing[need], into=(staged, np.flatnonzero(need)))
            st.stalls += 1
            st.stall_seconds += time.perf_counter() - t0
            st.ssd_reads += store.reader.ios - ios
            st.ssd_bytes += store.reader.io_bytes - io_bytes
        # Rows of the missing lines, by tier.
        pos = np.full(len(ul), -1, dtype=np.int64)
        pos[missing_u] = np.arange(len(missing))
        row_pos = pos[inv]
        m = row_pos >= 0
        out[m] = staged[row_pos[m], within[m]]
        row_from_victim = np.zeros(len(missing), dtype=bool)
        row_from_victim[from_victim] = True
        vm = m.copy()
        vm[m] = row_from_victim[row_pos[m]]
        st.victim_hits += int(vm.sum())
        st.storage_rows += int(m.sum() - vm.sum())
        # Into the cache; victims the window reuses into the victim buffer.
        slots, ev_lines, ev_slots, ev_reuse = self.directory.admit(missing, store.stamp, store.window)
        self._store_victims(ev_lines, ev_slots, ev_reuse, st)
        admitted = slots >= 0
        if admitted.any():
            self.cache[slots[admitted]] = staged[admitted]
        self.victims.release(vslots[from_victim])
        return out

    def restore_victims(self, store, st):
        """LSM-GNN's preemptive victim prefetch: victim lines the next batch
        uses go back into the cache now, ahead of it."""
        lines = self.victims.needed_next(store.window)
        if len(lines) == 0:
            return
        vslots = self.victims.take(lines)
        slots, ev_lines, ev_slots, ev_reuse = self.directory.admit(lines, store.stamp, store.window)
        admitted = slots >= 0
        data = self.victim_data[vslots[admitted]]  # before evictions may reuse the freed slots
        self.victims.release(vslots[admitted])
        self.victims.put_back(lines[~admitted], vslots[~admitted])
        self._store_victims(ev_lines, ev_slots, ev_reuse, st)
        self.cache[slots[admitted]] = data
        st.victims_restored += int(admitted.sum())

    def _store_victims(self, ev_lines, ev_slots, ev_reuse, st):
        """Lines just evicted (from cache slots ev_slots) that the window
        reuses go into the victim buffer, while it has room."""
        st.evictions += len(ev_lines)
        if len(ev_lines) == 0:
            return
        keep = self.victims.place(ev_lines, ev_reuse)
        k = keep >= 0
        if k.any():
            self.victim_data[keep[k]] = self.cache[ev_slots[k]]
            st.victims_stored += int(k.sum())


class FeatureStore:
    """A feature table (rows = nodes) gathered by index on ``device`` through a
    cache. See the module's documentation.

    Arguments beyond the issue's: ``shape``, ``dtype``, ``offset`` (raw
    tables), ``score`` (per-row static score, or ``"degree"``/``"pagerank"``
    with ``graph=(indptr, indices)``), ``victim_bytes`` (default: an eighth of
    ``host_bytes`` on the CPU when there is a window, a quarter on CUDA),
    ``line_bytes`` (about 4096: rows per line = line_bytes // row bytes, at
    least 1), ``posix`` (read with os.pread instead of the library)."""

    def __init__(self, path, device="cpu", gpu_cache_bytes=None, host_bytes=None, hot=None, window=0,
                 policy="hybrid", *, shape=None, dtype=None, offset=0, score=None, graph=None, victim_bytes=None,
                 line_bytes=4096, posix=None):
        torch = _torch()
        if policy not in line_cache.POLICIES:
            raise ValueError(f"policy must be one of {', '.join(line_cache.POLICIES)}, not {policy!r}")
        self.path = os.fspath(path)
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, not {self.device}")
        self.info = open_table(self.path, shape=shape, dtype=dtype, offset=offset)
        self.dtype = torch_dtype(self.info)
        self.policy = policy
        self.window_size = max(0, int(window or 0))
        self.window = line_cache.Window(self.window_size)
        info = self.info
        self.rows_per_line = max(1, int(line_bytes) // max(1, info.row_bytes))
        self.line_bytes = self.rows_per_line * info.row_bytes
        self.n_lines = -(-info.rows // self.rows_per_line)
        self.reader = RowReader(info, posix=posix)
        self.stamp = 0
        self._lock = threading.RLock()
        self._stats = _Stats()
        row_score = score_rows(score, graph, info.rows, self.device)
        self.row_score = row_score
        self.line_score = self._line_max(row_score) if row_score is not None else None
        hot_lines = self._hot_lines(hot, row_score)
        table_bytes = info.rows * info.row_bytes
        if host_bytes is None:
            host_bytes = min(1 << 30, max(table_bytes // 4, self.line_bytes))
        if self.device.type == "cpu":
            self._tiers = _HostTiers(self, host_bytes, victim_bytes, hot_lines)
        else:
            if gpu_cache_bytes is None:
                gpu_cache_bytes = min(1 << 30, max(table_bytes // 4, self.line_bytes))
            self._tiers = GpuTiers(self, gpu_cache_bytes, host_bytes, victim_bytes, hot_lines)

    # -- description ----------------------------------------------------
    @property
    def shape(self):
        return self.info.shape

    def size(self, dim=None):
        torch = _torch()
        s = torch.Size(self.info.shape)
        return s if dim is None else s[dim]

    def __len__(self):
        return self.info.rows

    def __repr__(self):
        return (f"FeatureStore({self.path!r}, shape={self.shape}, dtype={self.dtype}, device={self.device}, "
                f"policy={self.policy!r}, backend={self.reader.backend!r})")

    # -- scores ---------------------------------------------------------
    def _line_max(self, row_score):
        rpl = self.rows_per_line
        padded = np.full(self.n_lines * rpl, -np.inf)
        padded[:len(row_score)] = row_score
        return padded.reshape(self.n_lines, rpl).max(axis=1)

    def _hot_lines(self, hot, row_score):
        """The lines of the hot rows, best first."""
        if hot is None or (isinstance(hot, (int, np.integer)) and not isinstance(hot, bool) and hot == 0):
            return np.empty(0, dtype=np.int64)
        if isinstance(hot, (int, np.integer)) and not isinstance(hot, bool):
            if row_score is None:
                raise ValueError("hot=<count> needs a score: score=<array>, or graph=(indptr, indices) with "
                                 "score='degree' or 'pagerank'")
            k = min(int(hot), self.info.rows)
            rows = np.argsort(-row_score, kind="stable")[:k]
        else:
            rows = as_index(hot, self.info.rows, "hot row")
            if row_score is not None:
                rows = rows[np.argsort(-row_score[rows], kind="stable")]
        lines = rows // self.rows_per_line
        _, first = np.unique(lines, return_index=True)
        return lines[np.sort(first)]

    # -- I/O -------------------------------------------------------------
    def _read_lines(self, lines, out=None, into=None):
        """Reads whole lines (the last one partial: its missing rows are left as
        they were) into ``out`` (k, rpl, rb) or into ``into = (array, positions)``
        (lines k go to array[positions[k]]); returns the array."""
        rpl, rb, rows = self.rows_per_line, self.info.row_bytes, self.info.rows
        lines = np.asarray(lines, dtype=np.int64)
        if into is None:
            if out is None:
                out = np.empty((len(lines), rpl, rb), dtype=np.uint8)
            into = (out, np.arange(len(lines)))
        array, positions = into[0], np.asarray(into[1], dtype=np.int64)
        if not array.flags.c_contiguous:
            raise ValueError("lines are read into C-contiguous arrays only")
        r = (lines[:, None] * rpl + np.arange(rpl)[None, :]).reshape(-1)
        valid = r < rows
        contiguous = len(positions) and positions[-1] - positions[0] == len(positions) - 1
        if contiguous and valid.all() and array.flags.c_contiguous:
            # Straight into place (pinned staging on the GPU path).
            self.reader.read(r, out=array[positions[0]:positions[-1] + 1].reshape(-1))
            return array
        data = self.reader.read(r[valid]).reshape(-1, rb)
        slots = (positions[:, None] * rpl + np.arange(rpl)[None, :]).reshape(-1)[valid]
        array.reshape(-1, rb)[slots] = data
        return array

    # -- the API -----------------------------------------------------------
    def _to_tensor(self, raw):
        torch = _torch()
        if len(raw) == 0:
            return torch.empty((0, self.info.width), dtype=self.dtype)
        return torch.from_numpy(raw).view(self.dtype).reshape(len(raw), self.info.width)

    def gather(self, index):
        """Rows ``index`` of the table, a ``(len(index), width)`` tensor on the
        store's device (the index on the CPU or a GPU, any integer dtype)."""
        with self._lock:
            t0 = time.perf_counter()
            st = self._stats
            self.stamp += 1
            self.window.pop()
            if not isinstance(self._tiers, _HostTiers):
                out = self._tiers.gather(self, index, st)
            else:
                idx = as_index(index, self.info.rows)
                out = self._to_tensor(self._tiers.gather(self, idx, st))
                st.requests += len(idx)
            self._tiers.restore_victims(self, st)  # ahead of the next batch
            self._tiers.victims.age(self.window)  # after the batch took what it needed
            st.gathers += 1
            st.victims_dropped = self._tiers.victims.dropped
            st.gather_seconds += time.perf_counter() - t0
            return out

    def prefetch(self, future_index):
        """Announces a batch that a later :meth:`gather` will ask for (batches
        in the order they will be gathered; the window holds ``window`` of
        them): hybrid eviction keeps lines it needs, and lines evicted while
        it needs them go to the victim buffer."""
        with self._lock:
            idx = as_index(future_index, self.info.rows, "prefetch index")
            if self.window_size == 0:
                return
            self.window.push(idx // self.rows_per_line)
            self._stats.prefetches += 1

    def __getitem__(self, index):
        return rows_by_index(self.gather, index)

    def stats(self):
        """Counters since the store was made: rows asked (``requests``) and
        where they came from (``gpu_hits``, ``cache_hits``, ``hot_hits``,
        ``victim_hits``, ``storage_rows``: these add up to ``requests``;
        ``victims_restored``: victim lines copied back ahead of the batch
        that needs them, whose rows then count as cache hits), storage
        reads (``ssd_reads``, ``ssd_bytes``, ``read_amplification`` = SSD
        bytes / bytes of the rows read from storage), ``stalls`` (gathers that
        waited for storage) and ``stall_seconds``, ``evictions``,
        ``victims_stored``, the capacities (``*_lines``) and ``hit_rate``."""
        with self._lock:
            st = self._stats
            d = {f: getattr(st, f) for f in _Stats.FIELDS}
            useful = st.storage_rows * self.info.row_bytes
            d["read_amplification"] = (st.ssd_bytes / useful) if useful else 0.0
            d["hit_rate"] = ((st.requests - st.storage_rows) / st.requests) if st.requests else 0.0
            d["rows_per_line"] = self.rows_per_line
            d["line_bytes"] = self.line_bytes
            d["cache_lines"] = self._tiers.directory.capacity
            d["hot_lines"] = len(self._tiers.hot_lines)
            d["victim_lines"] = self._tiers.victims.capacity
            d["backend"] = self.reader.backend
            return d

    def close(self):
        with self._lock:
            close = getattr(self._tiers, "close", None)
            if close is not None:
                close()
            self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

