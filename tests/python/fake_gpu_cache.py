"""An emulation of libspillfs_client's GPU feature cache (spill_gpu_cache_*, as
clients/include/spillfs/client.h states it) in numpy over host memory, so the
orchestration of spillfs.gnn._store.gpu_cache.GpuTiers (ring -> lines -> victim buffer or
storage -> staging -> fill) runs in CI without a GPU. The kernels' semantics:
gather refuses a batch with an index outside [-rows, rows) (-ERANGE), else
serves HBM lines then hot lines, posts the rest to the ring and raises the
stamps of the lines hit; fill evicts (copying victims), scatters staged
rows to the output and installs lines. Addresses are real host addresses."""

import ctypes
import errno

import numpy as np


def _array(addr, n, dtype):
    if n == 0:
        return np.empty(0, dtype=dtype)
    buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(addr)
    return np.frombuffer(buf, dtype=dtype)


def _ptr_array(p, n, dtype=np.int64):
    if not p or n == 0:
        return None
    return _array(ctypes.cast(p, ctypes.c_void_p).value, n, dtype)


class _Cache:
    def __init__(self, shape):
        self.rb, self.rows, self.rpl = shape.row_bytes, shape.rows, shape.rows_per_line
        self.lb = self.rb * self.rpl
        self.n_lines = -(-self.rows // self.rpl)
        self.cap, self.n_hot, self.n_victim, self.n_staging = (shape.cache_lines, shape.hot_lines,
                                                               shape.victim_lines, shape.staging_lines)
        self.lines = np.zeros((self.cap, self.lb), np.uint8)
        self.slot_of_line = np.full(self.n_lines, -1, np.int32)
        self.hot_slot = np.full(self.n_lines, -1, np.int32)
        self.stamps = np.zeros(self.cap, np.uint32)
        self.host = [(ctypes.c_uint8 * max(1, n * self.lb))() for n in (self.n_hot, self.n_victim, self.n_staging)]
        self.ring = []


class FakeGpuCacheLibrary:
    """Stands in for the ctypes library (only the spill_gpu_cache_* functions)."""

    def __init__(self):
        self.caches = {}
        self.calls = {"gather": 0, "fill": 0}

    def _c(self, handle):
        return self.caches[handle]

    def spill_gpu_cache_create(self, device, shape_ref):
        shape = shape_ref._obj
        handle = len(self.caches) + 1
        self.caches[handle] = _Cache(shape)
        return handle

    def spill_gpu_cache_destroy(self, handle):
        self.caches.pop(handle, None)
        return 0

    def spill_gpu_cache_host_buffer(self, handle, which):
        return ctypes.addressof(self._c(handle).host[which])

    def _host(self, c, which, n):
        return np.frombuffer(c.host[which], dtype=np.uint8)[:n * c.lb].reshape(n, c.lb)

    def spill_gpu_cache_set_hot(self, handle, lines_addr, n):
        c = self._c(handle)
        lines = _array(lines_addr, n, np.int64)
        c.hot_slot[:] = -1
        c.hot_slot[lines] = np.arange(n)
        return 0

    def spill_gpu_cache_gather(self, handle, index_addr, n, out_addr, stamp, stream, counts_ref):
        self.calls["gather"] += 1
        c = self._c(handle)
        idx = _array(index_addr, n, np.int64)
        out = _array(out_addr, n * c.rb, np.uint8).reshape(n, c.rb)
        counts = counts_ref._obj
        counts.gpu_hits = counts.hot_hits = counts.misses = 0
        if ((idx < -c.rows) | (idx >= c.rows)).any():
            return -errno.ERANGE  # refused whole: nothing gathered, counted or stamped
        idx = np.where(idx < 0, idx + c.rows, idx)  # negatives count from the end
        c.ring = []
        hot = self._host(c, 0, c.n_hot)
        for i, row in enumerate(idx.tolist()):
            assert 0 <= row < c.rows, row
            line, within = divmod(row, c.rpl)
            slot = c.slot_of_line[line]
            if slot >= 0:
                out[i] = c.lines[slot, within * c.rb:(within + 1) * c.rb]
                c.stamps[slot] = max(c.stamps[slot], stamp)
                counts.gpu_hits += 1
            elif c.hot_slot[line] >= 0:
                out[i] = hot[c.hot_slot[line], within * c.rb:(within + 1) * c.rb]
                counts.hot_hits += 1
            else:
                c.ring.append((row, i))
                counts.misses += 1
        return 0

    def spill_gpu_cache_misses(self, handle, rows_addr, pos_addr, n):
        c = self._c(handle)
        assert n <= len(c.ring)
        _array(rows_addr, n, np.int64)[:] = [r for r, _ in c.ring[:n]]
        _array(pos_addr, n, np.int64)[:] = [p for _, p in c.ring[:n]]
        return 0

    def spill_gpu_cache_stamps(self, handle, out_addr):
        c = self._c(handle)
        _array(out_addr, c.cap, np.uint32)[:] = c.stamps
        return 0

    def spill_gpu_cache_fill(self, handle, fill_ref, out_addr, stamp, stream):
        self.calls["fill"] += 1
        c = self._c(handle)
        f = fill_ref._obj
        assert f.n_staged <= c.n_staging
        victim = self._host(c, 1, c.n_victim)
        ev_lines = _ptr_array(f.evicted_lines, f.n_evicted)
        ev_slots = _ptr_array(f.evicted_slots, f.n_evicted)
        v_slots = _ptr_array(f.victim_slots, f.n_evicted)
        for k in range(f.n_evicted):
            assert c.slot_of_line[ev_lines[k]] == ev_slots[k], "evicting a line from a slot it is not in"
            if v_slots is not None and v_slots[k] >= 0:
                victim[v_slots[k]] = c.lines[ev_slots[k]]
            c.slot_of_line[ev_lines[k]] = -1
        staging = self._host(c, 2, c.n_staging)
        staged = _ptr_array(f.staged_lines, f.n_staged)
        install = _ptr_array(f.install_slots, f.n_staged)
        e_rows = _ptr_array(f.entry_rows, f.n_entries)
        e_pos = _ptr_array(f.entry_positions, f.n_entries)
        e_staged = _ptr_array(f.entry_staged, f.n_entries)
        if f.n_entries:
            n_out = int(e_pos.max()) + 1
            out = _array(out_addr, n_out * c.rb, np.uint8).reshape(n_out, c.rb)
            for k in range(f.n_entries):
                assert e_rows[k] // c.rpl == staged[e_staged[k]], "entry from the wrong staged line"
                w = e_rows[k] % c.rpl
                out[e_pos[k]] = staging[e_staged[k], w * c.rb:(w + 1) * c.rb]
        if install is not None:
            for k in range(f.n_staged):
                if install[k] >= 0:
                    assert (c.slot_of_line != install[k]).all(), "installing into an occupied slot"
                    c.lines[install[k]] = staging[k]
                    c.slot_of_line[staged[k]] = install[k]
                    c.stamps[install[k]] = stamp
        return 0
