"""Online softmax: a softmax computed while streaming over blocks, and attention built on it.

softmax(x)_i = exp(x_i - m) / s with m = max(x) and s = sum_j exp(x_j - m). Subtracting m keeps
exp from overflowing, but seemingly needs the whole row before the first exp. The online trick
keeps a *running* max m and a running sum s taken relative to it; when a block brings a larger
max m_new, everything summed so far was scaled by exp(-m_old) instead of exp(-m_new), so it is
corrected by one factor:

    s_new = s_old * exp(m_old - m_new) + sum_j exp(x_block_j - m_new)

Attention applies the same correction to its running weighted sum of values, acc = sum_j
exp(score_j - m) v_j, so it can visit the keys/values one block at a time and divide by s at the
end: the full (T, S) score matrix never exists, only (T, block) pieces of it (the idea behind
FlashAttention). Here the blocks are a Python loop over torch ops; a fused kernel would do the
same arithmetic in on-chip memory.

Rows that have seen only masked (-inf) entries so far have m = -inf; the exponent then uses 0 in
place of m (see `_safe`), so they contribute exp(-inf) = 0 instead of the NaN of -inf - (-inf).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _safe(m: torch.Tensor) -> torch.Tensor:
    """The running max with -inf replaced by 0, for use in exponents (0 is as good as any finite value)."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def online_softmax(x: torch.Tensor, block_size: int = 64) -> torch.Tensor:
    """softmax over the last dim of x, reading x in blocks of `block_size` with a running max and sum.

    One streaming pass finds m and s; the output is then exp(x - m) / s. Equal to torch.softmax,
    including a NaN row where every entry is -inf (there is no distribution to return).
    """
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype, device=x.device)  # (..., 1)
    s = torch.zeros_like(m)  # (..., 1)
    for block in x.split(block_size, dim=-1):  # (..., n) with n <= block_size
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        s = s * torch.exp(m - _safe(m_new)) + torch.exp(block - _safe(m_new)).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - _safe(m)) / s


def online_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    block_size: int = 64,
    dropout: nn.Module | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention streamed over key/value blocks. q (B, H, T, D), k/v (B, H_kv, S, D) -> (B, H, T, D).

    mask: boolean, broadcastable to (B, H, T, S), True = may attend. is_causal: the last T of the S
    keys are the queries' own positions. scale multiplies the scores (None: 1/√D). dropout (optional)
    acts on the unnormalised weights that multiply V, not on the sum s, which equals dropout on the
    normalised probabilities.
    """
    B, H, T, D = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    G = H // H_kv  # query heads per key/value head
    # GQA without copying K/V: group the query heads that share a key/value head
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qg = q.reshape(B, H_kv, G, T, D) * scale  # (B, H_kv, G, T, D)
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B|1, H|1, T|1, S)
        mask = mask.unsqueeze(2) if mask.shape[1] == 1 else mask.unflatten(1, (H_kv, G))  # 5-D
    q_pos = torch.arange(S - T, S, device=q.device).unsqueeze(1)  # (T, 1) key index of each query
    stats = (B, H_kv, G, T, 1)
    m = torch.full(stats, float("-inf"), dtype=torch.float32, device=q.device)  # running max
    s = torch.zeros(stats, dtype=torch.float32, device=q.device)  # running sum of exp
    acc = torch.zeros((B, H_kv, G, T, D), dtype=torch.float32, device=q.device)  # running sum of exp · v
    for start in range(0, S, block_size):
        end = min(start + block_size, S)
        k_blk = k[:, :, start:end].unsqueeze(2)  # (B, H_kv, 1, n, D)
        v_blk = v[:, :, start:end].unsqueeze(2)  # (B, H_kv, 1, n, D)
        scores = (qg @ k_blk.transpose(-2, -1)).float()  # (B, H_kv, G, T, n): one slice of (T, S)
        if is_causal:
            k_pos = torch.arange(start, end, device=q.device)  # (n,)
            scores = scores.masked_fill(k_pos > q_pos, float("-inf"))  # (T, n) future keys
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start:end], float("-inf"))
        # the max cancels out of the result, so it needs no gradient
        m_new = torch.maximum(m, scores.detach().amax(dim=-1, keepdim=True))  # (B, H_kv, G, T, 1)
        m_exp = _safe(m_new)
        rescale = torch.exp(m - m_exp)  # (B, H_kv, G, T, 1): old terms were relative to m, not m_new
        weights = torch.exp(scores - m_exp)  # (B, H_kv, G, T, n)
        s = s * rescale + weights.sum(dim=-1, keepdim=True)
        if dropout is not None:
            weights = dropout(weights)
        acc = acc * rescale + (weights.to(v.dtype) @ v_blk).float()  # (B, H_kv, G, T, D)
        m = m_new
    return (acc / s).to(q.dtype).reshape(B, H, T, D)
