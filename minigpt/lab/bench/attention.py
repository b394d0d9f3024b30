"""Attention backends side by side: time and peak memory of one causal forward at growing T.

`math` materialises the (T, T) score matrix (and a mask and probabilities of the same size), so
its memory grows as T^2; `online` streams over key/value blocks with a running softmax and keeps
only (T, block) pieces; `sdpa` is torch's fused kernel (flash attention on GPU). q, k, v are
(B, H, T, D) random tensors; on CPU B and H are kept small so math's 8192^2 scores fit easily and
the whole section takes seconds.
"""

from __future__ import annotations

import torch

from minigpt.fast.timing import interleave
from minigpt.lab.bench.resources import peak_memory_bytes
from minigpt.model.attention import math_attention, sdpa_attention
from minigpt.model.online_softmax import online_attention

BACKENDS = ("math", "online", "sdpa")


def attention_fn(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int):
    """A no-argument callable running one causal forward of `backend` on q, k, v."""
    if backend == "math":
        return lambda: math_attention(q, k, v, None, True)[0]
    if backend == "online":
        return lambda: online_attention(q, k, v, is_causal=True, block_size=block_size)
    return lambda: sdpa_attention(q, k, v, None, True, 0.0)


@torch.no_grad()
def bench_attention(device: torch.device, lengths: tuple[int, ...] = (512, 2048, 8192), batch: int = 1,
                    heads: int = 1, head_dim: int = 64, block_size: int = 64, repeats: int = 2) -> dict:
    """{T: {backend: {time_s, peak_mem_bytes}}} plus the (T, T) fp32 score-matrix size for reference."""
    gen = torch.Generator().manual_seed(0)
    out = {"batch": batch, "heads": heads, "head_dim": head_dim, "online_block_size": block_size,
           "lengths": {}}
    for t in lengths:
        q, k, v = (torch.randn(batch, heads, t, head_dim, generator=gen).to(device) for _ in range(3))
        fns = {b: attention_fn(b, q, k, v, block_size) for b in BACKENDS}
        memory = {b: peak_memory_bytes(fn, device) for b, fn in fns.items()}  # doubles as the warm-up
        timings = interleave(fns, repeats=repeats, warmup=0, device=device)
        out["lengths"][str(t)] = {
            "scores_bytes": batch * heads * t * t * 4,
            **{b: {"time_s": timings[b].to_dict(), "peak_mem_bytes": memory[b]} for b in BACKENDS},
        }
    return out
