"""Backward's side: reading stored entries back ahead of need, under a credit.

As a layer's backward begins (the hook on its output's gradient, or its first
unpack), :meth:`_ReadAhead.prefetch_from` reads what that layer still needs
and queues the ``prefetch_layers`` layers before it, each about in the reverse
of the order it was saved; :meth:`pump` reads from the queue while
there is credit, so that reading ahead does not add a layer to the peak:

- by default the credit is what backward has freed since it began (entries
  whose saves were all unpacked, activations kept where they were once
  backward used them) plus ``prefetch_layers - 1`` layers' bytes granted as
  backward starts; one read may overdraw it;
- memory-tight (``read_ahead_bytes``): only what autograd has really dropped
  (:meth:`grant_freed`: unpacked values that died, kept activations
  collected), plus ``read_ahead_bytes`` granted as the first layer's backward
  begins (not as backward starts: the head's backward, often the peak, runs
  first); a read never goes beyond it.

:meth:`load` starts a read: from a host region, a host-to-device copy on a
copy stream of its own (``state.cuda[1]``) after the device-to-host copy's event;
from a file, a segment read (into device memory where the I/O supports it,
else through host memory), which :meth:`finish_load` waits for. Memory-tight
on CUDA, the memory read into comes from the compute stream (what backward
just freed) and the read waits for the compute stream.

Threading: all of it runs with the offloader's lock held; ``freed_q`` is
appended to without it (by ``_Saved.__del__`` and weak-reference callbacks)
and drained here.
"""

import collections
import time
import weakref

import torch

from .entries import _flat


