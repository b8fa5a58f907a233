"""Forward's side: storing an entry in its tier, the copies in flight and their bound.

- :meth:`_CopyOut.commit` stores a pending entry in the tier its layer's
  decision names (the host tier or files first, then the other; kept where
  neither has room).
- :meth:`copy_out` copies an entry into a host region; on CUDA a
  device-to-host copy on the copy stream of its own (``state.cuda[0]``), which
  waits for the compute stream. The original (``e.src``) stays while the copy
  runs: unpack serves it from there (forwarding).
- Files: through a staging region (``staging_bytes``), the original goes once
  copied out and the worker writes the region to the layer's file, then frees
  it (:meth:`_staged_write`); else the file is written from where the tensor
  is and the worker, once the write completed, lets the original go
  (:meth:`_complete_write`). A failed write keeps the bytes (a staging region
  is then served as the host tier's; else the original is kept) and warns
  once; after ENOSPC the step writes no more files.
- :meth:`poll` lets originals go once their copy landed, and bounds what
  copies in flight hold: originals of groups more than ``copy_window`` back
  go even where their copy still runs (the compute stream waits for it), and
  with ``inflight_bytes`` (memory-tight) the oldest go the same way until the
  originals held are at most that many bytes. (Where an entry is released
  while its copy may still run, :meth:`.entries._EntryRelease.drop_src`
  records the copy stream on the original before it lets it go.)

Threading: all of it runs with the offloader's lock held, except
:meth:`_staged_write` and :meth:`_complete_write`, which run on the worker and
take the lock around what they change (never while they wait for a copy or a
write).
"""

import collections
import errno as _errno
import time

import torch

from .entries import _flat
from .tiers import FileTier, HostTier


