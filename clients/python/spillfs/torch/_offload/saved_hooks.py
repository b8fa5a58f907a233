"""The saved-tensor hooks: what pack stores and what unpack hands back.

Inside a step, :func:`torch.autograd.graph.saved_tensors_hooks` routes every
tensor autograd saves through :meth:`_SavedTensorHooks.pack` and back through
:meth:`_SavedTensorHooks.unpack`:

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
runs backward on; entries and the step's tables change under the
offloader's lock.
"""

import contextlib
import time

import torch

from .entries import _Entry, _Saved, _span, _storage_ptr
from .layers import _HEAD


class _SavedTensorHooks:
    """Pack and unpack: dedup, the tier of each save, forwarding, stalls.

    Args:
        options: the offloader's settings (``min_bytes``, ``keep_last``,
            ``copy_window``, ``policy``...), read as it acts.
        state (_StepState): the step's entries, phase, report.
        lock: the offloader's lock.
        layers (:class:`~.layers._LayerHooks`): the group of a save, parameters.
        copies (:class:`~.copy_out._CopyOut`): stores entries, polls copies.
        reads (:class:`~.read_ahead._ReadAhead`): loads, the read-ahead credit.
        release (:class:`~.entries._EntryRelease`): frees consumed entries.
        diagnosis (:class:`~.diagnosis._Diagnosis`): samples at each hook.
        backward_starts: called at the first unpack of a step's backward.
    """

    def __init__(self, options, state, lock, layers, copies, reads, release, diagnosis, backward_starts):
        self._options, self._state, self._lock = options, state, lock
        self._layers, self._copies, self._reads, self._release = layers, copies, reads, release
        self._diagnosis, self._backward_starts = diagnosis, backward_starts
        self._kept_keys = set()  # regions kept this step, each counted once in the layer's bytes

    def begin_step(self):
        self._kept_keys = set()

    # -- pack -----------------------------------------------------------------

    @contextlib.contextmanager
    def _timed(self, stage, where):
        """A hook's seconds into the report's ``stage``; then, diagnosing, a sample at ``where()``."""
        try:
            with self._state.report.stage(stage):
                yield
        finally:
            if self._diagnosis.on:
                self._diagnosis.sample(where())

    def pack(self, t):
        with self._timed("pack", lambda: f"pack {self._layers.current_layer}"):
            return self._pack_inner(t)

    def _kept(self, t, group, nbytes):
        """A layer's activation left where it is, handed to autograd detached; with tight reads
        its memory, once autograd drops it, is credit for reading ahead."""
        d = t.detach()
        if self._options.track_frees and isinstance(group, int) and self._state.phase == "forward":
            self._reads.track_kept(d, nbytes)
        return d

    def _keep_layer_bytes(self, key, group, nbytes):
        """A layer's region kept: its bytes count for the layer once (the policy's profile)."""
        if key not in self._kept_keys:
            self._kept_keys.add(key)
            r = self._state.report
            r.layer_bytes[group] = r.layer_bytes.get(group, 0) + nbytes
            r.layer_regions[group] = r.layer_regions.get(group, 0) + 1

    def _pack_inner(self, t):
        # What stays is returned detached: the tensor itself, where it is the output of the node saving it,
        # would make a reference cycle through C++ (node -> saved -> tensor -> node) that nothing collects.
        options, state, copies = self._options, self._state, self._copies
        r = state.report
        nbytes = t.numel() * t.element_size()
        r.count("packed", nbytes)
        stack = self._layers.group_stack
        if stack:  # the hooks' cost is per tensor saved, whatever becomes of it (the mixed policy's model)
            r.layer_saves[stack[-1]] = r.layer_saves.get(stack[-1], 0) + 1
        if copies.inflight:  # originals whose copy landed go, whatever happens to this tensor
            with self._lock:
                copies.poll()
        if not state.active or state.phase != "forward":
            if state.phase == "backward" and state.outstanding == 0:
                # a new forward after a finished backward in the same block (gradient accumulation)
                state.phase = "forward"
                self._reads.new_forward()
                self._layers.new_forward()
            else:
                r.keep("backward" if state.active else "inactive", nbytes)
                return t.detach()
        if nbytes < max(options.min_bytes, 1) or t.device.type not in ("cpu", "cuda") or t.is_sparse:
            r.keep("small" if nbytes < max(options.min_bytes, 1) else "device", nbytes)
            return t.detach()
        if self._layers.is_parameter(t):
            r.keep("parameter", nbytes)
            return t.detach()
        policy = options.policy
        group = self._layers.current_group(nbytes)
        if group == _HEAD and not (options.drain and policy.decide(_HEAD) != "keep"):
            # the output head's tensors stay (memory-tight with a policy that moves it: stored, but the last)
            r.keep("head", nbytes)
            return t.detach()
        span = _span(t)
        dense = span == t.numel()
        key = (t.device, _storage_ptr(t), t.storage_offset(), t.dtype, t._version,
               span if dense else (tuple(t.shape), tuple(t.stride())))
        decision = policy.decide(group)
        r.decisions.setdefault(group, decision)
        if decision == "keep":
            r.keep("layer", nbytes)
            self._keep_layer_bytes(key, group, nbytes)
            return self._kept(t, group, nbytes)
        if t.device.type == "cuda" and state.cuda is None:
            state.cuda = (torch.cuda.Stream(t.device), torch.cuda.Stream(t.device))
        with self._lock:
            entry = state.entries.get(key)
            # the original must still live: once it died, its memory (and so the key) may be another tensor's
            if entry is not None and not entry.released and entry.src_weak() is not None:
                entry.outstanding += 1
                state.outstanding += 1
                r.count("deduped", entry.nbytes)
                return _Saved(self._release, entry, t)
            stored = (span if dense else t.numel()) * t.element_size()
            quota = policy.quota(group)
            if quota is not None and state.layer_stored[group] + stored > quota:
                # the policy moves only part of this layer (what its compute hides); the rest stays
                r.keep("quota", nbytes)
                self._keep_layer_bytes(key, group, nbytes)
                return self._kept(t, group, nbytes)
            state.layer_stored[group] += stored
            entry = _Entry(key, group, t, stored, dense, span, state.index)
            entry.outstanding = 1
            state.outstanding += 1
            state.entries[key] = entry
            state.step_entries.append(entry)
            state.groups[group].append(entry)
            if state.trace is not None:
                state.trace.append((_storage_ptr(t), entry))
            previous, state.pending = state.pending, (entry if options.keep_last else None)
            if previous is not None:
                copies.commit(previous)
            if not options.keep_last:
                copies.commit(entry)
            copies.poll(force_before=group - options.copy_window if isinstance(group, int) else None,
                        bound=options.inflight_bytes)
            return _Saved(self._release, entry, t)

    # -- unpack ---------------------------------------------------------------

    def unpack(self, saved):
        options, state, reads = self._options, self._state, self._reads
        if not isinstance(saved, _Saved):
            if state.active and state.phase == "forward" and (options.drain or options.tight_reads):
                self._backward_starts()  # memory-tight: the drain happens before the head's backward
            if options.tight_reads:
                if reads.freed_q:
                    with self._lock:
                        reads.grant_freed()
            elif reads.queue and isinstance(saved, torch.Tensor):
                nbytes = saved.numel() * saved.element_size()
                if nbytes >= max(options.min_bytes, 1) and not self._layers.is_parameter(saved):
                    with self._lock:  # an activation kept here: its memory goes once backward used it
                        reads.kept_used(nbytes)
            if self._diagnosis.on and state.phase == "backward":
                self._diagnosis.sample("unpack kept")
            return saved
        if saved.value is not None:  # retain_graph: unpacked again
            return saved.value
        with self._timed("unpack", lambda: f"unpack {saved.entry.group}"):
            return self._unpack_inner(saved)

    def _unpack_inner(self, saved):
        self._backward_starts()
        state, reads = self._state, self._reads
        e = saved.entry
        r = state.report
        with self._lock:
            if e.released:
                raise RuntimeError("spillfs.torch.offload_activations: this saved tensor was released (its step "
                                   "ended with an exception, or the offloader was closed); run forward again")
            if reads.freed_q:
                reads.grant_freed()
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
                    reads.read_now(e)
                    r.stall_seconds += time.perf_counter() - t0
                else:
                    if e.prefetched and not getattr(e, "forwarded"):
                        r.prefetch_hits += 1
                        e.prefetched = False  # count once
                    if e.read_req is not None:
                        t0 = time.perf_counter()
                        reads.finish_load(e)
                        waited = time.perf_counter() - t0
                        if waited > 1e-4:
                            r.stalls += 1
                            r.stall_seconds += waited
                t = e.loaded
                reads.used(e)
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
            state.outstanding -= 1
            if e.outstanding == 0:
                self._release.release(e)
                reads.entry_used(e)  # its memory goes once its node ran
            if e.group != _HEAD:
                reads.prefetch_from(e.group)
            return t
