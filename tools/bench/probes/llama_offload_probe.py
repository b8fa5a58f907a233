"""One training step of a `transformers` Llama built from a config, as issue 43 measured it:
no hooks (keep), ``gradient_checkpointing_enable()``, spillfs's ``MixedPolicy`` at memory
budgets from keep's activation peak down to checkpointing's and at an overhead budget of 3%
(and, asked for, spillfs's ``policy="none"``/``"all"``); per row the median step time, the
activation peak, the policy's predicted step and peak, its plan, and whether the gradients
equal keep's; then issue 43's targets, each PASS or FAIL.

Usage (from the repository root; the GPU machine has torch and transformers; each config is
about 80 steps of its model: keep, checkpointing, and per mixed row its profile, warm-up and
measured steps; --deadline-s skips a config that the last one's time says would not finish):
    PYTHONPATH=clients/python python3 tools/bench/probes/llama_offload_probe.py \
        [--configs h2048,h4096,h8192] [--deadline-s 240] [--budgets 5] [--overhead 0.03] [--steps 5] \
        [--json-out FILE]
    # one config of your own instead of --configs:
    PYTHONPATH=clients/python python3 tools/bench/probes/llama_offload_probe.py \
        --hidden 2048 --inter 5632 --layers 8 --heads 32 --kv-heads 4 --seq 2048 --batch 4 \
        [--modes keep,checkpoint,mixed,none,all]
On the CPU (--device cpu, a tiny --configs tiny) it is a smoke run of the script: times, no
memory figures (the memory budgets then are fractions of keep's peak as the policy models it).
"""

import argparse
import json
import statistics
import time
import traceback

import torch

# seq 2048, batch 4, bf16, SDPA throughout (issue 43); layers: h2048 and h4096 as issue 43's H100 run,
# h8192 4 (~4B parameters: weights, gradients and keep's activations well within 80 GiB)
PRESETS = {
    "h2048": dict(hidden=2048, inter=5632, layers=8, heads=32, kv_heads=4),
    "h4096": dict(hidden=4096, inter=11008, layers=4, heads=32, kv_heads=32),
    "h8192": dict(hidden=8192, inter=28672, layers=4, heads=64, kv_heads=8),
    "tiny": dict(hidden=64, inter=128, layers=3, heads=4, kv_heads=2, seq=64, batch=2, vocab=128),
}


def build(c, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=c.hidden, intermediate_size=c.inter, num_hidden_layers=c.layers,
                      num_attention_heads=c.heads, num_key_value_heads=c.kv_heads, vocab_size=c.vocab,
                      max_position_embeddings=c.seq, attn_implementation="sdpa",
                      use_cache=False)  # training: no KV cache (a forward's cache update would change a recomputation)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):  # initialized where it runs: no CPU init of a GPU model
        model = LlamaForCausalLM(cfg)
    return model.to(dtype=dtype)


def run_row(c, model, ids, device, mode, policy=None):
    """Median step and activation peak of one mode on `model` (its weights untouched: no optimizer)."""
    import spillfs.torch as st
    ctx = None
    warmup = c.warmup
    if mode == "checkpoint":
        model.gradient_checkpointing_enable()
    elif mode in ("none", "all"):
        ctx = st.offload_activations(None, host_bytes=c.host_gib << 30, policy=mode, layers=model.model.layers)
    elif mode == "mixed":
        ctx = st.offload_activations(None, host_bytes=c.host_gib << 30, policy=policy, layers=model.model.layers)
    model.train()
    times, peaks = [], []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    try:
        step = 0
        while len(times) < c.steps:
            model.zero_grad(set_to_none=True)
            sync()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            if ctx is not None:
                with ctx:
                    model(input_ids=ids, labels=ids).loss.backward()
            else:
                model(input_ids=ids, labels=ids).loss.backward()
            sync()
            # a mixed row: measured once its profile is done and its plan checked (settled), then as others
            if step >= warmup and (mode != "mixed" or policy.settled):
                times.append(time.perf_counter() - t0)
                if device == "cuda":
                    peaks.append(torch.cuda.max_memory_allocated() - base)
            step += 1
    finally:
        if mode == "checkpoint":
            model.gradient_checkpointing_disable()
    grads = [p.grad.detach().float().cpu() for p in model.parameters() if p.grad is not None]
    row = {"mode": mode, "step_ms": statistics.median(times) * 1e3, "steps": len(times),
           "activation_peak_gib": statistics.median(peaks) / 2**30 if peaks else None}
    if ctx is not None:
        r = ctx.report
        row.update(saved_hooks=r.saved_hooks, packed=r.packed_count, offloaded_gib=r.offloaded_bytes / 2**30)
        if mode == "mixed":
            pred = r.predicted
            row.update(predicted_step_ms=pred["step_seconds"] * 1e3,
                       predicted_peak_gib=pred["peak_bytes"] / 2**30,
                       prediction_error=pred["step_seconds"] * 1e3 / row["step_ms"] - 1.0,
                       budget_met_in_model=pred["budget_met"], files=pred["files"],
                       plan=[{k: v for k, v in p.items() if k in ("layer", "decision", "fraction", "input_to")}
                             for p in r.plan],
                       calibrated_from=pred.get("calibrated_from"), replans=pred.get("replans"),
                       peak_scale=pred.get("peak_scale"),
                       keep_step_ms_profiled=pred["keep_step_seconds"] * 1e3,
                       keep_peak_gib_profiled=pred["keep_peak_bytes"] / 2**30,
                       memory_measured=pred["memory_measured"],
                       hook_us_per_save=ctx.policy.profile["hook_seconds_per_save"] * 1e6)
        ctx.close()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row, grads


