"""Which layers go where: ``"all"``, ``"none"`` and the adaptive policy.

The adaptive policy keeps everything for its first ``profile_steps`` steps
and measures, per layer, the bytes of offload candidates it saves and its
forward and backward times (CUDA events on the compute stream, or the host
clock on the CPU), then measures each tier's bandwidth (a pinned copy each
way; a file written and read under ``dir`` through the same I/O the
offloader uses). From these it models a step (below) and decides, layer by
layer from the first (whose copies have the most compute to hide behind),
the largest part of the layer (a fraction of its bytes: ``fractions``) for
the host tier, else SSD, else keep, so that the modelled step stays within
``max_overhead`` of the measured keep-everything step and the host tier
within ``host_bytes``; the offloader stores a part's tensors in the order
they are saved while they fit (:meth:`AdaptivePolicy.quota`). It states its prediction (step time, bytes moved off
the device) in each step's report beside what was measured, and refreshes
bandwidths from what the steps measure.

The model: forward runs the layers back to back; layer i's copy to its tier
starts when its forward ends and when the tier finished the copies before it
(device to host and host to device are separate directions; a disk serves
writes and reads in turn); layer i (the head: layer n) waits for the host
copies of the layers up to i - 1 - ``copy_window`` (the offloader's window);
the peak saved is what that window forced out before the head. Backward runs the layers in reverse; layer i's
read starts when layer ``i + prefetch_layers`` starts its backward (the
prefetcher's trigger), when its write is done and the tier is free, and
layer i waits for it. The predicted step is the measured keep step plus the
waits.
"""

import time

__all__ = ["make_policy", "Policy", "AdaptivePolicy", "pinned_copy_seconds"]

_MiB = 1 << 20


def pinned_copy_seconds(device_buffer, host_buffer, stream=None):
    """Seconds of one copy of ``device_buffer`` (CUDA) into ``host_buffer``
    (pinned, as large) and of one back, timed by CUDA events on ``stream``
    (default: the current one; a side stream first waits for the current
    one). The second of two runs: the first warms the path. The adaptive
    policy's probe of the host tier and activation_bench.py's raw copy rates."""
    import torch
    current = torch.cuda.current_stream(device_buffer.device)
    stream = current if stream is None else stream
    for _ in range(2):
        d2h, h2d, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        if stream != current:
            stream.wait_stream(current)
        with torch.cuda.stream(stream):
            d2h.record()
            host_buffer.copy_(device_buffer, non_blocking=True)
            h2d.record()
            device_buffer.copy_(host_buffer, non_blocking=True)
            done.record()
        done.synchronize()
    return d2h.elapsed_time(h2d) / 1e3, h2d.elapsed_time(done) / 1e3


class Policy:
    """``"all"`` (every layer to the host tier, then files) or ``"none"`` (keep)."""

    def __init__(self, name):
        if name not in ("all", "none"):
            raise ValueError(f"policy must be 'adaptive', 'all', 'none' or an AdaptivePolicy, not {name!r}")
        self.name = name
        self._bytes = {}

    def begin_step(self, off, report):
        pass

    def decide(self, group):
        return "keep" if self.name == "none" else "offload"

    def end_step(self, off, report, marks, seconds):
        self._bytes = dict(report.layer_bytes)

    def observe_io(self, kind, nbytes, submitted, seconds):
        pass

    def bytes_hint(self, group):
        return self._bytes.get(group, 0)

    def quota(self, group):
        """Bytes of `group` to store at most this step (None: no limit)."""
        return None

    def recompute_layers(self):
        return ()

    def saves_tensors(self):
        """Whether this step needs the saved-tensor hooks: ``"none"`` keeps every tensor where it is, so its
        steps run without them (no Python per saved tensor)."""
        return self.name != "none"


def make_policy(policy):
    if isinstance(policy, (Policy, AdaptivePolicy)):
        return policy
    if policy == "adaptive":
        return AdaptivePolicy()
    if isinstance(policy, str):
        return Policy(policy)
    raise TypeError(f"policy must be a str or an AdaptivePolicy, not {type(policy).__name__}")


