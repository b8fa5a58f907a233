"""Diagnosis (``ActivationOffloader.diagnose``): where the device memory of a step goes.

With ``diagnose`` set, every hook (pack, unpack, a layer's forward and its
backward beginning, the last layer's end, backward's start) calls
:meth:`_Diagnosis._sample`: what the offloader holds on the device by kind
(originals held for copies in flight, forwarded, kept entries, read back and
not yet used, used and not yet freed), the read-ahead credit, and the
allocator's figures (``_mem_probe`` in tests). The report keeps the samples at
forward's end and backward's start, and the two around the step's peak
(``report.diagnosis``). It costs host time at every hook: for one step of a
benchmark, not for training.

Threading: the offloader's state is read under its ``_lock``; the allocator
is asked outside it.
"""

import torch


class _Diagnosis:
    """Samples what the offloader holds around the step's peak
    (a mixin of :class:`~.core.ActivationOffloader`; its state is the offloader's)."""

    # -- diagnosis ------------------------------------------------------------

    def _sample(self, where, key=None):
        """Diagnosis (``diagnose``): what the offloader holds on the device now, and the allocator's
        figures; where the step's peak grew since the last sample, the two samples around it."""
        d = self._diag
        if d is None:
            return
        with self._lock:
            held = forwarded = kept_entries = loaded = consumed = 0
            for e in self._step_entries:
                if e.released:
                    if e.consumed and not e.credited and e.values > 0:
                        consumed += e.nbytes  # used by backward, its node not yet done
                    continue
                if e.src is not None:
                    if e.tier == "keep":
                        kept_entries += e.nbytes
                    elif e.forwarded:
                        forwarded += e.nbytes
                    else:
                        held += e.nbytes
                if e.loaded is not None:
                    loaded += e.nbytes
            state = {"at": where, "phase": self._phase, "originals_held": held, "in_flight": self._inflight_held(),
                     "forwarded": forwarded, "kept_entries": kept_entries, "read_back_unused": loaded,
                     "used_not_freed": consumed, "read_ahead": self._read_ahead, "credit": self._prefetch_credit,
                     "read_bytes": self._read_bytes, "freed_bytes": self._freed_bytes}
        probe = getattr(self, "_mem_probe", None)
        if probe is not None:
            allocated, peak = probe()
        elif self._cuda is not None:
            dev = self._cuda[0].device
            allocated, peak = torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev)
        else:
            allocated = peak = None
        state["allocated"] = allocated
        r = self.report
        if key is not None:
            r.diagnosis[key] = state
        if peak is not None and peak > d["peak_seen"]:
            d["peak_seen"] = peak
            r.diagnosis["peak"] = peak
            r.diagnosis["peak_between"] = [d["last"], state]
        d["last"] = state
