#!/usr/bin/env python3
"""The ROK curve: activation memory against step time, for keep, recompute, save_on_cpu and spillfs.

    SPILLFS_BIN=.devrun/bin/spillfs SPILLFS_CLIENT_LIB=.devrun/lib/libspillfs_client.so \\
        python3 tools/bench/activation_bench.py --dir /root/actbench \\
        --json-out $OUT/activations.json --png-out $OUT/activations.png

A GPT-style decoder (pre-LN blocks, scaled_dot_product_attention, GELU MLP,
bf16, random weights) in the sizes of --sizes (default: the issue's reference
16 x 2048 at seq 2048 batch 8, a 4096 one, and an 8192 one; all fit one 80 GB
H100). For each size, one forward and backward per step (no optimizer: its
time is the same for every strategy), after --warmup steps, the median of
--steps steps, for:

* ``keep``: everything stays on the GPU;
* ``recompute``: ``torch.utils.checkpoint`` around every block (non-reentrant);
* ``save_on_cpu``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``;
* ``spillfs-ample``: spillfs.torch with the host tier large enough for all;
* ``spillfs-capped``: the host tier at --cap of the activation bytes, the
  rest to files on the SSD;
* ``spillfs-zero``: no host tier, files only;

each with ``policy="adaptive"`` (its profile steps are part of the warm-up)
and, with --all-policy, ``policy="all"`` too (SSD-heavy ones are slow: the
disk writes ~2 GB/s), and with --recompute ``AdaptivePolicy(recompute=True)``
(layers neither tier hides are recomputed instead of kept). With --tight, each
of those also memory-tight: ``-tight`` (``read_ahead_bytes=--tight-read-ahead``:
backward reads only what it freed) and ``-drain`` (``inflight_bytes=--drain-inflight``
and ``read_ahead_bytes=--drain-read-ahead``: forward's copies bounded and
drained before the head, the head's tensors offloaded but the last). Files go to a spillfs volume made and mounted under
--dir by this script (root, /dev/fuse, $SPILLFS_BIN or --spillfs), or straight
into --dir with --no-mount.

With --copy-bench, only the copy path instead (no model): layers that each
save the tensors one block of the size saves (dense ones and the q, k, v views
with gaps of a fused projection; fresh memory, no kernels but a GPU spin of
--copy-compute-ms per layer), keep against spillfs policy="all" with an ample
host tier; per compute time: the step, the extra time, the bytes moved and
the rate they moved at, beside raw pinned copies on a side stream (what the
copy engine can do). Compute 0 times pack and unpack alone; a compute at
least as long as a layer's copy should show no extra time (the overlap).

    python3 tools/bench/activation_bench.py --dir /tmp/ab --no-mount --copy-bench --sizes h8192

Per row: step ms, overhead against keep, peak GPU memory, the activation peak
(the peak above weights and gradients), its reduction against keep, where it is
(``fwd_peak_gib``: the peak by the time the loss is computed; ``at_backward_gib``:
what is allocated when backward begins; ``act_reserved_gib``: the allocator's
reserved peak above weights and gradients), and for spillfs the report of the
last step (bytes per tier, stalls, the policy's predicted and measured step)
and, from one more untimed step with ``diagnose`` (--no-diag: none), what the
offloader held on the device around the peak: originals in flight, forwarded,
read back and not yet used, used and not yet freed (``diagnosis``, in GiB). The first step of each strategy is checked
against keep's loss (bit for bit). Prints a table; writes JSON and a PNG of
activation peak against step time (matplotlib, when importable).
"""

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import spillfs.torch as st  # noqa: E402
from spillfs.torch._offload.policy import pinned_copy_seconds  # noqa: E402
from toy_gpt import GPT  # noqa: E402
from volume import Volume  # noqa: E402

GIB = 1 << 30

