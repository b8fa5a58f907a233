"""The GPT-style decoder that activation offloading is tried on: the bench's
workload (tools/bench/activation_bench.py, bf16 at its --sizes) and the
tests' model (tests/python/test_activation_offload.py, tiny), one definition.

Pre-LN blocks, causal attention (``scaled_dot_product_attention``; matmuls on
a torch without it), a GELU MLP. The two users differ in two ways they chose:

- ``qkv``: ``"split"`` takes q, k and v as three views with gaps of the fused
  projection (the offloader stores them apart and keeps their strides: what
  the tests check); ``"packed"`` views it once and permutes (the bench's).
- ``gelu``: ``"none"`` (exact) or ``"tanh"`` (GPT-2's approximation, the bench's).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

__all__ = ["Block", "GPT"]


class Block(nn.Module):
    """A pre-LN decoder block of width ``h`` with ``heads`` heads."""

    def __init__(self, h, heads, qkv="split", gelu="none"):
        super().__init__()
        if qkv not in ("split", "packed"):
            raise ValueError(f"qkv must be 'split' or 'packed', not {qkv!r}")
        self.heads, self.qkv_layout, self.gelu = heads, qkv, gelu
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, h = x.shape
        fused = self.qkv(self.ln1(x))
        if self.qkv_layout == "split":
            q, k, v = fused.split(h, dim=-1)  # views with gaps: stored apart, strides kept
            q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = fused.view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.x
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(h // self.heads)
            a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.gelu))


class GPT(nn.Module):
    """Token and position embeddings, ``depth`` :class:`Block`\\ s, a final
    LayerNorm and an untied head. With ``recompute`` set, each block runs
    under ``torch.utils.checkpoint`` (non-reentrant)."""

    def __init__(self, vocab=64, h=32, heads=4, depth=3, ctx=16, *, qkv="split", gelu="none"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(ctx, h)
        self.blocks = nn.ModuleList(Block(h, heads, qkv, gelu) for _ in range(depth))
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)
        self.recompute = False

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            if self.recompute:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.ln(x))