def targets(rows, overhead):
    """Issue 43's targets, measured: a list of (what, PASS/FAIL, figures)."""
    keep = next(r for r in rows if r["mode"] == "keep")
    ckpt = next((r for r in rows if r["mode"] == "checkpoint" and "error" not in r), None)
    out = []
    for r in rows:
        if r["mode"] != "mixed":
            continue
        if "error" in r:
            out.append((f"{r['label']}: ran", False, r["error"]))
            continue
        if "predicted_step_ms" in r:
            ok = abs(r["prediction_error"]) <= 0.10
            out.append((f"{r['label']}: prediction within 10% of the step", ok,
                        f"{r['predicted_step_ms']:.1f} vs {r['step_ms']:.1f} ms"))
        if r.get("memory_budget_gib") is not None and r["activation_peak_gib"] is not None:
            out.append((f"{r['label']}: peak within the budget", r["activation_peak_gib"] <= r["memory_budget_gib"],
                        f"{r['activation_peak_gib']:.2f} <= {r['memory_budget_gib']:.2f} GiB"))
            if ckpt is not None:
                at_ckpt = r["budget_index"] == 0
                ok = r["step_ms"] < ckpt["step_ms"] if at_ckpt else r["step_ms"] <= ckpt["step_ms"]
                out.append((f"{r['label']}: step {'below' if at_ckpt else 'at or below'} checkpointing's", ok,
                            f"{r['step_ms']:.1f} vs {ckpt['step_ms']:.1f} ms"))
        if r.get("overhead_budget") is not None:
            ok = r["step_ms"] <= keep["step_ms"] * (1 + overhead)
            out.append((f"{r['label']}: within {overhead:.0%} of keep", ok,
                        f"{r['step_ms']:.1f} vs {keep['step_ms']:.1f} ms (x{r['step_ms'] / keep['step_ms']:.3f})"))
    return out