SIZES = {
    # name: layers, hidden, heads, seq, batch
    "h2048": (16, 2048, 16, 2048, 8),
    "h4096": (12, 4096, 32, 2048, 4),
    "h8192": (6, 8192, 64, 2048, 4),
    # 13.2 B params: 49 GiB of bf16 weights and gradients, ~8.5 GiB of activations (fits an 80 GB H100);
    # a layer's forward (~40 ms) about as long as its saved bytes take over PCIe (2.1 GiB at 54 GB/s)
    "h16384": (4, 16384, 128, 2048, 2),
    "tiny": (4, 256, 4, 128, 2),  # a smoke run (also on the CPU: --device cpu)
}


def _cuda(dev):
    return dev.type == "cuda"


def sync(dev):
    if _cuda(dev):
        torch.cuda.synchronize(dev)


def release_memory(dev):
    """Cached device and pinned host blocks back (save_on_cpu's pinned blocks stay cached otherwise)."""
    gc.collect()
    if _cuda(dev):
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()


def run_mode(model, idx, tgt, mode, args, offloader=None, where=None):
    """(median step seconds, peak bytes, activation peak bytes, first loss); `where` (a dict) gets
    the largest forward peak, allocation when backward begins and reserved peak (above the base)."""
    dev = idx.device
    marks = {}

    def step():
        if mode == "save_on_cpu":
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=_cuda(dev))
        elif offloader is not None:
            ctx = offloader
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))
            if _cuda(dev):  # host-side figures, no synchronization
                marks["fwd_peak"] = torch.cuda.max_memory_allocated(dev)
                marks["at_backward"] = torch.cuda.memory_allocated(dev)
            loss.backward()
        return loss.detach()

    model.recompute = mode == "recompute"
    first_loss = None
    times, peaks, act_peaks = [], [], []
    warmup = args.warmup + (3 if offloader is not None and offloader.policy.name == "adaptive" else 0)
    for i in range(warmup + args.steps):
        model.zero_grad(set_to_none=False)  # gradients stay allocated: the base below holds weights and grads
        gc.collect()
        sync(dev)
        base = torch.cuda.memory_allocated(dev) if _cuda(dev) else 0
        if _cuda(dev):
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        loss = step()
        sync(dev)
        dt = time.perf_counter() - t0
        if first_loss is None:
            first_loss = loss.item()
        if i >= warmup:
            times.append(dt)
            peak = torch.cuda.max_memory_allocated(dev) if _cuda(dev) else 0
            peaks.append(peak)
            act_peaks.append(peak - base)
            if where is not None and _cuda(dev):
                for key, value in (("fwd_peak_gib", marks["fwd_peak"] - base),
                                   ("at_backward_gib", marks["at_backward"] - base),
                                   ("act_reserved_gib", torch.cuda.max_memory_reserved(dev) - base)):
                    where[key] = max(where.get(key, 0.0), round(value / GIB, 3))
    model.recompute = False
    times.sort()
    return times[len(times) // 2], max(peaks), max(act_peaks), first_loss


def diagnose(model, idx, tgt, args, off):
    """One more step (untimed) with the offloader's diagnosis: what it held around the peak (GiB)."""
    dev = idx.device
    model.zero_grad(set_to_none=False)
    gc.collect()
    sync(dev)
    base = torch.cuda.memory_allocated(dev) if _cuda(dev) else 0
    if _cuda(dev):
        torch.cuda.reset_peak_memory_stats(dev)
    off.diagnose = True
    try:
        with off:
            logits = model(idx)
            F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1)).backward()
        sync(dev)
    finally:
        off.diagnose = False
    d = off.report.diagnosis

    def gib(state):
        if not state:
            return state
        out = {}
        for k, v in state.items():
            if k in ("at", "phase"):
                out[k] = v
            elif k == "allocated":
                out[k] = None if v is None else round((v - base) / GIB, 3)
            else:
                out[k] = round(v / GIB, 3)
        return out
    out = {"act_peak_gib": round(((torch.cuda.max_memory_allocated(dev) if _cuda(dev) else 0) - base) / GIB, 3),
           "forward_end": gib(d.get("forward_end")), "backward_start": gib(d.get("backward_start")),
           "peak_between": [gib(x) for x in d.get("peak_between") or []],
           "read_beyond_freed_peak_gib": round(off.report.read_beyond_freed_peak_bytes / GIB, 3),
           "inflight_peak_gib": round(off.report.inflight_peak_bytes / GIB, 3),
           "inflight_at_backward_gib": round(off.report.inflight_at_backward_bytes / GIB, 3)}
    return out