class _ReadAhead:
    """Prefetch and loads: what backward reads back, when, and the credit bounding it.

    Args:
        options: the offloader's settings (``prefetch_layers``,
            ``read_ahead_bytes``, ``policy``...), read as it acts.
        state (_StepState): the step (its entries by group, report, CUDA streams).
    """

    def __init__(self, options, state):
        self._options, self._state = options, state
        self.queue = collections.deque()  # entries of earlier layers, in the order backward needs them
        self.credit = 0
        self.freed_q = collections.deque()  # entries whose unpacked values autograd dropped; bytes of kept ones
        self._prefetched_groups = set()  # queued for reading ahead
        self._started_groups = set()  # whose backward began (what they still needed was read then)
        self._read_ahead = 0  # bytes read back (loads started) and not yet used by backward
        self._kept_refs = set()  # weak references to kept activations (tight read-ahead: their frees are credit)
        self._allowance_given = False
        self._read_bytes = 0  # this step's backward: bytes read back, and bytes of saved activations freed
        self._freed_bytes = 0

    def begin_step(self):
        self.new_forward()
        self.credit = 0
        self._read_ahead = 0
        self.freed_q.clear()
        self._kept_refs = set()
        self._allowance_given = False
        self._read_bytes = 0
        self._freed_bytes = 0

    def new_forward(self):
        """A forward starts after a finished backward in the same step (gradient accumulation)."""
        self._prefetched_groups = set()
        self._started_groups = set()
        self.queue.clear()

    def backward_starts(self, layer_bytes):
        """Backward begins (lock held): reads may run ahead of what it frees by the layers past
        the first ahead (``layer_bytes``: the most a layer stored); memory-tight, by nothing
        (read_ahead_bytes is granted when the first layer's backward begins, not here: the
        head's backward, often the peak, runs first)."""
        self.credit = 0 if self._options.tight_reads else max(0, self._options.prefetch_layers - 1) * layer_bytes

    def figures(self):
        """What diagnosis samples: bytes read ahead, the credit, read back and freed."""
        return {"read_ahead": self._read_ahead, "credit": self.credit, "read_bytes": self._read_bytes,
                "freed_bytes": self._freed_bytes}

    # -- what backward frees ------------------------------------------------------

    def track_kept(self, d, nbytes):
        """A layer's activation ``d`` kept where it is: its memory, once autograd drops it,
        counts as freed (credit for reading ahead, with tight reads)."""
        q = self.freed_q

        def freed(ref, n=nbytes, refs=self._kept_refs):
            q.append(n)
            refs.discard(ref)
        self._kept_refs.add(weakref.ref(d, freed))

    def kept_used(self, nbytes):
        """An activation kept where it was was used by backward (lock held): its memory goes
        once its node ran (credit, without tight reads)."""
        self.credit += nbytes
        self.pump()

    def entry_used(self, e):
        """Every save of ``e`` was unpacked (lock held): its memory goes once its node ran."""
        if not self._options.tight_reads:
            self.credit += e.nbytes

    def grant_freed(self):
        """Counts what autograd dropped since the last call (lock held): entries whose last unpacked
        value died, kept activations of layers; with tight reads, credit for reading ahead."""
        freed = 0
        q = self.freed_q
        while q:
            try:
                item = q.popleft()
            except IndexError:
                break
            if isinstance(item, int):
                freed += item
                continue
            item.values -= 1
            if item.values <= 0 and item.released and not item.credited and item.step == self._state.index:
                item.credited = True
                freed += item.nbytes
        if not freed:
            return
        self._freed_bytes += freed
        if self._options.tight_reads:
            self.credit += freed
            self.pump()

    # -- prefetch and loads ---------------------------------------------------

    def prefetch_from(self, group):
        """Starts reading what `group` still needs (its backward begins), and queues the
        `prefetch_layers` groups before it for reading as backward frees memory."""
        if not isinstance(group, int):
            return
        options, groups = self._options, self._state.groups
        t0 = time.perf_counter()
        if options.tight_reads and not self._allowance_given:
            self._allowance_given = True  # the first layer's backward begins: reads may run this far ahead
            self.credit += options.read_ahead_bytes
        for g in range(group, group - options.prefetch_layers - 1, -1):
            if g < -1:
                break
            if g == group and g not in self._started_groups:
                # needed now (once: every unpack of the group comes here): what the queue still holds of it
                self._started_groups.add(g)
                if options.tight_reads:
                    # in front of the queue, the last saved first (backward needs it first), under the credit
                    self.queue.extendleft([e for e in groups.get(g, ()) if self.wants_load(e)])
                    continue
                for e in groups.get(g, ()):
                    if self.wants_load(e):
                        self.load(e)
                        e.prefetched = True
            if g in self._prefetched_groups:
                continue
            self._prefetched_groups.add(g)
            if g != group:
                # backward needs a layer's tensors about in the reverse of the order they were saved
                self.queue.extend(reversed(groups.get(g, ())))
        self.pump()
        self._state.report.add_seconds("prefetch", time.perf_counter() - t0)

    @staticmethod
    def wants_load(e):
        if e.released or e.loaded is not None or e.tier not in ("host", "ssd"):
            return False
        if e.src is not None:
            return False  # still in memory: forwarded at unpack
        alive = e.src_weak()
        return alive is None or alive._version != e.version

    def pump(self):
        """Reads queued entries while there is credit: the bytes backward has freed since
        it began (plus the layers ahead beyond the first), so that reading ahead does not
        add a layer to the peak; one entry may overdraw it (lock held)."""
        q = self.queue
        tight = self._options.tight_reads
        while q:
            e = q[0]
            if not self.wants_load(e):
                q.popleft()
                continue
            # tight: never beyond the credit (it bounds what reads add to backward's activations)
            if (self.credit < e.nbytes) if tight else (self.credit <= 0):
                break
            q.popleft()
            self.load(e)
            e.prefetched = True
            self.credit -= e.nbytes

    def load(self, e):
        """Starts bringing `e` back (into e.loaded; e.read_req / e.load_event pending)."""
        cuda = e.device.type == "cuda"
        tight = self._options.tight_reads
        r = self._state.report
        if cuda:
            h2d = self._state.cuda[1]
            ctx = torch.cuda.stream(h2d)
        else:
            h2d = None
            ctx = _nullcontext()
        if cuda and tight:
            # memory-tight: the memory comes from the compute stream (what backward just freed, reused in
            # its order), and the read starts once the compute stream got here: the device holds no more than
            # the credit allows, in the allocator's figures and in fact (memory of the copy stream's own, freed
            # while the host runs ahead of the GPU, would wait for the GPU before it could be reused)
            cur = torch.cuda.current_stream(e.device)
            out = torch.empty_strided(e.size, e.stride, dtype=e.dtype, device=e.device)
            h2d.wait_stream(cur)
        with ctx:
            if not (cuda and tight):
                out = torch.empty_strided(e.size, e.stride, dtype=e.dtype, device=e.device)
            buf = _flat(out, e)  # the stored layout is dense: its bytes come back as they are
            if e.region is not None:  # the host tier, or a staging region not yet written
                src = e.region.data.view(e.dtype) if e.nbytes else e.region.data
                if cuda:
                    if e.d2h_event is not None:
                        h2d.wait_event(e.d2h_event)
                    buf.copy_(src, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(h2d)
                    e.load_event = ev
                else:
                    buf.copy_(src)
                if e.tier == "host":
                    r.read_host_bytes += e.nbytes
                else:
                    r.read_staged_bytes += e.nbytes
            else:
                f = e.file
                if cuda and not f.native:
                    host = torch.empty(buf.numel(), dtype=e.dtype)
                    req = f.read(host.data_ptr(), e.nbytes, e.file_off, -1)
                    e.read_req = (req, host, buf, time.perf_counter())
                else:
                    device = buf.device.index if cuda else -1
                    stream = h2d.cuda_stream if cuda else 0
                    req = f.read(buf.data_ptr(), e.nbytes, e.file_off, device, stream)
                    e.read_req = (req, None, buf, time.perf_counter())
                r.read_ssd_bytes += e.nbytes
        e.loaded = out
        e.read_ahead_done = False
        self._read_ahead += e.nbytes
        if self._read_ahead > r.read_ahead_peak_bytes:
            r.read_ahead_peak_bytes = self._read_ahead
        self._read_bytes += e.nbytes
        if self._read_bytes - self._freed_bytes > r.read_beyond_freed_peak_bytes:
            r.read_beyond_freed_peak_bytes = self._read_bytes - self._freed_bytes

    def read_now(self, e):
        """Reads ``e`` and waits for it (lock held): backward needs it now (a stall)."""
        if self._options.tight_reads:
            self.credit -= e.nbytes  # needed now: read beyond the credit
        self.load(e)
        self.finish_load(e)

    def used(self, e):
        """Backward took what was read back of ``e``: no longer read ahead."""
        if not e.read_ahead_done:
            e.read_ahead_done = True
            self._read_ahead -= e.nbytes

    def finish_load(self, e):
        """Waits for the read of `e` (file tier); makes e.loaded complete."""
        if e.read_req is None:
            return
        (req, host, buf, submitted), e.read_req = e.read_req, None
        try:
            stats = req.wait()
        finally:
            e.file.done()
        self._options.observe_io("ssd_read", e.nbytes, submitted, stats.get("seconds", 0.0))
        cuda = e.device.type == "cuda"
        if cuda:
            h2d = self._state.cuda[1]
            with torch.cuda.stream(h2d):
                if host is not None:
                    buf.copy_(host, non_blocking=False)
                ev = torch.cuda.Event()
                ev.record(h2d)
                e.load_event = ev


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
