"""What one step of :func:`spillfs.torch.offload_activations` did."""

from ..._report import Report

__all__ = ["OffloadReport"]

_COUNTERS = ("packed", "kept", "host", "ssd", "deduped", "forwarded")


class OffloadReport(Report):
    r"""What one step (one ``with`` block) of an activation offloader did.

    Counts are of saved tensors (``*_count``) and their bytes (``*_bytes``);
    a tensor is counted once however many times autograd saved it.

    Attributes:
        step (int): index of the step (0 for the first ``with`` block).
        policy (str): ``"all"``, ``"none"``, ``"adaptive"``, ``"mixed"``
            (``"adaptive:profile"``, ``"mixed:profile:<kind>"`` while they profile).
        saved_hooks (bool): whether the step ran with the saved-tensor hooks; False with
            ``policy="none"``, whose steps keep every tensor without them (the counts below stay 0).
        packed_count, packed_bytes: every tensor autograd saved inside the region.
        kept_count, kept_bytes: saved tensors left where they were, for any
            reason (see ``kept_reasons``: ``"small"``, ``"parameter"``,
            ``"head"``, ``"last"``, ``"layer"`` (the policy kept the layer),
            ``"quota"`` (past the part of its layer the policy moves),
            ``"backward"`` (saved during backward: recomputation),
            ``"no_room"`` (no tier could take it), ``"error"`` (a write failed)).
        host_count, host_bytes: tensors copied to the host tier.
        ssd_count, ssd_bytes: tensors written to files.
        deduped_count, deduped_bytes: saves of a tensor already stored (same
            storage, offset, extent and version), served by the one copy.
        forwarded_count, forwarded_bytes: tensors served from the memory of the
            original (still alive, or its copy still in flight): no read.
        read_host_bytes, read_ssd_bytes: bytes brought back from each tier.
        read_staged_bytes: bytes of files brought back from their staging
            region, before the write to the file happened (no disk read).
        prefetch_hits (int): tensors whose read was started by the prefetcher
            before backward needed them.
        read_ahead_peak_bytes (int): the most bytes read back and not yet
            used by backward at any time of the step (the prefetcher reads
            the layers ahead as backward frees memory, so this stays near
            one layer's bytes with ``prefetch_layers=1``).
        read_beyond_freed_peak_bytes (int): the most bytes read back in
            backward beyond the bytes of saved activations autograd had freed
            by then (stored ones once used, kept ones of layers): what reading
            adds to the activations backward began with. With
            ``read_ahead_bytes`` set, at most that plus what backward needed
            at once (``stalls``).
        inflight_peak_bytes (int): the most bytes of originals held on the
            device for device-to-host copies that may still run (at most
            ``inflight_bytes`` where that is set), counted after each store.
        inflight_at_backward_bytes (int): bytes of offloaded originals still
            on the device when backward began (served from there: forwarded);
            0 with ``inflight_bytes`` set.
        diagnosis (dict): with ``ActivationOffloader.diagnose``: samples of
            what the offloader holds on the device (``originals_held``,
            ``in_flight``, ``forwarded``, ``kept_entries``,
            ``read_back_unused``, ``used_not_freed``, ``credit``...) and
            ``allocated`` (torch's allocator) at ``forward_end``,
            ``backward_start``, and the two hook calls around the step's
            peak (``peak_between``, with ``peak``).
        stalls (int): tensors backward had to wait for (read not started, or
            not finished, when needed).
        stall_seconds (float): host time spent waiting for them.
        copy_waits (int): device-to-host copies the compute stream had to wait
            for, so that the memory of their originals could be reused (the
            copies lag more than ``copy_window`` layers behind the compute).
        write_errors (int): writes that failed (``ENOSPC``...); the tensor was
            kept (or, written from a staging region, served from that region).
        decisions (dict): layer index -> ``"keep"``, ``"host"``, ``"ssd"``,
            ``"recompute"`` or ``"selective"`` (``-1``: what runs before the first layer).
        plan (list): :class:`~spillfs.torch.MixedPolicy`'s choice per layer (a dict each:
            ``decision``, ``fraction``, ``bytes``, ``freed_at_peak``, ``added_seconds``...;
            see ``MixedPolicy.plan``); empty for the other policies.
        layer_bytes (dict): layer index -> bytes of offload candidates saved.
        layer_regions (dict): layer index -> regions kept (each once), as ``layer_bytes`` counts them.
        layer_saves (dict): layer index -> tensors saved through the hooks in its forward.
        layer_input_bytes (dict): layer index -> bytes of its tensor arguments (timed
            profile steps only).
        memory_phases (list): timed profile steps on CUDA: ``(layer, peak)`` as each layer's
            backward begins (the peak above the step's start of the phase ending there:
            forward and the head first), then ``("end", peak)``.
        files_keep_up (bool or None): where tensors went to files, whether the disk kept up
            with the step (False: busy for over half of it, or backward waited for reads
            for over a tenth of it; a ``RuntimeWarning`` says so once).
        predicted (dict): the policy's prediction for this step
            (``step_seconds``, ``memory_saved``; :class:`~spillfs.torch.MixedPolicy`'s
            also ``peak_bytes``, ``budget_met``, ``files``...), empty when it made none.
        measured (dict): ``step_seconds`` (the ``with`` block, the GPU
            synchronized at its end), ``memory_saved`` (bytes moved off the
            device: host plus SSD), ``baseline_seconds`` (the profiled
            keep-everything step), ``peak_bytes`` (the allocator's peak above
            the step's start, in the steps the policy checks its plan by:
            :meth:`MixedPolicy._calibrate`).
        io_backend (str or None): how files were reached (``"direct_path"``,
            ``"mount"``, ``"direct_io"``, ``"buffered"``, ``"posix"``).
        host_peak_bytes (int): the host tier's peak occupancy this step.
        seconds (dict): host seconds in ``pack``, ``unpack``, ``prefetch``.
    """

    _DEFAULTS = {"step": 0, "policy": "all", "saved_hooks": True,
                 **{f"{name}_{unit}": 0 for name in _COUNTERS for unit in ("count", "bytes")},
                 "kept_reasons": {}, "read_host_bytes": 0, "read_ssd_bytes": 0, "read_staged_bytes": 0,
                 "prefetch_hits": 0, "read_ahead_peak_bytes": 0, "read_beyond_freed_peak_bytes": 0,
                 "inflight_peak_bytes": 0, "inflight_at_backward_bytes": 0, "diagnosis": {}, "stalls": 0,
                 "stall_seconds": 0.0, "copy_waits": 0, "write_errors": 0, "decisions": {}, "plan": [],
                 "layer_bytes": {}, "layer_regions": {}, "layer_saves": {}, "layer_input_bytes": {},
                 "memory_phases": [], "files_keep_up": None,
                 "predicted": {}, "measured": {}, "io_backend": None, "host_peak_bytes": 0, "seconds": {}}

    def __init__(self, step=0, policy="all"):
        super().__init__(step=step, policy=policy)

    def count(self, what, nbytes):
        setattr(self, what + "_count", getattr(self, what + "_count") + 1)
        setattr(self, what + "_bytes", getattr(self, what + "_bytes") + nbytes)

    def keep(self, reason, nbytes):
        self.count("kept", nbytes)
        self.kept_reasons[reason] = self.kept_reasons.get(reason, 0) + 1

    @property
    def offloaded_bytes(self):
        """Bytes moved off the device (host tier and files)."""
        return self.host_bytes + self.ssd_bytes

    def as_dict(self):
        """The attributes as a plain dict (for ``json.dumps``: layer keys as strings)."""
        d = super().as_dict()
        d["decisions"] = {str(k): v for k, v in self.decisions.items()}
        for name in ("layer_bytes", "layer_regions", "layer_saves", "layer_input_bytes"):
            d[name] = {str(k): v for k, v in getattr(self, name).items()}
        d["plan"] = [dict(row) for row in self.plan]
        return d

    def summary(self):
        """One line for logs."""
        mb = 1 << 20
        line = (f"step {self.step} [{self.policy}]: saved {self.packed_bytes / mb:.1f} MiB in {self.packed_count}, "
                f"host {self.host_bytes / mb:.1f} MiB, ssd {self.ssd_bytes / mb:.1f} MiB, "
                f"kept {self.kept_bytes / mb:.1f} MiB, deduped {self.deduped_count}, "
                f"forwarded {self.forwarded_count}, prefetch hits {self.prefetch_hits}, "
                f"stalls {self.stalls} ({self.stall_seconds * 1e3:.1f} ms)")
        if self.predicted:
            line += (f", predicted {self.predicted.get('step_seconds', 0) * 1e3:.1f} ms"
                     f" / measured {self.measured.get('step_seconds', 0) * 1e3:.1f} ms")
        return line

    def __repr__(self):
        return f"OffloadReport({self.summary()})"