def _diag_line(d):
    def part(s):
        if not s:
            return "-"
        return (f"{s['at']}: alloc {s['allocated']} held {s['originals_held']} fwd {s['forwarded']} kept-entries "
                f"{s['kept_entries']} read-unused {s['read_back_unused']} used-unfreed {s['used_not_freed']} "
                f"credit {s['credit']}")
    lines = [f"    diag: act peak {d['act_peak_gib']} GiB; in flight at most {d['inflight_peak_gib']}, at backward "
             f"{d['inflight_at_backward_gib']}; reads beyond frees at most {d['read_beyond_freed_peak_gib']} (GiB)",
             f"    forward end   {part(d['forward_end'])}", f"    backward start {part(d['backward_start'])}"]
    for s in d["peak_between"]:
        lines.append(f"    around peak   {part(s)}")
    return "\n".join(lines)


class _Save(torch.autograd.Function):
    """Saves the given tensors for backward (as a block's ops would); returns x. Backward
    unpacks them (waiting for their loads), then spins the GPU twice as long as forward
    did (a backward's compute)."""

    @staticmethod
    def forward(ctx, x, spin, *saved):
        ctx.save_for_backward(*saved)
        ctx.spin = spin
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        if ctx.spin:
            torch.cuda._sleep(2 * ctx.spin)
        return (g, None) + (None,) * len(saved)