class _CopyOut:
    """Stores entries in their tiers and bounds the copies in flight. Owns the
    tiers: the host tier, the staging of file writes, the files.

    Args:
        options: the offloader's settings (``host_bytes``, ``dir``,
            ``staging_bytes``, ``io_backend``, ``policy``...), read as it acts.
        state (_StepState): the step (its report, the worker, the CUDA streams).
        lock: the offloader's lock (the worker's tasks take it).
    """

    def __init__(self, options, state, lock):
        self._options, self._state, self._lock = options, state, lock
        self.host = None  # HostTier, made at the first store in it
        self.staging = None  # HostTier staging the writes to files
        self.files = None  # FileTier
        self.inflight = collections.deque()  # entries whose device-to-host copy may still run
        self._layer_files = {}
        self._fell_back_disk = False
        self._warned_disk = False

    def begin_step(self):
        self._layer_files = {}
        self._fell_back_disk = False
        if self.host is not None:
            self.host.peak = self.host.used

    # -- store ----------------------------------------------------------------

    def record_layer_bytes(self, e):
        r = self._state.report
        r.layer_bytes[e.group] = r.layer_bytes.get(e.group, 0) + e.nbytes

    def commit(self, e):
        """Stores a pending entry in the tier its layer's decision names."""
        options, r = self._options, self._state.report
        self.record_layer_bytes(e)
        decision = options.policy.decide(e.group)
        order = ("ssd", "host") if decision == "ssd" else ("host", "ssd")
        for tier in order:
            if tier == "host" and options.host_bytes > 0 and self._store_host(e):
                r.count("host", e.nbytes)
                return
            if tier == "ssd" and options.dir is not None and not self._fell_back_disk and self._store_file(e):
                return
        e.tier = "keep"
        e.kept_reason = "no_room"
        r.keep("no_room", e.nbytes)

    def copy_out(self, e, pool):
        """Copies e.src into a region of `pool` (a device-to-host copy on the copy stream for
        CUDA: e.src stays, for forwarding, until the copy landed or the window forces it out).
        None where the pool has no room."""
        t = e.src
        cuda = t.device.type == "cuda"
        d2h = self._state.cuda[0] if cuda else None
        region = pool.allocate(e.nbytes, wait_stream=d2h)
        if region is None:
            return None
        dst = region.data.view(e.dtype) if e.nbytes else region.data
        if cuda:
            d2h.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(d2h):
                if e.dense:
                    src = _flat(t, e)
                else:
                    # Gathered on the device first (a kernel on the copy stream, into memory of that stream,
                    # reused in its order once dropped), then one flat copy. A cross-device copy_ into a
                    # strided host tensor would stage through a *pageable* temporary (torch's
                    # copy_requires_temporaries): a synchronous cudaMemcpy that blocks the host until the
                    # compute stream caught up, then a strided copy on the CPU (what the H100 run showed).
                    src = torch.empty_strided(e.size, e.stride, dtype=e.dtype, device=t.device)
                    src.copy_(t)
                    src = _flat(src, e)
                dst.copy_(src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(d2h)
            e.d2h_event = ev
            self.inflight.append(e)
        else:
            if e.dense:
                dst.copy_(_flat(t, e))
            else:
                dst.as_strided(e.size, e.stride).copy_(t)
        e.region, e.pool = region, pool
        return region

    def _store_host(self, e):
        if self.host is None:
            self.host = HostTier(self._options.host_bytes, pinned=self._state.cuda is not None)
        if self.copy_out(e, self.host) is None:
            return False
        if e.d2h_event is None:
            e.src = None
        e.tier = "host"
        self._trace_tier(e, "host")
        return True

    def _trace_tier(self, e, tier):
        trace = self._state.trace
        if trace is None:
            return
        for i, row in enumerate(trace):
            if row[1] is e:
                trace[i] = (row[0], e, tier)

    def file_tier(self):
        """The files under ``dir`` (made at the first use)."""
        if self.files is None:
            self.files = FileTier(self._options.dir, backend=self._options.io_backend)
        return self.files

    def _layer_file(self, group):
        f = self._layer_files.get(group)
        if f is None or f.closed:
            hint = self._options.policy.bytes_hint(group)
            f = self.file_tier().open(f"L{group}-s{self._state.index}.act", hint)
            self._layer_files[group] = f
        return f

    def _store_file(self, e):
        options, state = self._options, self._state
        t = e.src
        cuda = t.device.type == "cuda"
        try:
            f = self._layer_file(e.group)
        except OSError as err:
            self._disk_failed(err)
            return False
        if options.staging_bytes > 0:
            # through a staging region: the original goes once copied out (the disk is slower than PCIe)
            if self.staging is None:
                self.staging = HostTier(options.staging_bytes, pinned=state.cuda is not None)
            if self.copy_out(e, self.staging) is not None:
                e.file, e.file_off = f, f.reserve(e.nbytes)
                e.staged = True
                f.inflight += 1  # the write the worker will start
                if e.d2h_event is None:
                    e.src = None
                e.tier = "ssd"
                state.report.count("ssd", e.nbytes)
                self._trace_tier(e, "ssd")
                state.worker.submit(self._staged_write, e, f)
                return True
        # t: e.src, detached; a tensor with gaps is gathered into its stored (dense) layout first
        src = t if e.dense else torch.empty_strided(e.size, e.stride, dtype=e.dtype, device=t.device).copy_(t)
        stream = 0
        if cuda and not f.native:
            src = src.to("cpu")  # no segment I/O: through pageable memory (slow, but correct)
        if src.device.type == "cuda":
            device = src.device.index
            stream = torch.cuda.current_stream(src.device).cuda_stream
        else:
            device = -1
        if src is not t:
            e.staging = src
        off = f.reserve(e.nbytes)
        e.file, e.file_off = f, off
        try:
            req = f.write(src.data_ptr(), e.nbytes, off, device, stream)
        except OSError as err:
            f.live -= 1
            e.file = None
            e.staging = None
            self.maybe_close(f)
            self._disk_failed(err)
            return False
        e.write_req = req
        e.tier = "ssd"
        state.report.count("ssd", e.nbytes)
        self._trace_tier(e, "ssd")
        state.worker.submit(self._complete_write, e, req, time.perf_counter())
        return True

    def _disk_failed(self, err):
        self._state.report.write_errors += 1
        if err.errno == _errno.ENOSPC:
            self._fell_back_disk = True  # for the rest of the step: its own files go when backward consumed them
        if not self._warned_disk:
            self._warned_disk = True
            self._state.warnings.append(f"spillfs.torch.offload_activations: writing activations under "
                                        f"{self._options.dir} failed ({err}); keeping them in memory instead")

    def _staged_write(self, e, f):
        """Worker: once the copy into the staging region landed, writes it to the file, then frees it."""
        ev = e.d2h_event
        while ev is not None and not ev.query():
            time.sleep(2e-4)
        error = stats = None
        submitted = time.perf_counter()
        with self._lock:
            f.inflight -= 1
            skip = e.released
            if not skip:
                try:
                    req = f.write(e.region.data.data_ptr(), e.nbytes, e.file_off, -1)
                except OSError as err:
                    error, req = err, None
        if not skip and req is not None:
            try:
                stats = req.wait()
            except OSError as err:
                error = err
            with self._lock:
                f.done()
        with self._lock:
            e.staged = False
            if stats is not None:
                self._options.observe_io("ssd_write", e.nbytes, submitted, stats.get("seconds", 0.0))
            if error is not None:
                # the bytes stay in the staging region and are served from there: never lost
                r = self._state.report
                r.ssd_count -= 1
                r.ssd_bytes -= e.nbytes
                r.count("host", e.nbytes)
                e.tier = "host"
                self._disk_failed(error)
                if not e.released:
                    f.live -= 1
                    e.file = None
            if e.region is not None and (error is None or e.released):
                e.pool.free(e.region, e.load_event)  # a load from it may still run: reuse waits for it
                e.region = None
            self.maybe_close(f)

    def _complete_write(self, e, req, submitted):
        error = None
        try:
            stats = req.wait()
        except OSError as err:
            error = err
            stats = None
        with self._lock:
            e.write_req = None
            if e.file is not None:
                e.file.done()
            if stats is not None:
                self._options.observe_io("ssd_write", e.nbytes, submitted, stats.get("seconds", 0.0))
            e.staging = None
            if error is not None:
                r = self._state.report
                e.write_error = error
                r.ssd_count -= 1
                r.ssd_bytes -= e.nbytes
                e.tier = "keep"
                e.kept_reason = "error"
                r.keep("error", e.nbytes)
                self._disk_failed(error)
            elif not e.released:
                e.src = None  # on disk now: the original may go (forwarding while it lives)
            if e.released:
                self.maybe_close(e.file)

    def maybe_close(self, f):
        """Closes a layer's file once no entry lives in it and no request is in flight."""
        if f is not None and not f.closed and f.live <= 0 and f.inflight <= 0:
            try:
                f.close()
            except OSError as err:
                self._state.warnings.append(f"spillfs.torch.offload_activations: closing {f.path}: {err}")

    # -- copies in flight -----------------------------------------------------

    def poll(self, force_before=None, bound=None):
        """Drops originals whose device-to-host copy landed (lock held; copies land in order).
        Those of groups before `force_before` go even where their copy may still run: the
        compute stream waits for the copy first (their memory must be reusable: the window).
        With `bound` (bytes), the oldest go the same way until the originals still held for
        copies in flight are at most that many bytes (memory-tight: ``inflight_bytes``)."""
        q = self.inflight
        while q:
            e = q[0]
            if e.src is None:
                q.popleft()
                continue
            if e.d2h_event.query():
                q.popleft()
                e.src = None
                continue
            if force_before is not None and isinstance(e.group, int) and e.group < force_before:
                self._wait_copy(e)
                q.popleft()
                e.src = None
                continue
            break
        if q and bound is not None:
            held = self.inflight_held()
            while q and held > bound:
                e = q.popleft()
                if e.src is None:
                    continue
                self._wait_copy(e)
                e.src = None
                held -= e.nbytes
        if q:
            held = self.inflight_held()
            r = self._state.report
            if held > r.inflight_peak_bytes:
                r.inflight_peak_bytes = held

    def _wait_copy(self, e):
        """The compute stream waits for e's device-to-host copy (its original may go now)."""
        if e.device.type == "cuda":
            torch.cuda.current_stream(e.device).wait_event(e.d2h_event)
        else:
            e.d2h_event.synchronize()  # tests: CPU copies made to look asynchronous
        self._state.report.copy_waits += 1

    def inflight_held(self):
        """Bytes of originals held for device-to-host copies that may still run."""
        return sum(e.nbytes for e in self.inflight if e.src is not None)

    # -- the tiers as a whole ---------------------------------------------------

    def reclaim(self):
        """Host regions whose host-to-device copies have landed go back to their pools."""
        for pool in (self.host, self.staging):
            if pool is not None:
                pool._reclaim()

    def host_bytes_in_use(self):
        return sum(p.in_use() for p in (self.host, self.staging) if p is not None)

    def close(self):
        """Frees the host slabs, closes the files and removes their directory."""
        if self.host is not None:
            self.host.close()
            self.host = None
        if self.staging is not None:
            self.staging.close()
            self.staging = None
        if self.files is not None:
            self.files.close()
            self.files = None