def _elapsed(a, b):
    """Seconds from mark a to mark b (CUDA events or perf_counter floats)."""
    if isinstance(a, float):
        return b - a
    return a.elapsed_time(b) / 1e3


class AdaptivePolicy:
    r"""Decides per layer keep, host or SSD from a profile of the first steps.

    Args:
        profile_steps (int): steps to run keeping everything, measuring (the
            last one counts; 2 on CUDA by default, so warm-up is not measured).
        max_overhead (float): the step time allowed above the keep step
            (0.03: 3%).
        probe_bytes (int): bytes of each bandwidth probe (64 MiB on CUDA, 8 MiB
            on the CPU by default).
        recompute (bool): layers that neither tier can hide are recomputed in
            backward (``torch.utils.checkpoint``, non-reentrant) instead of kept,
            the most bytes per second of forward first, while the modelled step
            stays within ``max_overhead``.

    Attributes:
        decisions (dict): layer index -> ``"keep"``, ``"host"``, ``"ssd"`` or
            ``"recompute"`` (empty while profiling).
        profile (dict): what it measured: ``fwd`` and ``bwd`` (seconds per
            layer), ``bytes`` (per layer), ``step_seconds`` (keep), and
            ``bandwidth`` (bytes/s: ``host_write``, ``host_read``,
            ``ssd_write``, ``ssd_read``).
        prediction (dict): of its decisions: ``step_seconds``, ``memory_saved``
            (bytes moved off the device or recomputed), ``peak_saved`` (those of
            them gone by the end of forward, where the peak is: a copy still in
            flight holds its device memory), ``stall_seconds``.
    """

    name = "adaptive"

    def __init__(self, profile_steps=None, max_overhead=0.03, probe_bytes=None, recompute=False):
        if max_overhead < 0:
            raise ValueError(f"max_overhead must be >= 0, not {max_overhead!r}")
        self.recompute = bool(recompute)
        self.profile_steps = profile_steps
        self.max_overhead = float(max_overhead)
        self.probe_bytes = probe_bytes
        self.decisions = {}
        self.fractions = {}
        self.profile = {}
        self.prediction = {}
        self._steps = 0
        self._last_peak_saved = 0
        self._io = {}
        self._profiling = True
        # a part of a layer smaller than this is not worth a copy (a whole layer always is)
        self.min_part_bytes = 4 * _MiB

    # -- the offloader's calls -------------------------------------------------

    def begin_step(self, off, report):
        if self.profile_steps is None:
            import torch
            self.profile_steps = 2 if torch.cuda.is_available() else 1
        self._profiling = self._steps < self.profile_steps
        report.policy = "adaptive:profile" if self._profiling else "adaptive"
        if not self._profiling:
            report.predicted = dict(self.prediction)
            report.decisions.update(self.decisions)
            report.measured["baseline_seconds"] = self.profile.get("step_seconds")
        self._io = {}

    def decide(self, group):
        if self._profiling:
            return "keep"
        if group == -1:  # what runs before the first layer (embeddings) follows it, never recomputed
            d = self.decisions.get(0, "keep")
            return "keep" if d == "recompute" else d
        return self.decisions.get(group, "keep")

    def bytes_hint(self, group):
        return self.profile.get("bytes", {}).get(group, 0)

    def quota(self, group):
        """Bytes of `group` the offloader stores at most (the rest of the layer stays), or
        None for all of it: a layer whose whole copy its compute cannot hide moves the part
        that it can (saved tensors in the order they are saved, while they fit)."""
        if self._profiling:
            return None
        frac = self.fractions.get(0 if group == -1 else group)
        if frac is None or frac >= 1.0:
            return None
        # 1 MiB of slack: the profile's bytes and this step's differ by rounding
        return int(frac * self.profile.get("bytes", {}).get(group, 0)) + _MiB

    def recompute_layers(self):
        """Indices of the layers to run under activation checkpointing this step."""
        if self._profiling:
            return ()
        return tuple(i for i, d in self.decisions.items() if d == "recompute")

    def saves_tensors(self):
        """Always: its profile and its quotas count each layer's saved bytes in the pack hook."""
        return True

    def observe_io(self, kind, nbytes, submitted, seconds):
        if submitted is None or not seconds:
            return
        total, busy, last_end = self._io.get(kind, (0, 0.0, 0.0))
        end = submitted + seconds
        busy += end - max(submitted, last_end) if end > last_end else 0.0  # union of the intervals
        self._io[kind] = (total + nbytes, busy, max(end, last_end))

    def end_step(self, off, report, marks, seconds):
        self._steps += 1
        if self._profiling:
            fwd, bwd, head = self._layer_times(marks, len(off.layers))
            self.profile = {"fwd": fwd, "bwd": bwd, "head": head, "bytes": dict(report.layer_bytes),
                            "step_seconds": seconds, "bandwidth": dict(self.profile.get("bandwidth", {}))}
            if self._steps >= self.profile_steps:
                self.profile["bandwidth"].update(self._probe(off))
                self._decide(off)
        else:
            bw = self.profile.setdefault("bandwidth", {})
            for kind, (total, busy, _) in self._io.items():
                if busy > 0 and total >= 4 * _MiB:
                    bw[kind] = 0.5 * bw.get(kind, total / busy) + 0.5 * total / busy

    # -- profile ---------------------------------------------------------------

    @staticmethod
    def _layer_times(marks, n_layers):
        if marks and not isinstance(marks[0][2], float):
            marks[-1][2].synchronize()
        fwd = [0.0] * n_layers
        bwd = [0.0] * n_layers
        starts = {}
        last_fwd_end = None
        first_bwd = None
        for i, (kind, layer, stamp) in enumerate(marks):
            if kind == "fwd_start":
                starts[layer] = stamp
            elif kind == "fwd_end" and layer in starts:
                fwd[layer] += _elapsed(starts.pop(layer), stamp)
                last_fwd_end = stamp
            elif kind == "bwd_start":
                if first_bwd is None:
                    first_bwd = stamp
                if i + 1 < len(marks):
                    bwd[layer] += _elapsed(stamp, marks[i + 1][2])
        head = _elapsed(last_fwd_end, first_bwd) if last_fwd_end is not None and first_bwd is not None else 0.0
        return fwd, bwd, head

    def _probe(self, off):
        """Bandwidths of the tiers (bytes/s), measured with `probe_bytes` now."""
        import torch
        cuda = off._on_cuda()
        n = self.probe_bytes or (64 * _MiB if cuda else 8 * _MiB)
        bw = {}
        if cuda:
            dev = torch.empty(n, dtype=torch.uint8, device="cuda")
            write, read = pinned_copy_seconds(dev, torch.empty(n, dtype=torch.uint8, pin_memory=True))
            bw["host_write"] = n / max(write, 1e-9)
            bw["host_read"] = n / max(read, 1e-9)
        else:
            src, dst = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
            t0 = time.perf_counter()
            dst.copy_(src)
            t1 = time.perf_counter()
            src.copy_(dst)
            t2 = time.perf_counter()
            bw["host_write"] = n / max(t1 - t0, 1e-9)
            bw["host_read"] = n / max(t2 - t1, 1e-9)
            dev = src
        if off.dir is not None:
            try:
                bw.update(self._probe_files(off, dev, n))
            except OSError:
                pass
        return bw

    @staticmethod
    def _probe_files(off, buf, n):
        import torch
        f = off._file_tier().open("probe", n)
        try:
            cuda = buf.device.type == "cuda"
            if cuda and not f.native:
                buf = buf.cpu()
                cuda = False
            device = buf.device.index if cuda else -1
            stream = torch.cuda.current_stream().cuda_stream if cuda else 0
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            f.write(buf.data_ptr(), n, 0, device, stream).wait()
            f.done()
            t1 = time.perf_counter()
            f.read(buf.data_ptr(), n, 0, device, stream).wait()
            f.done()
            if cuda:
                torch.cuda.synchronize()
            t2 = time.perf_counter()
        finally:
            f.close()
        return {"ssd_write": n / max(t1 - t0, 1e-9), "ssd_read": n / max(t2 - t1, 1e-9)}

    # -- the model -------------------------------------------------------------

    def simulate(self, decisions, prefetch_layers, copy_window=1, fractions=None, inflight_bytes=None):
        """Modelled seconds of a step (forward, head, backward; no optimizer)
        under `decisions` (layer -> "keep"/"host"/"ssd"/"recompute") and
        `fractions` (layer -> the part of its bytes moved; 1 where absent), and
        the waits in it: in forward, layer i (the head: layer n) waits for the
        host copies of the layers up to i - 1 - ``copy_window`` (the offloader's
        window makes the compute stream wait for them, so their originals go);
        in backward, for the reads of layer i, started when layer i +
        `prefetch_layers` began its backward. With `inflight_bytes` (the
        offloader's memory-tight forward), a layer's host copy streams while its
        forward runs (it ends no earlier than the forward), each layer and the
        head begin only once all but the newest `inflight_bytes` copied bytes
        landed, and the head waits for every host copy (the drain); the last
        layer, not forwarded then, is read back when backward begins."""
        p = self.profile
        fwd, bwd, nbytes, bw = p["fwd"], p["bwd"], p["bytes"], p["bandwidth"]
        fractions = fractions or {}
        n = len(fwd)
        moved = {i: nbytes.get(i, 0) * fractions.get(i, 1.0) for i in range(n)}
        t = 0.0
        # a recomputed layer saves (almost) nothing and runs its forward again in backward
        bwd = [b + (fwd[i] if decisions.get(i) == "recompute" else 0.0) for i, b in enumerate(bwd)]
        free = {"host_write": 0.0, "ssd": 0.0}
        written = {}
        host_landed = []  # (layer, time its host copy landed), in order: one copy stream
        host_copies = []  # memory-tight: (bytes, start, end) of each host copy, in order
        fwd_stall = 0.0
        tight = inflight_bytes is not None

        def window_wait(i, t):
            # the copies of layers <= i - 1 - copy_window: the last of them landed last (in order)
            last = None
            for j, end in host_landed:
                if j <= i - 1 - copy_window:
                    last = end
            if tight and host_copies:
                if i >= n:  # the drain before the head: every copy
                    last = max(last or 0.0, host_copies[-1][2])
                else:  # all but the newest inflight_bytes copied bytes landed (copies land in order)
                    target = sum(c[0] for c in host_copies) - inflight_bytes
                    done = 0.0
                    for nb, start, end in host_copies:
                        if target <= done:
                            break
                        if target <= done + nb:
                            last = max(last or 0.0, start + (end - start) * (target - done) / max(nb, 1.0))
                            break
                        done += nb
            return max(t, last) if last is not None else t

        for i in range(n):
            begin = window_wait(i, t)
            fwd_stall += begin - t
            t = begin + fwd[i]
            tier = decisions.get(i, "keep")
            if tier in ("keep", "recompute"):
                continue
            key = "host_write" if tier == "host" else "ssd"
            rate = bw.get(tier + "_write") or 1.0
            if tight and tier == "host":
                # the copy streams as the layer saves (from its start), and ends no earlier than its forward
                start = max(begin, free[key])
                free[key] = max(start + moved[i] / rate, t)
                host_copies.append((moved[i], start, free[key]))
            else:
                start = max(t, free[key])
                free[key] = start + moved[i] / rate
            written[i] = free[key]
            if tier == "host":
                host_landed.append((i, written[i]))
        begin = window_wait(n, t)  # the head waits as a layer n would
        fwd_stall += begin - t
        t = begin + p.get("head", 0.0)
        # where the peak is (the start of backward), the originals gone are those the window forced out
        # (host copies of layers <= n - 1 - copy_window: the host runs ahead of the GPU, so a copy that
        # lands later is no help), those written to files by then, and the recomputed layers
        self._last_peak_saved = (
            sum(moved[i] for i, d in decisions.items() if d == "host" and (tight or i <= n - 1 - copy_window))
            + sum(moved[i] for i, d in decisions.items() if d == "ssd" and written[i] <= t)
            + sum(nbytes.get(i, 0) for i in range(n) if decisions.get(i) == "recompute"))
        read_free = {"host": t, "ssd": max(t, free["ssd"])}
        ready, issued, stall = {}, set(), 0.0
        for j in range(n - 1, -1, -1):
            for i in range(j, max(j - prefetch_layers, 0) - 1, -1):
                if i in issued or decisions.get(i, "keep") in ("keep", "recompute"):
                    continue
                issued.add(i)
                tier = decisions[i]
                rate = bw.get(tier + "_read") or 1.0
                start = max(t, written[i], read_free[tier])
                read_free[tier] = start + moved[i] / rate
                ready[i] = read_free[tier]
            begin = max(t, ready.get(j, t))
            stall += begin - t
            t = begin + bwd[j]
        return t, stall + fwd_stall

    def _largest_fraction(self, decisions, fractions, i, tier, cap, base, budget, off):
        """The largest part of layer i (at most `cap`) that `tier` takes within the budget (0: none)."""
        def fits(f):
            t, _ = self.simulate({**decisions, i: tier}, off.prefetch_layers, off.copy_window, {**fractions, i: f},
                                 getattr(off, "inflight_bytes", None))
            return t - base <= budget
        if cap >= 1.0 and fits(1.0):
            return 1.0
        lo, hi = 0.0, min(cap, 1.0)
        if fits(hi):
            return hi
        for _ in range(12):  # the modelled step grows with the part moved
            mid = (lo + hi) / 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _decide(self, off):
        p = self.profile
        n = len(p["fwd"])
        self.fractions = {}
        if n == 0:  # no layers: groups of bytes; offload them all, as "all" does
            self.decisions = {g: "host" for g in p["bytes"]}
            self.prediction = {"step_seconds": p["step_seconds"], "memory_saved": sum(p["bytes"].values())}
            return
        base, _ = self.simulate({}, off.prefetch_layers, off.copy_window, None, getattr(off, "inflight_bytes", None))
        budget = p["step_seconds"] * self.max_overhead
        host_left = off.host_bytes
        ssd_ok = off.dir is not None and "ssd_write" in p["bandwidth"]
        decisions, fractions = {}, {}
        # Layer by layer from the first (the most compute after it to hide its copy behind): the
        # largest part of it the host tier takes within the budget, else the disk. A part, not
        # only the whole layer: where a layer's bytes take longer on PCIe than its compute (h2048:
        # ~1 GiB a layer, 20 ms of copy against ~3.5 ms of forward), whole layers never fit and
        # everything stayed, though a fifth of each would have moved for free.
        min_part = max(self.min_part_bytes, 1)
        for i in range(n):
            size = p["bytes"].get(i, 0)
            if size == 0:
                continue
            for tier in ("host", "ssd"):
                if tier == "host":
                    cap = host_left / size
                elif not ssd_ok:
                    continue
                else:
                    cap = 1.0
                if cap < 1.0 and cap * size < min_part:
                    continue
                f = self._largest_fraction(decisions, fractions, i, tier, cap, base, budget, off)
                if f <= 0.0 or (f < 1.0 and f * size < min_part):  # a whole layer, or a part worth a copy
                    continue
                decisions[i] = tier
                if f < 1.0:
                    fractions[i] = f
                if tier == "host":
                    host_left -= f * size
                break
        if self.recompute:
            rest = [i for i in range(n) if i not in decisions and p["bytes"].get(i, 0) > 0]
            rest.sort(key=lambda i: p["bytes"][i] / max(p["fwd"][i], 1e-9), reverse=True)
            for i in rest:
                trial = dict(decisions)
                trial[i] = "recompute"
                t, _ = self.simulate(trial, off.prefetch_layers, off.copy_window, fractions,
                                     getattr(off, "inflight_bytes", None))
                if t - base <= budget:
                    decisions = trial
        self.decisions = {i: decisions.get(i, "keep") for i in range(n)}
        self.fractions = fractions
        t, stall = self.simulate(decisions, off.prefetch_layers, off.copy_window, fractions,
                                 getattr(off, "inflight_bytes", None))
        self.prediction = {"step_seconds": p["step_seconds"] + (t - base),
                           "memory_saved": int(sum(p["bytes"].get(i, 0) * (fractions.get(i, 1.0)
                                                                          if d != "recompute" else 1.0)
                                                   for i, d in decisions.items())),
                           "peak_saved": int(self._last_peak_saved),
                           "stall_seconds": stall,
                           "fractions": dict(fractions)}