def run_config(name, c, device):
    import spillfs.torch as st
    model = build(c, device)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, c.vocab, (c.batch, c.seq), generator=g).to(device)
    rows, ref = [], None
    modes = c.modes.split(",")

    def add(mode, policy=None, **extra):
        nonlocal ref
        try:
            try:
                row, grads = run_row(c, model, ids, device, mode, policy)
            except Exception:
                if mode != "mixed" or not policy.selective:
                    raise
                traceback.print_exc()  # once more without selective recomputation, the row saying so
                policy = st.MixedPolicy(memory_budget=policy.memory_budget, overhead_budget=policy.overhead_budget,
                                        selective=False)
                row, grads = run_row(c, model, ids, device, mode, policy)
                row["selective_failed"] = True
        except Exception as e:  # one row's failure is reported, and the others still run
            traceback.print_exc()
            row = {"mode": mode, "config": name, "label": extra.pop("label", mode), "error": repr(e), **extra}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
            return
        row.update(config=name, **extra)
        row.setdefault("label", row["mode"])
        if ref is None:
            ref = grads
        row["grads_equal_keep"] = all(torch.equal(x, y) for x, y in zip(ref, grads))
        row["grads_max_abs_diff"] = max(((x - y).abs().max().item() for x, y in zip(ref, grads)), default=0.0)
        rows.append(row)
        print(json.dumps(row), flush=True)

    add("keep")
    keep = rows[0]
    if "error" in keep:
        return rows, []
    if "checkpoint" in modes:
        add("checkpoint")
    for mode in ("none", "all"):
        if mode in modes:
            add(mode)
    if "mixed" in modes:
        ckpt = next((r for r in rows if r["mode"] == "checkpoint" and "error" not in r), None)
        budgets = []
        if device == "cuda" and ckpt is not None:
            lo, hi = ckpt["activation_peak_gib"], keep["activation_peak_gib"]
            for k in range(c.budgets):  # from checkpointing's peak (k = 0) up to keep's
                budgets.append((k, (lo + (hi - lo) * k / max(c.budgets - 1, 1)) * 2**30))
        else:  # no allocator figures: fractions of keep's peak as the policy models it
            budgets = [(k, 0.4 + 0.6 * k / max(c.budgets - 1, 1)) for k in range(c.budgets)]
        for k, budget in budgets:
            b = int(budget) if budget > 1 else float(budget)
            label = f"mixed mem {budget / 2**30:.2f} GiB" if budget > 1 else f"mixed mem x{budget:.2f}"
            add("mixed", st.MixedPolicy(memory_budget=b), label=label, budget_index=k,
                memory_budget_gib=budget / 2**30 if budget > 1 else None)
        add("mixed", st.MixedPolicy(overhead_budget=c.overhead), label=f"mixed overhead {c.overhead:.0%}",
            overhead_budget=c.overhead)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    print(f"\n{name}: hidden {c.hidden}, {c.layers} layers, seq {c.seq}, batch {c.batch}")
    for r in rows:
        if "error" in r:
            print(f"{r['label']:<26} ERROR {r['error']}")
            continue
        extra = ""
        if "predicted_step_ms" in r:
            # k keep, h host tier, f files, r recompute (R: its input offloaded), s selective recompute
            plan = "".join("R" if p["decision"] == "recompute" and p.get("input_to") else
                           {"keep": "k", "host": "h", "ssd": "f", "recompute": "r", "selective": "s"}[p["decision"]]
                           for p in r["plan"])
            extra = (f"  predicted {r['predicted_step_ms']:7.1f} ms ({r['prediction_error']:+.1%})"
                     f" peak {r['predicted_peak_gib']:.2f}  plan {plan}")
        print(f"{r['label']:<26} {r['step_ms']:8.1f} ms  x{r['step_ms'] / keep['step_ms']:.3f}"
              + (f"  peak {r['activation_peak_gib']:.2f} GiB" if r["activation_peak_gib"] is not None else "")
              + extra)
    checks = targets(rows, c.overhead)
    for what, ok, figures in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {what}: {figures}")
    return rows, [{"target": w, "pass": ok, "figures": f} for w, ok, f in checks]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", help=f"presets, comma-separated ({', '.join(PRESETS)}); else the flags below")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--host-gib", type=int, default=16, help="host tier of the spillfs rows")
    ap.add_argument("--modes", default="keep,checkpoint,mixed", help="of keep,checkpoint,mixed,none,all")
    ap.add_argument("--budgets", type=int, default=5, help="memory budgets, checkpointing's peak to keep's")
    ap.add_argument("--overhead", type=float, default=0.03, help="the overhead budget's row")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no config once this many seconds passed, or if the last one's time would pass it")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    configs = []
    for name in (a.configs.split(",") if a.configs else ["flags"]):
        c = argparse.Namespace(**vars(a))
        if name != "flags":
            vars(c).update(PRESETS[name])
        configs.append((name, c))
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
           "args": vars(a), "configs": {}}
    started, last = time.perf_counter(), 0.0
    for name, c in configs:
        elapsed = time.perf_counter() - started
        if a.deadline_s is not None and elapsed + last > a.deadline_s:
            print(f"\n{name}: skipped (--deadline-s {a.deadline_s:.0f}: {elapsed:.0f} s passed, the last config "
                  f"took {last:.0f} s)", flush=True)
            out["configs"][name] = {"skipped": f"deadline: {elapsed:.0f} s passed, the last config {last:.0f} s"}
            if a.json_out:
                with open(a.json_out, "w") as f:
                    json.dump(out, f, indent=1)
            continue
        t0 = time.perf_counter()
        rows, checks = run_config(name, c, a.device)
        last = time.perf_counter() - t0
        shape = {k: getattr(c, k) for k in ("hidden", "inter", "layers", "heads", "kv_heads", "seq", "batch", "vocab")}
        out["configs"][name] = {"seconds": last, "config": shape, "rows": rows, "targets": checks}
        if a.json_out:  # after each config: what ran survives a later one's failure
            with open(a.json_out, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
