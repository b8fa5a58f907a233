"""What the offloader stores: an entry a region, a :class:`_Saved` a save of it, and their release.

- :class:`_Entry`: one stored region. Its key (device, storage, offset,
  extent, dtype, version) is dedup's: several saves of the same region share
  one entry. Its fields say where the bytes are (``tier``: None while pending,
  ``"keep"``, ``"host"``, ``"ssd"``; ``src`` while the original is held;
  ``region`` in a :class:`~.tiers.HostTier`; ``file`` and ``file_off``), what
  is in flight (``d2h_event``, ``write_req``, ``read_req``, ``load_event``) and
  backward's accounting (saves still ``outstanding``, unpacked ``values``
  alive, bytes ``credited`` as freed).
- :class:`_Saved`: what pack hands autograd for an offloaded tensor, one per
  save. Its ``__del__`` tells the offloader that a save was dropped without
  being unpacked (:meth:`_EntryRelease._dropped`: the worker releases it), or
  that an unpacked value died (``_freed_q``: counted at the next hook).
- :class:`_Worker`: the offloader's one background thread: it waits for file
  writes and releases what autograd dropped (a ``__del__`` runs on any thread,
  at any time, so it only hands the work over).
- :class:`_EntryRelease` (a mixin of :class:`~.core.ActivationOffloader`):
  frees what an entry holds once its last save was unpacked or dropped, and
  what a step holds at its end or after an exception.

Threading: an entry's fields are read and written under the offloader's
``_lock`` (an ``RLock``), by the thread running autograd and by the worker.
``_Saved.__del__`` takes no lock: it only submits to the worker or appends to
a deque (both thread-safe).
"""

import collections
import threading
import warnings
import weakref


def _storage_ptr(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t._storage().data_ptr()


def _span(t):
    """Elements from the first to the last one the tensor addresses."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def _dense_strides(size, stride):
    """Strides of a dense tensor of `size` whose dimensions are ordered as `stride`'s."""
    out = [0] * len(size)
    step = 1
    for d in sorted(range(len(size)), key=lambda d: (stride[d], d)):
        out[d] = step
        step *= max(size[d], 1)
    return tuple(out)


class _Worker:
    """One thread running tasks in order; :meth:`drain` waits until idle."""

    def __init__(self, name):
        self._cv = threading.Condition()
        self._tasks = collections.deque()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args):
        with self._cv:
            self._tasks.append((fn, args))
            self._cv.notify_all()

    def _run(self):
        while True:
            with self._cv:
                while not self._tasks:
                    self._cv.wait()
                fn, args = self._tasks.popleft()
                self._busy = True
            try:
                if fn is None:
                    return
                fn(*args)
            except BaseException as e:  # reported by the task itself; never kill the worker
                warnings.warn(f"spillfs activation offload: background task failed: {e!r}")
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def drain(self):
        with self._cv:
            while self._tasks or self._busy:
                self._cv.wait()

    def stop(self):
        self.submit(None)


class _Entry:
    """One stored region (several saves of it share the entry: dedup)."""

    __slots__ = ("key", "group", "nbytes", "dtype", "size", "stride", "dense", "device", "span", "tier", "src",
                 "src_weak", "version", "staging", "region", "d2h_event", "file", "file_off", "write_req",
                 "write_error", "loaded", "load_buf", "load_event", "read_req", "prefetched", "outstanding",
                 "released", "forwarded", "step", "kept_reason", "pool", "staged", "read_ahead_done", "values",
                 "credited", "consumed")

    def __init__(self, key, group, t, nbytes, dense, span, step):
        self.key, self.group, self.nbytes, self.dense, self.span, self.step = key, group, nbytes, dense, span, step
        self.dtype, self.size, self.stride, self.device = t.dtype, tuple(t.shape), tuple(t.stride()), t.device
        if not dense:
            # gaps or overlap (q, k, v views of a fused projection; expanded tensors): stored and restored dense,
            # in the same order of dimensions (as empty_like would), so a restored view costs its own bytes only
            self.stride = _dense_strides(self.size, self.stride)
            self.span = t.numel()
        self.tier = None  # None: pending (not committed yet), "keep", "host", "ssd"
        # detached: a strong reference to a tensor with a grad_fn would keep its whole graph alive
        # (graph -> saved -> offloader -> tensor -> graph) where autograd drops it without backward
        self.src = t.detach()
        self.src_weak = weakref.ref(t)
        self.version = t._version
        self.staging = None
        self.region = self.d2h_event = None
        self.pool = None  # the HostTier of region (host tier, or the staging of files)
        self.staged = False  # the worker still writes region to the file (and frees it)
        self.file = self.file_off = self.write_req = self.write_error = None
        self.loaded = self.load_buf = self.load_event = self.read_req = None
        self.prefetched = False
        self.read_ahead_done = True
        self.outstanding = 0
        self.released = False
        self.forwarded = False
        self.kept_reason = None
        self.values = 0  # unpacked values autograd still holds (its memory goes when the last one dies)
        self.credited = False  # its bytes counted as freed by backward
        self.consumed = False


