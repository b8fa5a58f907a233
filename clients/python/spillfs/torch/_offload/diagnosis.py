"""Diagnosis (``ActivationOffloader.diagnose``): where the device memory of a step goes.

With ``diagnose`` set, every hook (pack, unpack, a layer's forward and its
backward beginning, the last layer's end, backward's start) calls
:meth:`_Diagnosis.sample`: what the offloader holds on the device by kind
(originals held for copies in flight, forwarded, kept entries, read back and
not yet used, used and not yet freed), the read-ahead credit, and the
allocator's figures (``_mem_probe`` in tests). The report keeps the samples at
forward's end and backward's start, and the two around the step's peak
(``report.diagnosis``). It costs host time at every hook: for one step of a
benchmark, not for training.

Threading: the offloader's state is read under its lock; the allocator is
asked outside it.
"""

import torch


class _Diagnosis:
    """Samples what the offloader holds around the step's peak.

    Args:
        state (_StepState): the step (its entries, phase, report, CUDA streams).
        lock: the offloader's lock.
        copies (:class:`~.copy_out._CopyOut`): the originals held for copies in flight.
        reads (:class:`~.read_ahead._ReadAhead`): what was read ahead, the credit.
    """

    def __init__(self, state, lock, copies, reads):
        self._state, self._lock, self._copies, self._reads = state, lock, copies, reads
        self._diag = None  # {"peak_seen", "last"} while diagnosing a step
        self.mem_probe = None  # tests: () -> (allocated, peak), instead of torch's allocator

    def begin_step(self, enabled):
        self._diag = {"peak_seen": 0, "last": None} if enabled else None

    @property
    def on(self):
        """Whether this step is diagnosed."""
        return self._diag is not None

    def sample(self, where, key=None):
        """What the offloader holds on the device now, and the allocator's figures; where the
        step's peak grew since the last sample, the two samples around it."""
        d = self._diag
        if d is None:
            return
        state = self._state
        with self._lock:
            held = forwarded = kept_entries = loaded = consumed = 0
            for e in state.step_entries:
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
            sample = {"at": where, "phase": state.phase, "originals_held": held,
                      "in_flight": self._copies.inflight_held(), "forwarded": forwarded,
                      "kept_entries": kept_entries, "read_back_unused": loaded, "used_not_freed": consumed,
                      **self._reads.figures()}
        if self.mem_probe is not None:
            allocated, peak = self.mem_probe()
        elif state.cuda is not None:
            dev = state.cuda[0].device
            allocated, peak = torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev)
        else:
            allocated = peak = None
        sample["allocated"] = allocated
        r = state.report
        if key is not None:
            r.diagnosis[key] = sample
        if peak is not None and peak > d["peak_seen"]:
            d["peak_seen"] = peak
            r.diagnosis["peak"] = peak
            r.diagnosis["peak_between"] = [d["last"], sample]
        d["last"] = sample
