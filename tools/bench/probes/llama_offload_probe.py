"""One training step of a `transformers` Llama built from a config, as issue 43 measured it:
no hooks (keep), spillfs's offloader with ``policy="none"`` and ``"all"`` (host tier), and
``gradient_checkpointing_enable()``; median step time and activation peak of each, and
whether the gradients equal keep's.

Usage (from the repository root; the GPU machine has torch and transformers):
    PYTHONPATH=clients/python python3 tools/bench/probes/llama_offload_probe.py \
        [--hidden 2048 --inter 5632 --layers 8 --heads 32 --kv-heads 4 --seq 2048 --batch 4] \
        [--modes keep,none,all,checkpoint] [--steps 5] [--json-out FILE]
On the CPU (--device cpu) it is a smoke run of the script: times, no memory figures.
"""

import argparse
import json
import statistics
import time

import torch


def build(a, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.inter, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                      max_position_embeddings=a.seq, attn_implementation="sdpa")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype)


def run_mode(a, mode, device):
    import spillfs.torch as st
    model = build(a, device)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device)
    ctx = None
    if mode == "checkpoint":
        model.gradient_checkpointing_enable()
    elif mode in ("none", "all"):
        ctx = st.offload_activations(None, host_bytes=a.host_gib << 30, policy=mode, layers=model.model.layers)
    model.train()
    times, peaks = [], []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for step in range(a.warmup + a.steps):
        model.zero_grad(set_to_none=True)
        sync()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        if ctx is not None:
            with ctx:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
        else:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
            if device == "cuda":
                peaks.append(torch.cuda.max_memory_allocated() - base)
    grads = [p.grad.detach().float().cpu() for p in model.parameters() if p.grad is not None]
    row = {"mode": mode, "step_ms": statistics.median(times) * 1e3, "steps": len(times),
           "activation_peak_gib": statistics.median(peaks) / 2**30 if peaks else None}
    if ctx is not None:
        r = ctx.report
        row.update(saved_hooks=r.saved_hooks, packed=r.packed_count, offloaded_gib=r.offloaded_bytes / 2**30)
        ctx.close()
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return row, grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--host-gib", type=int, default=16, help="host tier of policy='all'")
    ap.add_argument("--modes", default="keep,none,all,checkpoint")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    rows, ref = [], None
    for mode in a.modes.split(","):
        row, grads = run_mode(a, mode, a.device)
        if ref is None:
            ref = grads
        row["grads_equal_first_mode"] = all(torch.equal(x, y) for x, y in zip(ref, grads))
        rows.append(row)
        print(json.dumps(row), flush=True)
    keep = next((r for r in rows if r["mode"] == "keep"), None)
    if keep:
        for r in rows:
            print(f"{r['mode']:<11} {r['step_ms']:8.1f} ms  x{r['step_ms'] / keep['step_ms']:.3f} of keep"
                  + (f"  peak {r['activation_peak_gib']:.2f} GiB" if r["activation_peak_gib"] is not None else ""))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"config": vars(a), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