class _Saved:
    """What pack gives autograd for an offloaded tensor (one per save)."""

    __slots__ = ("entry", "size", "stride", "value", "consumed", "owner", "__weakref__")

    def __init__(self, owner, entry, t):
        self.owner, self.entry = owner, entry
        self.size, self.stride = tuple(t.shape), tuple(t.stride())
        self.value = None
        self.consumed = False

    def __del__(self):
        try:
            if self.owner is None:
                return
            if not self.consumed:
                self.owner._dropped(self.entry)
            else:
                # autograd released the node that used it: its value's memory goes now (thread-safe append;
                # counted at the next unpack or hook, under the lock)
                self.owner._freed_q.append(self.entry)
        except Exception:  # interpreter shutdown
            pass


class _EntryRelease:
    """Frees what entries hold: host regions, their part of a file, the originals
    (a mixin of :class:`~.core.ActivationOffloader`; its state is the offloader's)."""

    # -- release --------------------------------------------------------------

    def _dropped(self, entry):
        """A save autograd dropped without unpacking it (from __del__: any thread, any time)."""
        worker = self._worker
        if worker is not None:
            worker.submit(self._dropped_task, entry)

    def _dropped_task(self, e):
        with self._lock:
            if e.released:
                return
            e.outstanding -= 1
            if e.step == self._step:
                self._outstanding -= 1
            if e.outstanding <= 0:
                self._release(e)

    def _release(self, e):
        """Frees what `e` holds (host region, its part of a file); lock held."""
        if e.released:
            return
        e.released = True
        if self._entries.get(e.key) is e:
            del self._entries[e.key]
        if self._pending is e:
            self._pending = None
        if e.read_req is not None:
            try:
                self._finish_load(e)
            except OSError:
                pass
        if e.region is not None and not e.staged:  # a staged region is the worker's to free
            event = e.load_event if e.load_event is not None else e.d2h_event
            e.pool.free(e.region, event)
            e.region = None
        if e.loaded is not None and not e.consumed and self._tight_reads and e.loaded.is_cuda:
            e.loaded.record_stream(self._cuda[1])  # never used: its memory waits for the read into it
        e.loaded = e.load_buf = None
        if e.write_req is None:
            self._drop_src(e)
            e.staging = None
        if e.file is not None:
            e.file.live -= 1
            self._maybe_close(e.file)

    def _maybe_close(self, f):
        if f is not None and not f.closed and f.live <= 0 and f.inflight <= 0:
            try:
                f.close()
            except OSError as err:
                self._warnings.append(f"spillfs.torch.offload_activations: closing {f.path}: {err}")

    def _release_all(self, dead=False):
        """Releases every entry of the current step (after an exception: all of them)."""
        if self._worker is None:
            return
        self._worker.drain()  # writes complete (each request is waited for exactly once)
        with self._lock:
            for e in self._step_entries:
                if dead or e.outstanding <= 0:
                    self._release(e)
                    if dead:
                        self._drop_src(e)
                        e.staging = None
            self._pending = None
            if dead:
                self._outstanding = 0
            for pool in (self._host, self._staging):
                if pool is not None:
                    pool._reclaim()

    def _drop_src(self, e):
        """Lets the original go; where its device-to-host copy may still run, the copy stream
        is recorded on it, so the allocator reuses its memory only after the copy."""
        src, e.src = e.src, None
        if src is not None and e.d2h_event is not None and src.is_cuda and not e.d2h_event.query():
            src.record_stream(self._cuda[0])
