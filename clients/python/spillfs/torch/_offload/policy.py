"""Which layers go where: ``"all"``, ``"none"``, the adaptive policy and the mixed one
(:class:`MixedPolicy`: keep, offload or recompute per layer under a budget, on the adaptive
policy's model; its docstring says how it profiles and chooses).

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

__all__ = ["make_policy", "Policy", "AdaptivePolicy", "MixedPolicy", "IoClock", "pinned_copy_seconds"]

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


class IoClock:
    """Bytes and busy seconds (the union of the requests' intervals) of file requests, per kind
    (``"ssd_write"``, ``"ssd_read"``): the policies' measured bandwidths, the step's disk time."""

    def __init__(self):
        self.kinds = {}  # kind -> (bytes, busy seconds, end of the latest request)

    def observe(self, kind, nbytes, submitted, seconds):
        if submitted is None or not seconds:
            return
        total, busy, last_end = self.kinds.get(kind, (0, 0.0, 0.0))
        end = submitted + seconds
        busy += end - max(submitted, last_end) if end > last_end else 0.0  # union of the intervals
        self.kinds[kind] = (total + nbytes, busy, max(end, last_end))

    def busy_seconds(self):
        """Seconds the disk was busy (writes and reads: a disk serves them in turn)."""
        return sum(busy for _, busy, _ in self.kinds.values())


class Policy:
    """``"all"`` (every layer to the host tier, then files) or ``"none"`` (keep)."""

    def __init__(self, name):
        if name not in ("all", "none"):
            raise ValueError(f"policy must be 'adaptive', 'all', 'none', an AdaptivePolicy or a MixedPolicy, "
                             f"not {name!r}")
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

    def selective_layers(self):
        """Indices of the layers to run under selective checkpointing this step."""
        return ()

    def saves_tensors(self):
        """Whether this step needs the saved-tensor hooks: ``"none"`` keeps every tensor where it is, so its
        steps run without them (no Python per saved tensor)."""
        return self.name != "none"

    def hooked_layers(self):
        """The layers whose saved tensors pass through the hooks this step (None: every tensor of the step)."""
        return None

    def wants_timing(self):
        """Whether this step's layers are timed (CUDA events at their boundaries: the profile)."""
        return False

    def wants_memory(self):
        """Whether this step samples the allocator's peak per phase (resets CUDA's peak statistics)."""
        return False

    def wants_step_peak(self):
        """Whether this step measures the allocator's peak over the step (``report.measured["peak_bytes"]``;
        resets CUDA's peak statistics as the step begins)."""
        return False


def make_policy(policy):
    if isinstance(policy, (Policy, AdaptivePolicy)):  # MixedPolicy is an AdaptivePolicy
        return policy
    if policy == "adaptive":
        return AdaptivePolicy()
    if isinstance(policy, str):
        return Policy(policy)
    raise TypeError(f"policy must be a str or an AdaptivePolicy, not {type(policy).__name__}")


def _largest_part(fits, cap):
    """The largest part in [0, `cap`] of a layer for which `fits(part)` holds, by bisection (the
    modelled step grows with the part moved); 0 where none does."""
    if fits(cap):
        return cap
    lo, hi = 0.0, cap
    for _ in range(12):
        mid = (lo + hi) / 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


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
        self._last_peak_saved_by_layer = {}
        self._last_input_gone = {}
        self._io = IoClock()
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
        self._io = IoClock()

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

    def selective_layers(self):
        """Indices of the layers to run under selective checkpointing this step (none: see MixedPolicy)."""
        return ()

    def saves_tensors(self):
        """Always: its profile and its quotas count each layer's saved bytes in the pack hook."""
        return True

    def hooked_layers(self):
        """None: every saved tensor passes through the hooks (its profile and quotas count them all)."""
        return None

    def wants_timing(self):
        """While profiling: the layers' times are its profile."""
        return self._profiling

    def wants_memory(self):
        return False

    def wants_step_peak(self):
        return False

    def observe_io(self, kind, nbytes, submitted, seconds):
        self._io.observe(kind, nbytes, submitted, seconds)

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
            self._refresh_bandwidth()

    def _refresh_bandwidth(self):
        """Bandwidths halfway to what this step's file requests measured."""
        bw = self.profile.setdefault("bandwidth", {})
        for kind, (total, busy, _) in self._io.kinds.items():
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

    def simulate(self, decisions, prefetch_layers, copy_window=1, fractions=None, inflight_bytes=None,
                 input_tiers=None):
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
        layer, not forwarded then, is read back when backward begins.
        `input_tiers` (layer -> "host"/"ssd"): the input of a recomputed layer
        (``profile["inputs"]``: the checkpoint saves it as the layer begins)
        goes to that tier, its copy from the layer's start; backward reads it
        back as it reads a layer."""
        p = self.profile
        fwd, bwd, nbytes, bw = p["fwd"], p["bwd"], p["bytes"], p["bandwidth"]
        fractions = fractions or {}
        n = len(fwd)
        moved = {i: nbytes.get(i, 0) * fractions.get(i, 1.0) for i in range(n)}
        tiers = {i: d for i, d in decisions.items() if d in ("host", "ssd")}
        for i, tier in (input_tiers or {}).items():
            if decisions.get(i) == "recompute":
                tiers[i] = tier
                moved[i] = p.get("inputs", {}).get(i, 0)
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
            tier = tiers.get(i)
            if tier is None:
                continue
            key = "host_write" if tier == "host" else "ssd"
            rate = bw.get(tier + "_write") or 1.0
            if decisions.get(i) == "recompute":  # its input, saved as it begins
                start = max(begin, free[key])
                free[key] = start + moved[i] / rate
                if tight and tier == "host":
                    host_copies.append((moved[i], start, free[key]))
            elif tight and tier == "host":
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
        gone = {}
        self._last_input_gone = {}
        for i in range(n):
            d, tier = decisions.get(i, "keep"), tiers.get(i)
            out = (tier == "host" and (tight or i <= n - 1 - copy_window)) or (tier == "ssd" and written[i] <= t)
            if d == "recompute":
                gone[i] = nbytes.get(i, 0)
                if out:
                    self._last_input_gone[i] = moved[i]
            elif out:
                gone[i] = moved[i]
        self._last_peak_saved_by_layer = gone
        self._last_peak_saved = sum(gone.values())
        read_free = {"host": t, "ssd": max(t, free["ssd"])}
        ready, issued, stall = {}, set(), 0.0
        for j in range(n - 1, -1, -1):
            for i in range(j, max(j - prefetch_layers, 0) - 1, -1):
                if i in issued or i not in tiers:
                    continue
                issued.add(i)
                tier = tiers[i]
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
        return _largest_part(fits, min(cap, 1.0))

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


class MixedPolicy(AdaptivePolicy):
    r"""Chooses per layer keep, offload (host tier, files), recompute or recompute selectively,
    under a memory budget or an overhead budget, from a profile of the first steps.

    Recomputing a layer (non-reentrant :func:`torch.utils.checkpoint.checkpoint` around its
    forward) costs about one more forward of it and frees all it saves but its input;
    offloading a part of it costs the hooks' Python per saved tensor and whatever of the copy
    its compute cannot hide. Layers whose copies cannot hide (a Llama layer at hidden 2048
    saves ~1 GiB, ~20 ms on PCIe against ~3.5 ms of forward) are cheaper recomputed, so the
    cheapest mix under a budget is usually some layers recomputed, parts of others offloaded
    where their copies hide, the rest kept: the frontier of memory against step time this
    policy walks. Selective recomputation
    (:func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`: the outputs of matrix
    products and attention kept, norms, activations, rotary embeddings and
    casts recomputed) frees much of a transformer layer (its elementwise ops' outputs, the
    float32 copies of its norms) for a small part of its forward: the frontier's cheap end.

    Train without a KV cache (``use_cache=False`` in a `transformers` config, as its own
    gradient checkpointing sets): a cache the forward updates changes what a recomputation runs
    (selective checkpointing then raises).

    Profile (``profile_steps``, 5 where the layers run on CUDA, 3 on the CPU), keeping everything: the first steps
    run with the saved-tensor hooks (each layer's bytes and saved tensors; the first on CUDA
    is warm-up), the next (2 from 5 profile steps, else 1) without them, timed (each layer's
    forward and backward, CUDA events on the compute stream, and the step: their means; its
    input's bytes; on CUDA the allocator's peak of each phase: forward with the head, then
    each layer's backward, which resets CUDA's peak statistics in those steps), and the last
    (from 3 profile steps, where torch has it) with every layer under selective checkpointing,
    timed likewise: its step's time over keep's, shared among the layers as their measured
    times grew, is their cost; the drop of forward's peak, shared as their bytes, what they
    free (none where the allocator has no figures: on the CPU it is never chosen). The hooks'
    cost per saved tensor is the last hooked step's time less the timed steps', over the
    tensors saved. Then the tiers' bandwidths are probed as
    :class:`AdaptivePolicy` does.

    The model: a step is the measured keep step (timed, no hooks), plus what
    :meth:`AdaptivePolicy.simulate` adds for the copies and the recomputed forwards, plus the
    selectively recomputed layers' measured cost, plus the hooks' cost of every tensor saved
    in an offloaded layer (the hooks are installed around those layers' forwards only: kept
    and recomputed layers save at no cost per tensor). The peak is the largest of its phases'
    measured peaks, less what the plan frees in each: at the head, the offloaded parts whose
    copies the window forced out, what selective recomputation frees and, of each recomputed
    layer, its bytes but its input; in layer j's backward, those of the layers below j but the
    ones read ahead (``prefetch_layers``). On the CPU (no allocator figures) the phases are
    estimated from the layers' bytes.

    A recomputed layer's input, which the checkpoint keeps (it saves it as the layer begins,
    through the offloader's hooks, which the checkpoint's own replace inside the layer), may
    go to the host tier too: a copy of one tensor from the layer's start, read back before the
    layer's backward recomputes it (files only where that hides).

    After the plan's second step (``calibration_step``; the first allocates the host tier),
    which measures the allocator's peak over the step too (with a memory budget, where the
    allocator has figures), the model is calibrated: where the measured step exceeds the
    prediction by over 2% of the keep step (or at all, past an overhead budget alone), the
    excess becomes a cost per tensor stored (the profile measured the hooks keeping, not
    storing) or, where nothing was stored, per tensor a recomputed layer saves, or else the
    selective recomputation's cost (every layer's, by what the chosen ones measured); the
    measured peak over the predicted one, where above 1, becomes a margin the plans keep below
    the memory budget (``peak_scale``: the peak model can be a few percent low). Where a cost
    changed or the measured peak passed the budget, the plan is chosen again, and its second
    step checked likewise, ``max_replans`` times at most: a plan that measures over its budget
    backs off (``prediction["calibrated_from"]``, ``prediction["replans"]``).

    The choice, greedy on that model from keeping everything: with `memory_budget`, the move
    (a layer recomputed, or selectively, a larger part of it offloaded, a recomputed layer's
    input offloaded) with the least added step time per byte of excess removed, until the
    peak fits; then moves undone while it still fits and the
    step gets shorter; a plan that recomputes layers and offloads some of their inputs, and no
    more, gives the inputs back (plain checkpointing, no hooks at all: the offloader's own
    overhead is not in the model) where that is not slower in the model and its peak misses the
    budget by at most ``peak_tolerance`` of keep's. With `overhead_budget` only, the move with the most bytes freed per
    second added while the step stays within it. Files are used only for the part of a layer
    whose write and read the model hides (within 1% of the layer's compute): a disk slower than
    the compute would otherwise set the step's pace (files only at hidden 2048: 37x the keep
    step); ``prediction["files"]`` says where and why they were refused.

    Args:
        memory_budget (int or float, optional): the activation peak to stay under: bytes above
            what is allocated when the step begins (as ``torch.cuda.max_memory_allocated``
            counts), or, as a float in (0, 1], a fraction of keep's peak (measured in the profile).
        overhead_budget (float, optional): step time allowed above the keep step (0.03: 3%).
            With `memory_budget` too, the plan that fits the memory is kept and a warning says
            when it passes this. Neither given: ``overhead_budget=0.03``.
        profile_steps (int, optional): at least 2 (5 on CUDA, 3 on the CPU by default; from 3,
            the last profiles selective checkpointing).
        probe_bytes (int, optional): bytes of each bandwidth probe (as :class:`AdaptivePolicy`).
        selective (bool): whether selective recomputation is profiled and may be chosen (True).

    Attributes:
        decisions (dict): layer index -> ``"keep"``, ``"host"``, ``"ssd"``, ``"recompute"`` or
            ``"selective"``.
        fractions (dict): layer index -> the part of its bytes offloaded (1 where absent).
        input_tiers (dict): recomputed layer index -> ``"host"`` or ``"ssd"``, where its input
            (which the checkpoint saves as the layer begins, through the offloader's hooks) is
            offloaded too.
        plan (list): per layer, a dict: ``layer``, ``decision``, ``fraction``, ``bytes``,
            ``input_to`` (a recomputed layer's input's tier, or None), ``input_bytes``,
            ``saves`` (tensors saved), ``fwd_seconds``, ``bwd_seconds``, ``freed_at_peak``
            (bytes gone at the head), ``added_seconds`` (the modelled step with this layer's
            choice against the same plan with the layer kept).
        profile (dict): as :class:`AdaptivePolicy`'s, plus ``saves`` and ``regions`` (per
            layer), ``inputs`` (bytes of each layer's input), ``hook_seconds_per_save``,
            ``store_seconds_per_tensor`` and ``recompute_seconds_per_save`` (0 until calibrated),
            ``selective`` (``seconds``: per layer, ``freed``: layer -> bytes; None unprofiled),
            ``hooked_step_seconds`` and ``memory`` (``head``: the peak of forward and the head,
            ``backward``: layer -> the peak of its backward; ``measured``: whether from the
            allocator).
        prediction (dict): ``step_seconds``, ``keep_step_seconds``, ``peak_bytes``,
            ``keep_peak_bytes``, ``memory_saved``, ``hook_seconds``, ``recompute_seconds``,
            ``selective_seconds``, ``stall_seconds``, ``budget`` (``"memory"`` or ``"overhead"``),
            ``memory_budget`` (bytes), ``overhead_budget``, ``budget_met``, ``files``,
            ``fractions``, ``input_tiers``, ``peak_scale``, ``replans`` (plans chosen again after
            the calibration step), ``calibrated_from`` (once calibrated: the checked step's
            ``measured_seconds``, ``residual_seconds`` and, where measured, ``measured_peak_bytes``).
        peak_scale (float): the measured peak over the predicted one, where above 1 (calibration):
            the plans keep the memory budget over it.

    Raises:
        ValueError: a budget out of range, fewer than 2 profile steps; at the first step,
            an offloader without layers.

    Example::

        >>> policy = spillfs.torch.MixedPolicy(memory_budget=0.5)    # half of keep's peak
        >>> offload = spillfs.torch.offload_activations(None, host_bytes=16 << 30,
        ...                                             layers=model.model.layers, policy=policy)
        >>> for step, batch in enumerate(batches):
        ...     with offload:
        ...         model(**batch).loss.backward()
        >>> offload.report.plan, offload.report.predicted, offload.report.measured
    """

    name = "mixed"
    # a copy "hides" where it adds at most this part of its layer's compute to the modelled step
    hide_tolerance = 0.01
    # parts of a layer the search tries for the host tier (with the part that hides)
    host_fractions = (0.25, 0.5, 0.75, 1.0)
    # the planned step after which the model is calibrated (:meth:`_calibrate`; 0: never)
    calibration_step = 2
    # plans chosen again after the calibration step at most (each checked by its calibration_step-th step)
    max_replans = 3
    # peaks this part of keep's apart are the same to the model (plain checkpointing's budget)
    peak_tolerance = 0.002

    def __init__(self, memory_budget=None, overhead_budget=None, profile_steps=None, probe_bytes=None,
                 selective=True):
        if memory_budget is not None and not memory_budget > 0:
            raise ValueError(f"memory_budget must be a number of bytes or a fraction of keep's peak in (0, 1], "
                             f"not {memory_budget!r}")
        if overhead_budget is not None and overhead_budget < 0:
            raise ValueError(f"overhead_budget must be >= 0, not {overhead_budget!r}")
        if profile_steps is not None and profile_steps < 2:
            raise ValueError(f"profile_steps must be >= 2 (one with the hooks, one timed), not {profile_steps!r}")
        if memory_budget is None and overhead_budget is None:
            overhead_budget = 0.03
        super().__init__(profile_steps=profile_steps, max_overhead=overhead_budget or 0.0, probe_bytes=probe_bytes,
                         recompute=True)
        self.memory_budget = memory_budget
        self.overhead_budget = overhead_budget
        self.selective = bool(selective)
        self.plan = []
        self.input_tiers = {}
        self._planned_steps = 0
        self._timing = False
        self._kind = None
        self._layer_count = 0
        self._hooked_profile = {}
        self._timed_samples = []  # (fwd, bwd, head, step seconds, memory phases, inputs) of the timed steps
        self._selective_sample = None  # (fwd, bwd, head, step seconds, memory phases) of the selective step
        self.peak_scale = 1.0  # measured peak over predicted, where above 1 (calibration): the plans' margin
        self._check_step = self.calibration_step or None  # the planned step checked next against its prediction
        self._replans = 0
        self._limit = None  # the step the overhead budget allows (seconds; None: no overhead budget)

    # -- the offloader's calls -------------------------------------------------

    def _step_kind(self, index):
        """What profile step `index` is: ``"hooked"`` (the saved-tensor hooks on every layer,
        keeping), ``"timed"`` (no saved-tensor hooks, timed: keep's time and memory) or
        ``"selective"`` (every layer under selective checkpointing, timed: what that frees and
        costs); None past the profile."""
        if index >= self.profile_steps:
            return None
        from .layers import selective_available
        selective = 1 if self.selective and self.profile_steps >= 3 and selective_available() else 0
        timed = 2 if self.profile_steps - selective >= 4 else 1  # the keep step: what predictions add to
        hooked = self.profile_steps - selective - timed
        return "hooked" if index < hooked else "timed" if index < hooked + timed else "selective"

    def begin_step(self, off, report):
        if not off.layers:
            raise ValueError("MixedPolicy decides per layer: give offload_activations the model or its layers "
                             "(layers=model.model.layers)")
        if self.profile_steps is None:  # by where the layers run, not what the machine has
            self.profile_steps = 5 if off._on_cuda() else 3
        self._kind = self._step_kind(self._steps)
        self._profiling = self._kind is not None
        self._timing = self._kind in ("timed", "selective")
        report.policy = f"mixed:profile:{self._kind}" if self._profiling else "mixed"
        if not self._profiling:
            report.predicted = dict(self.prediction)
            report.decisions.update(self.decisions)
            report.plan = [dict(row) for row in self.plan]
            report.measured["baseline_seconds"] = self.profile.get("step_seconds")
        self._io = IoClock()
        self._layer_count = len(off.layers)

    def decide(self, group):
        if self._profiling or not isinstance(group, int) or group < 0:
            return "keep"
        d = self.decisions.get(group, "keep")
        if d == "recompute":  # what its hooks see is the input the checkpoint saves
            return self.input_tiers.get(group, "keep")
        return "keep" if d == "selective" else d

    def saves_tensors(self):
        """Not in the timed profile steps (keep's time); else for the hooked layers (or all, profiling)."""
        return not self._timing

    def hooked_layers(self):
        """While profiling every layer; then the offloaded ones and the recomputed ones whose input is
        offloaded (the checkpoint saves the input through the hooks, before its own take over)."""
        if self._profiling:
            return None
        return frozenset(i for i, d in self.decisions.items() if d in ("host", "ssd") or i in self.input_tiers)

    def selective_layers(self):
        if self._profiling:
            return tuple(range(self._layer_count)) if self._kind == "selective" else ()
        return tuple(i for i, d in self.decisions.items() if d == "selective")

    def wants_timing(self):
        return self._timing

    def wants_memory(self):
        return self._timing

    def wants_step_peak(self):
        """The planned steps checked against the prediction (:meth:`_calibrate`), with a memory budget."""
        return (not self._profiling and self.memory_budget is not None
                and self._planned_steps + 1 == self._check_step)

    @property
    def settled(self):
        """Whether the profile is done and no planned step is to be checked any more (the plan stays)."""
        return self.profile_steps is not None and self._steps >= self.profile_steps and self._check_step is None

    def end_step(self, off, report, marks, seconds):
        self._steps += 1
        if not self._profiling:
            self._refresh_bandwidth()
            self._planned_steps += 1
            if self._planned_steps == self._check_step:
                replanned = self._calibrate(off, report, seconds)
                # a new plan is checked as the first was, by its `calibration_step`-th step
                self._check_step = (self._planned_steps + self.calibration_step
                                    if replanned and self._replans < self.max_replans else None)
            return
        n = len(off.layers)
        if self._kind == "hooked":  # bytes, tensors per layer, and its time
            self._hooked_profile = {"bytes": dict(report.layer_bytes), "saves": dict(report.layer_saves),
                                    "regions": dict(report.layer_regions), "packed": report.packed_count,
                                    "step_seconds": seconds}
        elif self._kind == "timed":
            self._timed_samples.append((*self._layer_times(marks, n), seconds, list(report.memory_phases),
                                        dict(report.layer_input_bytes)))
        else:
            self._selective_sample = (*self._layer_times(marks, n), seconds, list(report.memory_phases))
        if self._steps == self.profile_steps:
            self._build_profile(off, n)
            self._decide(off)

    def _build_profile(self, off, n):
        samples, self._timed_samples = self._timed_samples, []
        k = len(samples)
        fwd = [sum(s[0][i] for s in samples) / k for i in range(n)]
        bwd = [sum(s[1][i] for s in samples) / k for i in range(n)]
        head = sum(s[2] for s in samples) / k
        seconds = sum(s[3] for s in samples) / k
        phases, inputs = samples[-1][4], samples[-1][5]
        hooked = self._hooked_profile
        nbytes = dict(hooked.get("bytes", {}))
        per_save = max(0.0, hooked.get("step_seconds", seconds) - seconds) / max(hooked.get("packed", 0), 1)
        memory = self._memory_profile(phases, n, nbytes)
        self.profile = {"fwd": fwd, "bwd": bwd, "head": head, "bytes": nbytes,
                        "saves": dict(hooked.get("saves", {})), "regions": dict(hooked.get("regions", {})),
                        "inputs": inputs, "store_seconds_per_tensor": 0.0, "recompute_seconds_per_save": 0.0,
                        "step_seconds": seconds, "hooked_step_seconds": hooked.get("step_seconds"),
                        "hook_seconds_per_save": per_save, "memory": memory,
                        "selective": self._selective_profile(fwd, bwd, seconds, memory, nbytes, n),
                        "bandwidth": dict(self.profile.get("bandwidth", {}))}
        self.profile["bandwidth"].update(self._probe(off))

    def _selective_profile(self, fwd, bwd, seconds, memory, nbytes, n):
        """What selective checkpointing frees and costs per layer (None where it was not profiled):
        the cost, the step's time over keep's, shared among the layers as their own measured times
        grew; the bytes, the drop of forward's peak with the head (measured where the allocator's
        figures are, else none), shared as the layers' bytes."""
        sample, self._selective_sample = self._selective_sample, None
        if sample is None:
            return None
        s_fwd, s_bwd, _, s_seconds, s_phases = sample
        extra = max(0.0, s_seconds - seconds)
        grew = [max(0.0, s_fwd[i] + s_bwd[i] - fwd[i] - bwd[i]) for i in range(n)]
        total_grew = sum(grew)
        cost = [extra * (g / total_grew if total_grew > 0 else 1.0 / n) for g in grew]
        freed_total = 0
        if memory["measured"] and len(s_phases) == n + 1:
            freed_total = max(0, memory["head"] - s_phases[0][1])
        layer_total = sum(nbytes.get(i, 0) for i in range(n)) or 1
        freed = {i: int(freed_total * nbytes.get(i, 0) / layer_total) for i in range(n)}
        return {"seconds": cost, "freed": freed, "step_seconds": s_seconds}

    def _calibrate(self, off, report, seconds):
        """After a checked planned step (the ``calibration_step``-th of a plan: its first allocates
        the host tier's slabs): what the measured step exceeds the prediction
        by, where over 2% of the keep step (or at all, past an overhead budget alone: the plan must
        back off), is the offloader's cost per tensor stored (its copies, events and reads: the
        profile measured the hooks only keeping), or, where nothing was stored, the checkpoint's per
        tensor a recomputed layer saves, or else the selectively recomputed layers' cost (every
        layer's, by the ratio the chosen ones measured: one profiled step measured them all); the
        measured peak (``report.measured["peak_bytes"]``, where there is one) over the predicted one
        raises ``peak_scale``. Where a cost changed or the peak passed the memory budget, the plan is
        chosen again with them. Returns whether it was."""
        p = self.profile
        predicted = self.prediction
        keep_seconds = predicted.get("keep_step_seconds", p["step_seconds"])
        residual = seconds - predicted.get("step_seconds", seconds)
        calibrated = {"measured_seconds": seconds, "residual_seconds": residual}
        over_limit = (self.memory_budget is None and self._limit is not None and seconds > self._limit
                      and residual > 0.005 * keep_seconds)
        replan = False
        if residual > 0.02 * keep_seconds or over_limit:
            stored = report.host_count + report.ssd_count
            recomputed = sum(p["saves"].get(i, 0) for i, d in self.decisions.items() if d == "recompute")
            selective = [i for i, d in self.decisions.items() if d == "selective"]
            replan = True
            if stored:
                p["store_seconds_per_tensor"] = p.get("store_seconds_per_tensor", 0.0) + residual / stored
            elif recomputed:
                p["recompute_seconds_per_save"] = p.get("recompute_seconds_per_save", 0.0) + residual / recomputed
            elif selective and p.get("selective"):  # its one profiled step said less than it costs
                costs = p["selective"]["seconds"]
                chosen = sum(costs[i] for i in selective)
                if chosen > 0:  # every layer's share of that step by what the chosen ones measured
                    p["selective"]["seconds"] = [c * (chosen + residual) / chosen for c in costs]
                else:
                    for i in selective:
                        costs[i] += residual / len(selective)
            else:
                replan = False
        peak = getattr(report, "measured", {}).get("peak_bytes")
        if peak is not None and predicted.get("peak_bytes"):
            calibrated["measured_peak_bytes"] = int(peak)
            self.peak_scale = max(self.peak_scale, peak / predicted["peak_bytes"])
            budget = predicted.get("memory_budget")
            replan = replan or (budget is not None and peak > budget)
        if replan:
            self._replans += 1
            self._decide(off)
        self.prediction["calibrated_from"] = calibrated
        self.prediction["replans"] = self._replans
        return replan

    @staticmethod
    def _memory_profile(phases, n, nbytes):
        """The peak of forward with the head, and of each layer's backward (bytes above the step's
        start), from the allocator's samples; estimated from the layers' bytes where there are none."""
        if len(phases) == n + 1:
            return {"head": phases[0][1], "backward": {n - k: phases[k][1] for k in range(1, n + 1)},
                    "measured": True}
        layer = [nbytes.get(i, 0) for i in range(n)]
        below = [sum(layer[:j + 1]) for j in range(n)]
        return {"head": sum(v for k, v in nbytes.items() if k != "head"), "backward": dict(enumerate(below)),
                "measured": False}

    # -- the model -------------------------------------------------------------

    def _evaluate(self, plan, off):
        """(step seconds, peak bytes, peak per phase, stall seconds, bytes gone at the head per layer)
        of `plan` (a :class:`_Plan`)."""
        p = self.profile
        n = len(p["fwd"])
        inflight = getattr(off, "inflight_bytes", None)
        t, stall = self.simulate(plan.decisions, off.prefetch_layers, off.copy_window, plan.fractions, inflight,
                                 plan.inputs)
        gone = dict(self._last_peak_saved_by_layer)
        inputs, nbytes = p.get("inputs", {}), p["bytes"]
        selective = p.get("selective") or {"seconds": [0.0] * n, "freed": {}}
        for i, d in plan.decisions.items():
            if d == "recompute":  # its input stays (the checkpoint saves it), unless offloaded
                gone[i] = max(0, nbytes.get(i, 0) - inputs.get(i, 0)) + self._last_input_gone.get(i, 0)
            elif d == "selective":
                gone[i] = selective["freed"].get(i, 0)
        hooked = plan.hooked()
        if hooked and (getattr(off, "inflight_bytes", None) is not None
                       or getattr(off, "read_ahead_bytes", None) is not None):
            saves = sum(p["saves"].values())  # the memory-tight options hook every layer
        else:  # a recomputed layer's hooks see its input alone (the checkpoint's own take the rest)
            saves = sum(self._input_saves() if i in plan.inputs else p["saves"].get(i, 0) for i in hooked)
        step = (p["step_seconds"] + (t - self._t_keep) + saves * p["hook_seconds_per_save"]
                + plan.stored_tensors(p) * p.get("store_seconds_per_tensor", 0.0)
                + sum(p["saves"].get(i, 0) for i, d in plan.decisions.items() if d == "recompute")
                * p.get("recompute_seconds_per_save", 0.0)
                + sum(selective["seconds"][i] for i, d in plan.decisions.items() if d == "selective"))
        mem = p["memory"]
        phases = [mem["head"] - sum(gone.values())]
        pre = off.prefetch_layers
        for j in range(n):
            freed = 0  # of the layers below j: recomputed ones hold their inputs, offloaded ones are out
            for i in range(j):  # but the `prefetch_layers` below j, read back while j's backward runs
                d = plan.decisions.get(i, "keep")
                if d == "recompute":
                    freed += max(0, nbytes.get(i, 0) - inputs.get(i, 0))
                    if i in plan.inputs and i < j - pre:
                        freed += inputs.get(i, 0)
                elif d == "selective":
                    freed += selective["freed"].get(i, 0)
                elif d in ("host", "ssd") and i < j - pre:
                    freed += nbytes.get(i, 0) * plan.fractions.get(i, 1.0)
            extra = inputs.get(j, 0) if plan.decisions.get(j) == "recompute" else 0
            phases.append(mem["backward"].get(j, 0) - freed + extra)
        return step, max(phases), phases, stall, gone

    @staticmethod
    def _input_saves():
        """Tensors a recomputed layer saves through its hooks (its input, as the checkpoint begins)."""
        from .layers import checkpoint_input_saves
        return checkpoint_input_saves()

    def _hides(self, plan, i, off):
        """Whether `plan`'s copies of layer i alone (the rest kept) add at most ``hide_tolerance`` of
        its compute to the modelled step."""
        p = self.profile
        alone = _Plan({i: plan.decisions[i]}, {i: plan.fractions[i]} if i in plan.fractions else {},
                      {i: plan.inputs[i]} if i in plan.inputs else {})
        t, _ = self.simulate(alone.decisions, off.prefetch_layers, off.copy_window, alone.fractions,
                             getattr(off, "inflight_bytes", None), alone.inputs)
        t_base, _ = self.simulate({i: "recompute"} if i in plan.inputs else {}, off.prefetch_layers,
                                  off.copy_window, None, getattr(off, "inflight_bytes", None))
        return t - t_base <= self.hide_tolerance * (p["fwd"][i] + p["bwd"][i])

    def _moves(self, plan, host_left, hide, off):
        """The plans one step from `plan`: a layer recomputed, a larger part of it offloaded, or a
        recomputed layer's input offloaded (host tier; files where the copy hides)."""
        p = self.profile
        min_part = max(self.min_part_bytes, 1)
        inputs = p.get("inputs", {})
        for i in range(len(p["fwd"])):
            size = p["bytes"].get(i, 0)
            if size == 0:
                continue
            d = plan.decisions.get(i, "keep")
            f = plan.fractions.get(i, 1.0) if d in ("host", "ssd") else 0.0
            if d != "recompute" and size > inputs.get(i, 0):
                yield plan.replace(i, "recompute")
            if d == "keep" and (p.get("selective") or {}).get("freed", {}).get(i, 0) > 0:
                yield plan.replace(i, "selective")
            if d in ("keep", "host"):
                room = (host_left + (f * size if d == "host" else 0.0)) / size
                for g in sorted({hide[i]["host"], *self.host_fractions}):
                    if f < g <= room and g * size >= min_part:
                        yield plan.replace(i, "host", g)
            if d == "keep" and hide[i].get("ssd", 0.0) * size >= min_part:
                yield plan.replace(i, "ssd", hide[i]["ssd"])
            if d == "recompute" and i not in plan.inputs and inputs.get(i, 0) >= min_part:
                if inputs[i] <= host_left:
                    yield plan.replace(i, "recompute", input_tier="host")
                elif "ssd" in hide[i]:
                    moved = plan.replace(i, "recompute", input_tier="ssd")
                    if self._hides(moved, i, off):
                        yield moved

    def _decide(self, off):
        p = self.profile
        n = len(p["fwd"])
        inflight = getattr(off, "inflight_bytes", None)
        self._t_keep, _ = self.simulate({}, off.prefetch_layers, off.copy_window, None, inflight)
        keep = _Plan()
        keep_step, keep_peak, keep_phases, _, _ = self._evaluate(keep, off)
        ssd_ok = off.dir is not None and "ssd_write" in p["bandwidth"]
        hide = []
        for i in range(n):
            parts = {"host": self._hiding_fraction(i, "host", off) if off.host_bytes > 0 else 0.0}
            if ssd_ok:
                parts["ssd"] = self._hiding_fraction(i, "ssd", off)
            hide.append(parts)
        budget_bytes = self.memory_budget
        if isinstance(budget_bytes, float) and budget_bytes <= 1.0:
            budget_bytes = int(budget_bytes * keep_peak)
        limit = None if self.overhead_budget is None else keep_step * (1.0 + self.overhead_budget)
        self._limit = limit
        # the model's peak, `peak_scale` times, is what the steps measured: the plans keep that margin
        target = None if budget_bytes is None else budget_bytes / self.peak_scale

        def excess(phases):  # memory mode: bytes over the budget, every phase (the peak alone can stall)
            return sum(max(0.0, x - target) for x in phases)

        def memory_score(phases):  # overhead mode: the peak, the other phases as a tie-break
            return max(phases) + 1e-3 * sum(phases)

        plan, step, peak, phases = keep, keep_step, keep_peak, keep_phases
        while target is None or peak > target:
            best = None
            for move in self._moves(plan, off.host_bytes - plan.host_bytes(p), hide, off):
                s, pk, ph, _, _ = self._evaluate(move, off)
                if budget_bytes is not None:
                    gain = excess(phases) - excess(ph)
                    if gain <= 0:
                        continue
                    key = (s - step) / gain  # least time per byte of excess removed
                else:
                    gain = memory_score(phases) - memory_score(ph)
                    if gain <= 0 or s > limit:
                        continue
                    key = -gain / max(s - step, 1e-9)  # most bytes per second added
                if best is None or key < best[0]:
                    best = (key, move, s, pk, ph)
            if best is None:
                break
            _, plan, step, peak, phases = best
        if budget_bytes is not None:  # undo what the later moves made useless
            improved = True
            while improved:
                improved = False
                for i in sorted(plan.decisions):
                    for lighter in plan.lighter(i):
                        s, pk, ph, _, _ = self._evaluate(lighter, off)
                        if pk <= target and s < step:
                            plan, step, peak, phases = lighter, s, pk, ph
                            improved = True
                            break
            plan = self._plain_checkpoint(plan, step, target, keep_peak, off)
        self._finish_plan(plan, off, keep_step, keep_peak, budget_bytes, limit, hide, ssd_ok)

    def _plain_checkpoint(self, plan, step, target, keep_peak, off):
        """`plan`, or, where it recomputes layers, offloads some of their inputs and nothing else, the
        same layers under plain checkpointing (inputs kept: no hooks, none of the offloader's own
        overhead, which the model does not count) where that is not slower in the model and its peak
        passes `target` by at most ``peak_tolerance`` of keep's (at checkpointing's own memory)."""
        if not plan.inputs or any(d != "recompute" for d in plan.decisions.values()):
            return plan
        plain = _Plan(plan.decisions)
        s, pk, _, _, _ = self._evaluate(plain, off)
        return plain if s <= step and pk <= target + self.peak_tolerance * keep_peak else plan

    def _hiding_fraction(self, i, tier, off):
        """The largest part of layer i alone (the rest kept) whose copies to `tier` add at most
        ``hide_tolerance`` of its compute to the modelled step (0: none)."""
        return _largest_part(lambda f: self._hides(_Plan({i: tier}, {i: f}), i, off), 1.0)

    def _finish_plan(self, plan, off, keep_step, keep_peak, budget_bytes, limit, hide, ssd_ok):
        import warnings
        p = self.profile
        n = len(p["fwd"])
        step, peak, _, stall, gone = self._evaluate(plan, off)
        self.decisions = {i: plan.decisions.get(i, "keep") for i in range(n)}
        self.fractions = {i: f for i, f in plan.fractions.items() if f < 1.0}
        self.input_tiers = dict(plan.inputs)
        self.plan = []
        for i in range(n):
            d = self.decisions[i]
            without, _, _, _, _ = self._evaluate(plan.replace(i, "keep"), off)
            self.plan.append({"layer": i, "decision": d,
                              "fraction": plan.fractions.get(i, 1.0) if d in ("host", "ssd") else None,
                              "input_to": plan.inputs.get(i), "bytes": p["bytes"].get(i, 0),
                              "input_bytes": p.get("inputs", {}).get(i, 0), "saves": p["saves"].get(i, 0),
                              "fwd_seconds": p["fwd"][i], "bwd_seconds": p["bwd"][i],
                              "freed_at_peak": int(gone.get(i, 0)), "added_seconds": step - without})
        memory_met = budget_bytes is None or peak * self.peak_scale <= budget_bytes + self.peak_tolerance * keep_peak
        met = memory_met and (limit is None or step <= limit * (1 + 1e-9))
        files = None
        if ssd_ok:
            refused = [i for i in range(n) if hide[i]["ssd"] * p["bytes"].get(i, 0) < max(self.min_part_bytes, 1)]
            used = sorted(i for i in range(n) if "ssd" in (plan.decisions.get(i), plan.inputs.get(i)))
            files = {"used": used, "refused": refused}
            if refused:
                i = max(refused, key=lambda k: p["bytes"].get(k, 0))
                rate = p["bandwidth"].get("ssd_write", 0.0)
                files["why"] = (f"layer {i}'s {p['bytes'].get(i, 0) / _MiB:.0f} MiB take "
                                f"{p['bytes'].get(i, 0) / max(rate, 1.0) * 1e3:.1f} ms to write at "
                                f"{rate / 1e9:.2f} GB/s against {(p['fwd'][i] + p['bwd'][i]) * 1e3:.1f} ms of "
                                f"its compute: the disk would set the step's pace")
        hooked = plan.hooked()
        self.prediction = {
            "step_seconds": step, "keep_step_seconds": keep_step, "peak_bytes": int(peak),
            "keep_peak_bytes": int(keep_peak), "memory_saved": int(sum(gone.values())),
            "peak_saved": int(keep_peak - peak),
            "hook_seconds": sum(self._input_saves() if i in plan.inputs else p["saves"].get(i, 0) for i in hooked)
            * p["hook_seconds_per_save"],
            "recompute_seconds": sum(p["fwd"][i] for i, d in plan.decisions.items() if d == "recompute"),
            "selective_seconds": sum((p.get("selective") or {"seconds": [0.0] * n})["seconds"][i]
                                     for i, d in plan.decisions.items() if d == "selective"),
            "stall_seconds": stall, "budget": "memory" if budget_bytes is not None else "overhead",
            "memory_budget": budget_bytes, "overhead_budget": self.overhead_budget, "budget_met": met,
            "memory_measured": p["memory"]["measured"], "files": files, "fractions": dict(self.fractions),
            "input_tiers": dict(plan.inputs), "peak_scale": self.peak_scale, "replans": self._replans}
        if not met:
            what = (f"an activation peak of {budget_bytes / 2**30:.2f} GiB" if not memory_met
                    else f"a step within {self.overhead_budget:.1%} of keep's")
            warnings.warn(f"spillfs.torch.MixedPolicy: no plan reaches {what}; the closest found: peak "
                          f"{peak / 2**30:.2f} GiB (keep {keep_peak / 2**30:.2f}), step {step * 1e3:.1f} ms "
                          f"(keep {keep_step * 1e3:.1f})", RuntimeWarning, stacklevel=2)


class _Plan:
    """A mixed plan: `decisions` (layer -> "host", "ssd", "recompute" or "selective"; keep where absent),
    `fractions` (layer -> the part of an offloaded layer moved; 1 where absent) and `inputs`
    (recomputed layer -> the tier its input goes to). Immutable: moves make new ones."""

    __slots__ = ("decisions", "fractions", "inputs")

    def __init__(self, decisions=None, fractions=None, inputs=None):
        self.decisions, self.fractions, self.inputs = dict(decisions or {}), dict(fractions or {}), dict(inputs or {})

    def replace(self, i, decision, fraction=1.0, input_tier=None):
        """This plan with layer i's choice replaced ("keep": none)."""
        dec = {k: v for k, v in self.decisions.items() if k != i}
        frac = {k: v for k, v in self.fractions.items() if k != i}
        inp = {k: v for k, v in self.inputs.items() if k != i}
        if decision != "keep":
            dec[i] = decision
        if decision in ("host", "ssd") and fraction < 1.0:
            frac[i] = fraction
        if decision == "recompute" and input_tier is not None:
            inp[i] = input_tier
        return _Plan(dec, frac, inp)

    def lighter(self, i):
        """Plans with layer i's choice undone: its input kept (where offloaded), else the layer kept."""
        if i in self.inputs:
            yield self.replace(i, "recompute")
        yield self.replace(i, "keep")

    def hooked(self):
        """The layers whose saved tensors pass through the offloader's hooks."""
        return sorted(i for i, d in self.decisions.items() if d in ("host", "ssd") or i in self.inputs)

    def stored_tensors(self, profile):
        """About how many tensors the offloader stores under this plan: a layer's regions in
        proportion to the part of its bytes moved, and one input per recomputed layer offloaded."""
        regions = profile.get("regions", {})
        return (sum(regions.get(i, 0) * self.fractions.get(i, 1.0) for i, d in self.decisions.items()
                    if d in ("host", "ssd")) + len(self.inputs))

    def host_bytes(self, profile):
        """Bytes this plan puts in the host tier."""
        nbytes, inputs = profile["bytes"], profile.get("inputs", {})
        return (sum(nbytes.get(i, 0) * self.fractions.get(i, 1.0) for i, d in self.decisions.items() if d == "host")
                + sum(inputs.get(i, 0) for i, tier in self.inputs.items() if tier == "host"))
