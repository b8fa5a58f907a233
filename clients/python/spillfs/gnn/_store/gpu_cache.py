"""The tiers of ``FeatureStore(device="cuda")``: the GPU software cache of
libspillfs_client (``spill_gpu_cache_*``: lines in HBM, the hot-node and victim
buffers in pinned GPU-mapped host memory, the request ring, pinned staging),
driven by the policies of :mod:`.line_cache`.

One batch: the gather kernel serves what HBM and the hot buffer hold and posts
the rest to the ring; the host reads the ring, takes the lines the victim
buffer holds, reads the rest from storage into staging (``spill_file_read_rows``
straight into pinned memory), and one fill per staging load evicts (victims the
window reuses go to the victim buffer, written by the GPU), copies staging to
the GPU, scatters the rows into the output and installs the lines.

Threading: called under the FeatureStore's lock.
"""

import ctypes
import errno

import numpy as np

from ... import _native
from . import line_cache
from .index import as_index

__all__ = ["GpuTiers"]


class _Shape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("row_bytes", "rows", "rows_per_line", "cache_lines", "hot_lines",
                                               "victim_lines", "staging_lines")]


class _Counts(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("gpu_hits", "hot_hits", "misses")]


_P = ctypes.POINTER(ctypes.c_int64)


class _Fill(ctypes.Structure):
    _fields_ = [("n_evicted", ctypes.c_size_t), ("evicted_lines", _P), ("evicted_slots", _P),
                ("victim_slots", _P), ("n_staged", ctypes.c_size_t), ("staged_lines", _P),
                ("install_slots", _P), ("n_entries", ctypes.c_size_t), ("entry_rows", _P),
                ("entry_positions", _P), ("entry_staged", _P)]