class CopyLayer(nn.Module):
    """Saves what one decoder block of hidden h saves (fresh, uninitialised memory), spins the
    GPU for `spin` cycles (the compute a layer would do), and returns x."""

    def __init__(self, b, t, h, heads, spin, gaps=True):
        super().__init__()
        self.shape, self.heads, self.spin, self.gaps = (b, t, h), heads, spin, gaps

    def forward(self, x):
        b, t, h = self.shape
        dtype = torch.bfloat16 if x.is_cuda else torch.float32
        new = lambda *s: torch.empty(*s, dtype=dtype, device=x.device)  # noqa: E731
        saved = [new(b, t, h), new(b, t, h)]  # the block's input, ln1's output
        if self.gaps:  # q, k, v of the fused projection: views with gaps (stored apart)
            qkv = new(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
            saved += [qkv[0], qkv[1], qkv[2]]
        else:
            saved += [new(b, self.heads, t, h // self.heads) for _ in range(3)]
        saved += [new(b, t, h), new(b, t, h), new(b, t, h), new(b, t, h)]  # attention out, proj in, x2, ln2 out
        saved += [new(b, t, 4 * h), new(b, t, 4 * h)]  # fc1 out, gelu out
        if self.spin:
            torch.cuda._sleep(self.spin)
        return _Save.apply(x, self.spin, *saved)


def _spin_cycles_per_ms(dev):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm
    a.record()
    torch.cuda._sleep(50_000_000)
    b.record()
    b.synchronize()
    return 50_000_000 / a.elapsed_time(b)


def raw_copy_rates(dev, nbytes):
    """Pinned copies of nbytes each way on a side stream (GB/s): the copy engine alone."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    s = torch.cuda.Stream(dev)
    d2h, h2d = pinned_copy_seconds(src, host, s)
    out = {"d2h_gbps": round(nbytes / d2h / 1e9, 2), "h2d_gbps": round(nbytes / h2d / 1e9, 2)}
    # both ways at once (forward's copies out overlapping backward's copies in, across layers)
    s2 = torch.cuda.Stream(dev)
    src2 = torch.empty_like(src)
    host2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    s.wait_stream(torch.cuda.current_stream(dev))
    s2.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        host.copy_(src, non_blocking=True)
    with torch.cuda.stream(s2):
        src2.copy_(host2, non_blocking=True)
    torch.cuda.current_stream(dev).wait_stream(s)
    torch.cuda.current_stream(dev).wait_stream(s2)
    b.record()
    b.synchronize()
    out["bidir_gbps"] = round(2 * nbytes / a.elapsed_time(b) / 1e6, 2)
    return out


def copy_bench(name, args, rows):
    """The copy path alone: see --copy-bench."""
    layers, h, heads, seq, batch = SIZES[name]
    dev = torch.device(args.device)
    n_layers = args.copy_layers or layers
    per_layer = 17 * batch * seq * h * 2
    cuda = _cuda(dev)
    raw = raw_copy_rates(dev, min(per_layer, 1 << 30)) if cuda else {}
    cyc = _spin_cycles_per_ms(dev) if cuda else 0.0
    print(f"\n== copy path, {name}: {n_layers} layers of {per_layer / GIB:.2f} GiB saved (b {batch}, t {seq}, "
          f"h {h}); raw pinned copies {raw}", flush=True)
    for compute_ms in [float(c) for c in args.copy_compute_ms.split(",")]:
        for gaps in (True, False):
            blocks = nn.ModuleList(CopyLayer(batch, seq, h, heads, int(compute_ms * cyc), gaps) for _ in range(n_layers))
            x = torch.zeros(8, 8, device=dev, requires_grad=True)
            result = {}
            for mode in ("keep", "spillfs-all"):
                off = None
                if mode != "keep":
                    off = st.offload_activations(None, host_bytes=int(n_layers * per_layer * 1.25), min_bytes=1 << 20,
                                                 prefetch_layers=args.prefetch_layers, policy="all", layers=list(blocks))
                times, fwd_times, peaks = [], [], []
                for i in range(args.warmup + args.steps):
                    sync(dev)
                    if cuda:
                        torch.cuda.reset_peak_memory_stats(dev)
                    base = torch.cuda.memory_allocated(dev) if cuda else 0
                    t0 = time.perf_counter()
                    with (off if off is not None else contextlib.nullcontext()):
                        y = x
                        for blk in blocks:
                            y = blk(y)
                        t_host_fwd = time.perf_counter() - t0
                        y.sum().backward()
                    sync(dev)
                    if i >= args.warmup:
                        times.append(time.perf_counter() - t0)
                        fwd_times.append(t_host_fwd)
                        peaks.append(torch.cuda.max_memory_allocated(dev) - base if cuda else 0)
                times.sort()
                row = {"size": name, "mode": mode, "bench": "copy", "compute_ms": compute_ms, "gaps": gaps,
                       "layers": n_layers, "layer_bytes": per_layer, "step_ms": round(times[len(times) // 2] * 1e3, 2),
                       "host_forward_ms": round(sorted(fwd_times)[len(fwd_times) // 2] * 1e3, 2),
                       "act_peak_gib": round(max(peaks) / GIB, 3), "raw": raw}
                if off is not None:
                    r = off.report
                    moved = r.host_bytes
                    extra = row["step_ms"] - result["keep"]["step_ms"]
                    row.update({"moved_gib": round(moved / GIB, 3), "extra_ms": round(extra, 2),
                                # at compute 0 each direction has about half the step: the rate each way
                                "gbps_each_way": round(moved / max(row["step_ms"] / 2, 1e-3) / 1e6, 2),
                                "report": {k: v for k, v in r.as_dict().items() if k in (
                                    "host_bytes", "kept_bytes", "forwarded_bytes", "prefetch_hits", "stalls",
                                    "stall_seconds", "copy_waits", "seconds", "kept_reasons")}})
                    off.close()
                result[mode] = row
                rows.append(row)
                print(f"compute {compute_ms:5.1f} ms/layer gaps {gaps!s:5} {mode:12} step {row['step_ms']:8.1f} ms "
                      f"(host forward {row['host_forward_ms']:7.1f} ms) act peak {row['act_peak_gib']:6.2f} GiB"
                      + (f"  moved {row['moved_gib']:.2f} GiB ({row['gbps_each_way']:.1f} GB/s each way at compute 0), "
                         f"+{row['extra_ms']:.1f} ms, copies "
                         f"{row['report']['copy_waits']} waited, stalls {row['report']['stalls']}, pack "
                         f"{row['report']['seconds'].get('pack', 0) * 1e3:.1f} ms unpack "
                         f"{row['report']['seconds'].get('unpack', 0) * 1e3:.1f} ms" if off is not None else ""),
                      flush=True)
            del blocks
            release_memory(dev)


def build_model(name, vocab, dev):
    """The decoder of size `name` (SIZES) on `dev` (bf16 on CUDA, float32 on the CPU), seeded, and a
    batch of input and target tokens: (model, idx, tgt). Also background_save_bench.py's model."""
    layers, h, heads, seq, batch = SIZES[name]
    torch.manual_seed(0)
    if _cuda(dev) and hasattr(torch, "get_default_device"):  # initialised on the GPU: seconds, not minutes
        default = torch.get_default_dtype()
        try:
            torch.set_default_dtype(torch.bfloat16)  # made in bf16: h16384's fp32 weights would not fit beside them
        except (TypeError, RuntimeError):
            pass
        try:
            with torch.device(dev):
                model = GPT(vocab, h, heads, layers, seq, qkv="packed", gelu="tanh")
        finally:
            torch.set_default_dtype(default)
    else:
        model = GPT(vocab, h, heads, layers, seq, qkv="packed", gelu="tanh")
    model = model.to(dev, torch.bfloat16 if _cuda(dev) else torch.float32)
    g = torch.Generator(device="cpu").manual_seed(1)
    idx = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    tgt = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    return model, idx, tgt


def bench_size(name, args, files_dir, rows):
    layers, h, heads, seq, batch = SIZES[name]
    dev = torch.device(args.device)
    model, idx, tgt = build_model(name, args.vocab, dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"\n== {name}: {layers} layers, hidden {h}, heads {heads}, seq {seq}, batch {batch}, "
          f"{params / 1e9:.2f} B params", flush=True)
    results = {}

    def record(mode, t, peak, act, loss, off=None, extra=None):
        keep = results.get("keep")
        row = {"size": name, "layers": layers, "hidden": h, "seq": seq, "batch": batch, "mode": mode,
               "step_ms": round(t * 1e3, 2), "peak_gib": round(peak / GIB, 3), "act_peak_gib": round(act / GIB, 3)}
        row.update(where)
        if keep is not None:
            row["overhead"] = round(t / keep["t"] - 1, 4)
            row["act_reduction"] = round(1 - act / keep["act"], 4) if keep["act"] else 0.0
            row["loss_equal_keep"] = loss == keep["loss"]
        if off is not None:
            r = off.report
            row["report"] = {k: v for k, v in r.as_dict().items() if k in (
                "policy", "host_bytes", "ssd_bytes", "kept_bytes", "deduped_bytes", "forwarded_bytes",
                "prefetch_hits", "read_ahead_peak_bytes", "stalls", "stall_seconds", "predicted", "measured",
                "decisions", "io_backend", "copy_waits", "read_beyond_freed_peak_bytes", "inflight_peak_bytes",
                "inflight_at_backward_bytes", "write_errors", "kept_reasons")}
            pred = r.predicted.get("step_seconds")
            if pred:
                row["predicted_ms"] = round(pred * 1e3, 2)
                row["prediction_error"] = round(pred / t - 1, 4)
        row.update(extra or {})
        results[mode] = {"t": t, "act": act, "loss": loss}
        rows.append(row)
        print(f"{mode:28} {row['step_ms']:9.1f} ms {row.get('overhead', 0) * 100:+7.1f}%  peak {row['peak_gib']:7.2f} "
              f"GiB  act {row['act_peak_gib']:7.2f} GiB ({row.get('act_reduction', 0) * 100:5.1f}% less; fwd "
              f"{row.get('fwd_peak_gib', 0):.2f}, at bwd {row.get('at_backward_gib', 0):.2f}, reserved "
              f"{row.get('act_reserved_gib', 0):.2f})"
              + (f"  predicted {row['predicted_ms']:.1f} ms" if "predicted_ms" in row else "")
              + (f"  host {row['report']['host_bytes'] / GIB:.2f} GiB ssd {row['report']['ssd_bytes'] / GIB:.2f} GiB"
                 f" stalls {row['report']['stalls']}" if "report" in row else ""), flush=True)

    for mode in ("keep", "recompute", "save_on_cpu"):
        if mode in args.skip:
            continue
        where = {}
        record(mode, *run_mode(model, idx, tgt, mode, args, where=where))
        release_memory(dev)
    act_bytes = results["keep"]["act"]
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if not act_bytes:  # CPU smoke run: no memory statistics
        act_bytes = 4 * layers * 34 * batch * seq * h
    tiers = {"ample": min(int(act_bytes * 1.25), int(avail * 0.6)),
             "capped": int(act_bytes * args.cap), "zero": 0}
    policies = ["adaptive"] + (["all"] if args.all_policy else []) + (["recompute"] if args.recompute else [])
    tight = {"": {}}
    if args.tight:
        tight["-tight"] = {"read_ahead_bytes": int(args.tight_read_ahead * GIB)}
        tight["-drain"] = {"inflight_bytes": int(args.drain_inflight * GIB),
                           "read_ahead_bytes": int(args.drain_read_ahead * GIB)}
    for tier, host_bytes in tiers.items():
        for policy in policies:
            for suffix, tight_kw in tight.items():
                mode = f"spillfs-{tier}" + ("" if policy == "adaptive" else f"-{policy}") + suffix
                if mode in args.skip or (tier != "ample" and files_dir is None):
                    continue
                pol = st.AdaptivePolicy(recompute=True, max_overhead=args.max_overhead) if policy == "recompute" else (
                    st.AdaptivePolicy(max_overhead=args.max_overhead) if policy == "adaptive" else policy)
                off = st.offload_activations(None if tier == "ample" else files_dir, host_bytes=host_bytes,
                                             min_bytes=args.min_bytes, prefetch_layers=args.prefetch_layers,
                                             policy=pol, layers=model, **tight_kw)
                where = {}
                try:
                    record(mode, *run_mode(model, idx, tgt, mode, args, off, where=where), off=off,
                           extra={"host_tier_bytes": host_bytes, **{k: v for k, v in tight_kw.items()}})
                    if args.diag:
                        d = diagnose(model, idx, tgt, args, off)
                        rows[-1]["diagnosis"] = d
                        print(_diag_line(d), flush=True)
                finally:
                    off.close()
                release_memory(dev)
    del model
    release_memory(dev)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable: no {path}")
        return
    sizes = sorted({r["size"] for r in rows}, key=lambda s: list(SIZES).index(s))
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.5), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        sel = [r for r in rows if r["size"] == size]
        keep = next(r for r in sel if r["mode"] == "keep")
        for r in sel:
            x = r["step_ms"] / keep["step_ms"]
            marker = ("^" if r["mode"].endswith(("-tight", "-drain")) else "o") if r["mode"].startswith("spillfs") \
                else "s"
            ax.scatter([x], [r["act_peak_gib"]], marker=marker)
            ax.annotate(r["mode"], (x, r["act_peak_gib"]), fontsize=7, xytext=(4, 2), textcoords="offset points")
        ax.axvline(1.05, color="grey", lw=0.6, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("step time / keep's")
        ax.set_ylabel("activation peak (GiB)")
        ax.set_title(f"{size}: {keep['layers']}x{keep['hidden']}, seq {keep['seq']}, batch {keep['batch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="directory on the SSD (the volume, or the files with --no-mount)")
    ap.add_argument("--sizes", default="h2048,h4096,h8192", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--cap", type=float, default=0.4, help="host tier of spillfs-capped, as a fraction of keep's "
                    "activation peak")
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--prefetch-layers", type=int, default=1)
    ap.add_argument("--all-policy", action="store_true", help="also policy='all' for each host tier")
    ap.add_argument("--recompute", action="store_true", help="also AdaptivePolicy(recompute=True) for each host "
                    "tier (mode spillfs-<tier>-recompute)")
    ap.add_argument("--max-overhead", type=float, default=0.03, help="the adaptive policy's step-time budget")
    ap.add_argument("--tight", action="store_true", help="also the memory-tight variants of each spillfs mode "
                    "(<mode>-tight: read_ahead_bytes; <mode>-drain: inflight_bytes and read_ahead_bytes)")
    ap.add_argument("--tight-read-ahead", type=float, default=0.0, help="GiB: read_ahead_bytes of -tight")
    ap.add_argument("--drain-inflight", type=float, default=1.0, help="GiB: inflight_bytes of -drain")
    ap.add_argument("--drain-read-ahead", type=float, default=1.0, help="GiB: read_ahead_bytes of -drain")
    ap.add_argument("--no-diag", dest="diag", action="store_false", help="no untimed diagnosis step per spillfs row")
    ap.add_argument("--skip", default="", help="modes to leave out, comma-separated")
    ap.add_argument("--spillfs", default=os.environ.get("SPILLFS_BIN", os.path.join(ROOT, "build", "bin",
                                                                                    "spillfs")))
    ap.add_argument("--volume-size", default="40G", help="sparse; the GPU machines have 64 GiB disks")
    ap.add_argument("--no-mount", action="store_true", help="files straight into --dir (no spillfs volume)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu is a smoke run of the script (no memory figures)")
    ap.add_argument("--copy-bench", action="store_true", help="only the copy path (no model): keep against "
                    "policy='all' for layers that save what a block of each size saves, at each --copy-compute-ms")
    ap.add_argument("--copy-compute-ms", default="0,20,50", help="GPU spin per layer of --copy-bench (comma-separated)")
    ap.add_argument("--copy-layers", type=int, default=0, help="layers of --copy-bench (0: the size's)")
    ap.add_argument("--json-out")
    ap.add_argument("--png-out")
    args = ap.parse_args()
    args.skip = set(filter(None, args.skip.split(",")))
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("activation_bench.py needs a CUDA device (--device cpu: a smoke run)")
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="activation_bench.", dir=args.dir)
    volume = None
    if args.no_mount:
        files_dir = os.path.join(work, "act")
    else:
        volume = Volume(args.spillfs, work, args.volume_size)
        files_dir = os.path.join(volume.mnt, "act")
    rows = []
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "files_dir": files_dir,
            "mount": volume is not None, "command": " ".join(sys.argv)}
    print(json.dumps(meta), flush=True)
    try:
        for name in args.sizes.split(","):
            if args.copy_bench:
                copy_bench(name, args, rows)
            else:
                bench_size(name, args, files_dir, rows)
            if args.json_out:  # after each size: a later one may run out of time
                with open(args.json_out, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    finally:
        if volume is not None and not volume.close():
            print(f"left {work}: {volume.mnt} is still mounted", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", work])
    if args.png_out and rows:
        plot(rows, args.png_out)


if __name__ == "__main__":
    main()
