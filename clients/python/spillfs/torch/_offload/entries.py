"""What the offloader stores: an entry a region, a :class:`_Saved` a save of it, the
step's table of them, and their release.

- :class:`_Entry`: one stored region. Its key (device, storage, offset,
  extent, dtype, version) is dedup's: several saves of the same region share
  one entry. Its fields say where the bytes are (``tier``: None while pending,
  ``"keep"``, ``"host"``, ``"ssd"``; ``src`` while the original is held;
  ``region`` in a :class:`~.tiers.HostTier`; ``file`` and ``file_off``), what
  is in flight (``d2h_event``, ``write_req``, ``read_req``, ``load_event``) and
  backward's accounting (saves still ``outstanding``, unpacked ``values``
  alive, bytes ``credited`` as freed).
- :class:`_Saved`: what pack hands autograd for an offloaded tensor, one per
  save. Its ``__del__`` tells :class:`_EntryRelease` that a save was dropped
  without being unpacked (the worker releases it), or that an unpacked value
  died (counted at the next hook).
- :class:`_StepState`: what the parts of the offloader share: the step (its
  index, report and phase), its entries (by key, in order, by group), the
  pending entry, the saves not yet unpacked, the worker, the CUDA streams, the
  warnings to raise at the step's end. Each part keeps the rest of its state
  to itself.
- :class:`_Worker`: the offloader's one background thread: it waits for file
  writes and releases what autograd dropped (a ``__del__`` runs on any thread,
  at any time, so it only hands the work over).
- :class:`_EntryRelease`: frees what an entry holds once its last save was
  unpacked or dropped, and what a step holds at its end or after an exception.

Threading: an entry's fields, and the step state, are read and written under
the offloader's ``lock`` (an ``RLock``), by the thread running autograd and by
the worker. ``_Saved.__del__`` takes no lock: it only submits to the worker or
appends to a deque (both thread-safe).
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


def _flat(t, e):
    """The bytes of a dense tensor laid out as entry ``e`` as a 1-D tensor of its dtype."""
    return t.as_strided((e.span,), (1,))


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
    """What pack gives autograd for an offloaded tensor (one per save); ``owner``:
    the :class:`_EntryRelease` told when it goes."""

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
                self.owner.dropped(self.entry)
            else:
                # autograd released the node that used it: its value's memory goes now
                self.owner.value_freed(self.entry)
        except Exception:  # interpreter shutdown
            pass


class _StepState:
    """What the parts of one offloader share, under its lock (see the module's docstring)."""

    def __init__(self):
        self.index = -1  # the step's, from 0 (-1 before the first)
        self.active = False  # inside the with block
        self.report = None
        self.phase = "forward"
        self.entries = {}  # key -> live entry
        self.step_entries = []
        self.groups = collections.defaultdict(list)
        self.layer_stored = collections.defaultdict(int)  # group -> bytes stored this step (the policy's quota)
        self.pending = None  # the latest entry, stored once another comes (the last before backward stays)
        self.outstanding = 0  # saves of this step not yet unpacked or dropped
        self.worker = None
        self.cuda = None  # (d2h stream, h2d stream) once a CUDA tensor was seen
        self.warnings = []
        self.trace = None  # tests: a list of (storage ptr, entry[, tier]) of what was stored

    def begin(self, report):
        """A new step (its report): an empty table, forward first."""
        self.index += 1
        self.active = True
        self.report = report
        self.phase = "forward"
        self.entries = {}
        self.step_entries = []
        self.groups = collections.defaultdict(list)
        self.layer_stored = collections.defaultdict(int)
        self.pending = None
        self.outstanding = 0


class _EntryRelease:
    """Frees what entries hold: host regions, their part of a file, the originals.

    Args:
        options: the offloader's settings (``tight_reads``).
        state (_StepState): the step's entries.
        lock: the offloader's lock.
        copies (:class:`~.copy_out._CopyOut`): the tiers (their pools, files).
        reads (:class:`~.read_ahead._ReadAhead`): reads still in flight, and
            the count of what autograd freed.
    """

    def __init__(self, options, state, lock, copies, reads):
        self._options, self._state, self._lock = options, state, lock
        self._copies, self._reads = copies, reads

    # -- from _Saved.__del__ (any thread, any time) -----------------------------

    def dropped(self, entry):
        """A save autograd dropped without unpacking it: released on the worker."""
        worker = self._state.worker
        if worker is not None:
            worker.submit(self._dropped_task, entry)

    def value_freed(self, entry):
        """An unpacked value of ``entry`` died (a thread-safe append; counted at
        the next unpack or hook, under the lock)."""
        self._reads.freed_q.append(entry)

    def _dropped_task(self, e):
        state = self._state
        with self._lock:
            if e.released:
                return
            e.outstanding -= 1
            if e.step == state.index:
                state.outstanding -= 1
            if e.outstanding <= 0:
                self.release(e)

    # -- release --------------------------------------------------------------

    def release(self, e):
        """Frees what `e` holds (host region, its part of a file); lock held."""
        if e.released:
            return
        state = self._state
        e.released = True
        if state.entries.get(e.key) is e:
            del state.entries[e.key]
        if state.pending is e:
            state.pending = None
        if e.read_req is not None:
            try:
                self._reads.finish_load(e)
            except OSError:
                pass
        if e.region is not None and not e.staged:  # a staged region is the worker's to free
            event = e.load_event if e.load_event is not None else e.d2h_event
            e.pool.free(e.region, event)
            e.region = None
        if e.loaded is not None and not e.consumed and self._options.tight_reads and e.loaded.is_cuda:
            e.loaded.record_stream(state.cuda[1])  # never used: its memory waits for the read into it
        e.loaded = e.load_buf = None
        if e.write_req is None:
            self.drop_src(e)
            e.staging = None
        if e.file is not None:
            e.file.live -= 1
            self._copies.maybe_close(e.file)

    def release_all(self, dead=False):
        """Releases every entry of the current step (after an exception: all of them)."""
        state = self._state
        if state.worker is None:
            return
        state.worker.drain()  # writes complete (each request is waited for exactly once)
        with self._lock:
            for e in state.step_entries:
                if dead or e.outstanding <= 0:
                    self.release(e)
                    if dead:
                        self.drop_src(e)
                        e.staging = None
            state.pending = None
            if dead:
                state.outstanding = 0
            self._copies.reclaim()

    def drop_src(self, e):
        """Lets the original go; where its device-to-host copy may still run, the copy stream
        is recorded on it, so the allocator reuses its memory only after the copy."""
        src, e.src = e.src, None
        if src is not None and e.d2h_event is not None and src.is_cuda and not e.d2h_event.query():
            src.record_stream(self._state.cuda[0])