def _library():
    lib = _native.segment_io()
    if lib is None or not hasattr(lib, "spill_gpu_cache_create"):
        raise RuntimeError("FeatureStore(device='cuda') needs libspillfs_client.so with the GPU feature cache "
                           "(set SPILLFS_CLIENT_LIB)")
    vp, sz, u32, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_int32
    lib.spill_gpu_cache_create.argtypes = [i32, ctypes.POINTER(_Shape)]
    lib.spill_gpu_cache_create.restype = vp
    lib.spill_gpu_cache_destroy.argtypes = [vp]
    lib.spill_gpu_cache_host_buffer.argtypes = [vp, ctypes.c_int]
    lib.spill_gpu_cache_host_buffer.restype = vp
    lib.spill_gpu_cache_set_hot.argtypes = [vp, vp, sz]
    lib.spill_gpu_cache_gather.argtypes = [vp, vp, sz, vp, u32, ctypes.c_size_t, ctypes.POINTER(_Counts)]
    lib.spill_gpu_cache_misses.argtypes = [vp, vp, vp, sz]
    lib.spill_gpu_cache_stamps.argtypes = [vp, vp]
    lib.spill_gpu_cache_fill.argtypes = [vp, ctypes.POINTER(_Fill), vp, u32, ctypes.c_size_t]
    for name in ("spill_gpu_cache_set_hot", "spill_gpu_cache_gather", "spill_gpu_cache_misses",
                 "spill_gpu_cache_stamps", "spill_gpu_cache_fill", "spill_gpu_cache_destroy"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _host_view(lib, cache, which, lines, rpl, rb):
    if lines == 0:
        return np.empty((0, rpl, rb), dtype=np.uint8)
    addr = lib.spill_gpu_cache_host_buffer(cache, which)
    buf = (ctypes.c_uint8 * (lines * rpl * rb)).from_address(addr)
    return np.frombuffer(buf, dtype=np.uint8).reshape(lines, rpl, rb)


def _ptr(a):
    return a.ctypes.data_as(_P) if a is not None and len(a) else None


class GpuTiers:
    def __init__(self, store, gpu_cache_bytes, host_bytes, victim_bytes, hot_lines):
        import torch
        self.lib = lib = _library()
        info, lb, rpl = store.info, store.line_bytes, store.rows_per_line
        dev = store.device
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        store.device = dev
        self.device = dev
        n_cache = max(0, int(gpu_cache_bytes) // lb)
        budget = max(0, int(host_bytes)) // lb
        if victim_bytes is None:
            victim_bytes = host_bytes // 4 if store.window_size > 0 else 0
        n_victim = min(int(victim_bytes) // lb, budget)
        n_hot = min(len(hot_lines), budget - n_victim)
        n_staging = int(max(1, min(store.n_lines, max(64, (64 << 20) // lb))))
        self.hot_lines = np.asarray(hot_lines[:n_hot], dtype=np.int64)
        shape = _Shape(info.row_bytes, info.rows, rpl, n_cache, n_hot, n_victim, n_staging)
        self.cache = lib.spill_gpu_cache_create(dev.index or 0, ctypes.byref(shape))
        if not self.cache:
            err = ctypes.get_errno() or 5
            raise _native.SpillError(err, f"cannot make the GPU feature cache: {_native.last_error()}", info.path)
        self.hot = _host_view(lib, self.cache, 0, n_hot, rpl, info.row_bytes)
        self.victim_data = _host_view(lib, self.cache, 1, n_victim, rpl, info.row_bytes)
        self.staging = _host_view(lib, self.cache, 2, n_staging, rpl, info.row_bytes)
        if n_hot:
            store._read_lines(self.hot_lines, out=self.hot)
            _native.check(lib.spill_gpu_cache_set_hot(self.cache, self.hot_lines.ctypes.data, n_hot),
                          "setting the hot lines", info.path)
        self.directory = line_cache.LineDirectory(store.n_lines, n_cache, store.policy, store.line_score)
        self.victims = line_cache.VictimBuffer(n_victim)
        self.stamps = np.zeros(n_cache, dtype=np.uint32)

    def _index(self, store, index):
        """The index as int64 on the device. An integer tensor goes as it is:
        negatives and the range check are the gather kernel's (-ERANGE:
        :meth:`_refuse`), not torch ops here, which cost a wait a batch."""
        import torch
        if isinstance(index, torch.Tensor) and index.dtype != torch.bool and not index.is_floating_point() \
                and not index.is_complex():
            return index.reshape(-1).to(self.device, torch.int64).contiguous()
        return torch.from_numpy(as_index(index, store.info.rows)).to(self.device)

    @staticmethod
    def _refuse(index, idx, rows):
        """After the gather refused ``idx`` (-ERANGE): IndexError naming the first
        index out of range, as ``index`` gave it."""
        bad = (idx < -rows) | (idx >= rows)
        if bool(bad.any()):
            first = int(index.reshape(-1)[bad.nonzero()[0, 0].to(index.device)])
            raise IndexError(f"index {first} is out of bounds for dimension 0 with size {rows}")

    def gather(self, store, index, st):
        import torch
        lib, info = self.lib, store.info
        idx = self._index(store, index)
        n = idx.numel()
        out = torch.empty((n, info.width), dtype=store.dtype, device=self.device)
        if n == 0:
            return out
        stamp = store.stamp & 0xFFFFFFFF
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        counts = _Counts()
        rc = lib.spill_gpu_cache_gather(self.cache, idx.data_ptr(), n, out.data_ptr(), stamp, stream,
                                        ctypes.byref(counts))
        if rc == -errno.ERANGE:  # refused whole: nothing gathered, counted or stamped
            self._refuse(index, idx, info.rows)
        _native.check(rc, "gathering rows", info.path)
        st.requests += n
        st.gpu_hits += counts.gpu_hits
        st.hot_hits += counts.hot_hits
        m = int(counts.misses)
        if m == 0:
            return out
        rows = np.empty(m, dtype=np.int64)
        pos = np.empty(m, dtype=np.int64)
        _native.check(lib.spill_gpu_cache_misses(self.cache, rows.ctypes.data, pos.ctypes.data, m), "reading the ring")
        if self.directory.capacity:
            _native.check(lib.spill_gpu_cache_stamps(self.cache, self.stamps.ctypes.data), "reading stamps")
            self.directory.last_use[:] = self.stamps
        rpl = store.rows_per_line
        lines = rows // rpl
        ul, inv = np.unique(lines, return_inverse=True)
        cap = len(self.staging)
        for c0 in range(0, len(ul), cap):
            c1 = min(len(ul), c0 + cap)
            chunk = ul[c0:c1]
            sel = np.flatnonzero((inv >= c0) & (inv < c1))
            vs = self.victims.take(chunk)
            fromv = vs >= 0
            if fromv.any():
                self.staging[np.flatnonzero(fromv)] = self.victim_data[vs[fromv]]
                self.victims.release(vs[fromv])
            need = np.flatnonzero(~fromv)
            if len(need):
                import time
                t0 = time.perf_counter()
                ios, io_bytes = store.reader.ios, store.reader.io_bytes
                store._read_lines(chunk[need], into=(self.staging, need))
                st.stalls += 1
                st.stall_seconds += time.perf_counter() - t0
                st.ssd_reads += store.reader.ios - ios
                st.ssd_bytes += store.reader.io_bytes - io_bytes
            entry_staged = inv[sel] - c0
            from_victim_rows = fromv[entry_staged]
            st.victim_hits += int(from_victim_rows.sum())
            st.storage_rows += int(len(sel) - from_victim_rows.sum())
            slots, ev_lines, ev_slots, ev_reuse = self.directory.admit(chunk, stamp, store.window)
            vslots = self.victims.place(ev_lines, ev_reuse) if len(ev_lines) else np.empty(0, np.int64)
            st.evictions += len(ev_lines)
            st.victims_stored += int((vslots >= 0).sum())
            entry_rows = np.ascontiguousarray(rows[sel])
            entry_pos = np.ascontiguousarray(pos[sel])
            entry_staged = np.ascontiguousarray(entry_staged, dtype=np.int64)
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            chunk = np.ascontiguousarray(chunk)
            fill = _Fill(len(ev_lines), _ptr(ev_lines), _ptr(ev_slots), _ptr(vslots), len(chunk), _ptr(chunk),
                         _ptr(slots), len(sel), _ptr(entry_rows), _ptr(entry_pos), _ptr(entry_staged))
            _native.check(lib.spill_gpu_cache_fill(self.cache, ctypes.byref(fill), out.data_ptr(), stamp, stream),
                          "filling the GPU cache", info.path)
        return out

    def restore_victims(self, store, st):
        """LSM-GNN's preemptive victim prefetch: victim lines the next batch uses
        go back into HBM now (one fill), ahead of it."""
        lines = self.victims.needed_next(store.window)[:len(self.staging)]
        if len(lines) == 0 or self.directory.capacity == 0:
            return
        if self.directory.capacity:
            _native.check(self.lib.spill_gpu_cache_stamps(self.cache, self.stamps.ctypes.data), "reading stamps")
            self.directory.last_use[:] = self.stamps
        stamp = store.stamp & 0xFFFFFFFF
        vslots = self.victims.take(lines)
        slots, ev_lines, ev_slots, ev_reuse = self.directory.admit(lines, stamp, store.window)
        admitted = slots >= 0
        k = int(admitted.sum())
        if k:
            self.staging[:k] = self.victim_data[vslots[admitted]]
        self.victims.release(vslots[admitted])
        self.victims.put_back(lines[~admitted], vslots[~admitted])
        vkeep = self.victims.place(ev_lines, ev_reuse) if len(ev_lines) else np.empty(0, np.int64)
        st.evictions += len(ev_lines)
        st.victims_stored += int((vkeep >= 0).sum())
        staged = np.ascontiguousarray(lines[admitted])
        install = np.ascontiguousarray(slots[admitted])
        fill = _Fill(len(ev_lines), _ptr(ev_lines), _ptr(ev_slots), _ptr(vkeep), k, _ptr(staged), _ptr(install),
                     0, None, None, None)
        import torch
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        _native.check(self.lib.spill_gpu_cache_fill(self.cache, ctypes.byref(fill), None, stamp, stream),
                      "copying victims back", store.info.path)
        st.victims_restored += k

    def close(self):
        if self.cache:
            self.lib.spill_gpu_cache_destroy(self.cache)
            self.cache = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
