"""The saved-tensor hooks: what pack stores and what unpack hands back.

Inside a step, :func:`torch.autograd.graph.saved_tensors_hooks` routes every
tensor autograd saves through :meth:`_SavedTensorHooks._pack` and back through
:meth:`_SavedTensorHooks._unpack`:

- pack leaves small tensors, parameters, buffers and views of them (found by
  their storage), tensors saved after the last layer (the head) and the last
  one saved before backward where they are; it stores one copy of a region
  saved several times (dedup: the same storage, offset, extent, dtype and
  version), and it puts the others in the tier the policy chose for their
  layer (host tier, then files, else kept: :mod:`.copy_out`);
- unpack serves a tensor from the original's memory where that is still
  alive or its copy still in flight (forwarding), else from what the
  prefetcher brought back (:mod:`.read_ahead`), else reads it (a stall); the
  stored copy is freed once every save of it was unpacked (or dropped by
  autograd: :mod:`.entries`).

What is kept is handed to autograd detached (see :meth:`_pack_inner`).

Threading: the hooks run on the thread running forward and the one autograd
runs backward on; entries and the offloader's tables change under its
``_lock``.
"""

import time
import weakref

import torch

from .entries import _Entry, _Saved, _span, _storage_ptr
from .layers import _HEAD


class _SavedTensorHooks:
    """Pack and unpack: dedup, the tier of each save, forwarding, stalls
    (a mixin of :class:`~.core.ActivationOffloader`; its state is the offloader's)."""

    # -- pack -----------------------------------------------------------------

    def _pack(self, t):
        start = time.perf_counter()
        try:
            return self._pack_inner(t)
        finally:
            self.report.add_seconds("pack", time.perf_counter() - start)
            if self._diag is not None:
                self._sample(f"pack {self._group_stack[-1] if self._group_stack else '-'}")

    def _kept(self, t, group, nbytes):
        """A layer's activation left where it is, handed to autograd detached; with tight reads
        its memory, once autograd drops it, is credit for reading ahead."""
        d = t.detach()
        if self._track_frees and isinstance(group, int) and self._phase == "forward":
            q = self._freed_q

            def freed(ref, n=nbytes, refs=self._kept_refs):
                q.append(n)
                refs.discard(ref)
            self._kept_refs.add(weakref.ref(d, freed))
        return d

    def _pack_inner(self, t):
        # What stays is returned detached: the tensor itself, where it is the output of the node saving it,
        # would make a reference cycle through C++ (node -> saved -> tensor -> node) that nothing collects.
        r = self.report
        nbytes = t.numel() * t.element_size()
        r.count("packed", nbytes)
        if self._inflight:  # originals whose copy landed go, whatever happens to this tensor
            with self._lock:
                self._poll()
        if not self._active or self._phase != "forward":
            if self._phase == "backward" and self._outstanding == 0:
                # a new forward after a finished backward in the same block (gradient accumulation)
                self._phase = "forward"
                self._prefetched_groups = set()
                self._started_groups = set()
                self._prefetch_queue.clear()
                self._after_last_layer = False
            else:
                r.keep("backward" if self._active else "inactive", nbytes)
                return t.detach()
        if nbytes < max(self.min_bytes, 1) or t.device.type not in ("cpu", "cuda") or t.is_sparse:
            r.keep("small" if nbytes < max(self.min_bytes, 1) else "device", nbytes)
            return t.detach()
        if self._is_parameter(t):
            r.keep("parameter", nbytes)
            return t.detach()
        group = self._current_group(nbytes)
        if group == _HEAD and not (self._drain and self.policy.decide(_HEAD) != "keep"):
            # the output head's tensors stay (memory-tight with a policy that moves it: stored, but the last)
            r.keep("head", nbytes)
            return t.detach()
        span = _span(t)
        dense = span == t.numel()
        key = (t.device, _storage_ptr(t), t.storage_offset(), t.dtype, t._version,
               span if dense else (tuple(t.shape), tuple(t.stride())))
        decision = self.policy.decide(group)
        r.decisions.setdefault(group, decision)
        if decision == "keep":
            r.keep("layer", nbytes)
            if key not in self._kept_keys:  # bytes per layer, each region once (the policy's profile)
                self._kept_keys.add(key)
                r.layer_bytes[group] = r.layer_bytes.get(group, 0) + nbytes
            return self._kept(t, group, nbytes)
        if t.device.type == "cuda" and self._cuda is None:
            self._cuda = (torch.cuda.Stream(t.device), torch.cuda.Stream(t.device))
        with self._lock:
            entry = self._entries.get(key)
            # the original must still live: once it died, its memory (and so the key) may be another tensor's
            if entry is not None and not entry.released and entry.src_weak() is not None:
                entry.outstanding += 1
                self._outstanding += 1
                r.count("deduped", entry.nbytes)
                return _Saved(self, entry, t)
            stored = (span if dense else t.numel()) * t.element_size()
            quota = self.policy.quota(group)
            if quota is not None and self._layer_stored[group] + stored > quota:
                # the policy moves only part of this layer (what its compute hides); the rest stays
                r.keep("quota", nbytes)
                if key not in self._kept_keys:
                    self._kept_keys.add(key)
                    r.layer_bytes[group] = r.layer_bytes.get(group, 0) + nbytes
                return self._kept(t, group, nbytes)
            self._layer_stored[group] += stored
            entry = _Entry(key, group, t, stored, dense, span, self._step)
            entry.outstanding = 1
            self._outstanding += 1
            self._entries[key] = entry
            self._step_entries.append(entry)
            self._groups[group].append(entry)
            if self._trace is not None:
                self._trace.append((_storage_ptr(t), entry))
            previous, self._pending = self._pending, (entry if self.keep_last else None)
            if previous is not None:
                self._commit(previous)
            if not self.keep_last:
                self._commit(entry)
            self._poll(force_before=group - self.copy_window if isinstance(group, int) else None,
                       bound=self.inflight_bytes)
            return _Saved(self, entry, t)

    # -- unpack ---------------------------------------------------------------

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            if self._active and self._phase == "forward" and (self._drain or self._tight_reads):
                self._backward_starts()  # memory-tight: the drain happens before the head's backward
            if self._tight_reads:
                if self._freed_q:
                    with self._lock:
                        self._grant_freed()
            elif self._prefetch_queue and isinstance(saved, torch.Tensor):
                nbytes = saved.numel() * saved.element_size()
                if nbytes >= max(self.min_bytes, 1) and not self._is_parameter(saved):
                    with self._lock:  # an activation kept here: its memory goes once backward used it
                        self._prefetch_credit += nbytes
                        self._pump_prefetch()
            if self._diag is not None and self._phase == "backward":
                self._sample("unpack kept")
            return saved
        if saved.value is not None:  # retain_graph: unpacked again
            return saved.value
        start = time.perf_counter()
        try:
            return self._unpack_inner(saved)
        finally:
            self.report.add_seconds("unpack", time.perf_counter() - start)
            if self._diag is not None:
                self._sample(f"unpack {saved.entry.group}")

    def _unpack_inner(self, saved):
        self._backward_starts()
        e = saved.entry
        r = self.report
        with self._lock:
            if e.released:
                raise RuntimeError("spillfs.torch.offload_activations: this saved tensor was released (its step "
                                   "ended with an exception, or the offloader was closed); run forward again")
            if self._freed_q:
                self._grant_freed()
            t = None
            if e.src is not None:
                t = e.src  # kept, or its copy still in flight
                if e.tier in ("host", "ssd") and not e.forwarded:
                    e.forwarded = True
                    r.count("forwarded", e.nbytes)
            else:
                alive = e.src_weak()
                if alive is not None and alive._version == e.version:
                    t = alive.detach()
                    if not e.forwarded:
                        e.forwarded = True
                        r.count("forwarded", e.nbytes)
            if t is None:
                if e.loaded is None:
                    r.stalls += 1
                    t0 = time.perf_counter()
                    if self._tight_reads:
                        self._prefetch_credit -= e.nbytes  # needed now: read beyond the credit
                    self._load(e)
                    self._finish_load(e)
                    r.stall_seconds += time.perf_counter() - t0
                else:
                    if e.prefetched and not getattr(e, "forwarded"):
                        r.prefetch_hits += 1
                        e.prefetched = False  # count once
                    if e.read_req is not None:
                        t0 = time.perf_counter()
                        self._finish_load(e)
                        waited = time.perf_counter() - t0
                        if waited > 1e-4:
                            r.stalls += 1
                            r.stall_seconds += waited
                t = e.loaded
                if not e.read_ahead_done:
                    e.read_ahead_done = True
                    self._read_ahead -= e.nbytes
                if t.device.type == "cuda":
                    cur = torch.cuda.current_stream(t.device)
                    if e.load_event is not None:
                        cur.wait_event(e.load_event)
                    t.record_stream(cur)
            if e.dense and (saved.size != tuple(t.shape) or saved.stride != tuple(t.stride())):
                t = t.as_strided(saved.size, saved.stride)  # another view of the same bytes (dedup)
            saved.value = t
            saved.consumed = True
            e.consumed = True
            e.values += 1
            e.outstanding -= 1
            self._outstanding -= 1
            if e.outstanding == 0:
                self._release(e)
                if not self._tight_reads:
                    self._prefetch_credit += e.nbytes  # its memory goes once its node ran
            if e.group != _HEAD:
                self._prefetch_from(e.group)
            return t
