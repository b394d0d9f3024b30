"""Streamed computation: a decode step's products and its one-query attention written as the sums they are,
for a compiled step to generate as single passes over memory.

A decode step multiplies one row (or a few) by every matrix of the model, so its time is how fast each matrix
streams in from memory. A library GEMM is built for large products: for one row it spends its effort on
blocking and packing that a single pass over the matrix does not need. Written as what the product is,

    y[..., o] = sum_i x[..., i] · W[o, i]        (x.unsqueeze(-2) * W).sum(-1)        StreamedLinear

torch.compile's Inductor turns it into one generated kernel that walks W once, row by row, vectorised along
`in` and split across threads along `out`: a streaming reduction, as fast as memory allows. Eagerly the same
expression would build the whole (..., out, in) product first, so outside compilation the layer calls
F.linear, and a prefill of many tokens (eager) costs what an nn.Linear costs.

The attention of one new query over the cache is the same kind of work, two passes over the cached keys and
values with a softmax between them (`streamed_attention`); the library's attention kernels are built for
many queries at once, and for one query their 16-bit paths are slowest.

Two details keep the generated loops pure streams:
- The input is made a real buffer first (`as_strided` onto itself, free eagerly): otherwise Inductor may
  recompute whatever made it (a norm, an activation, a rotation) inside the loop, once per output. It is
  made contiguous before: `as_strided` reads its strides against the storage Inductor realises, and a view
  (the query, a slice of the fused q, k, v projection) has strides of the larger tensor it came from, so
  every row but the first would read memory that is not its own.
- The sums accumulate in float32 whatever the weights' dtype (as the library's 16-bit kernels do), and the
  result is cast back.

Whether they pay is measured, never assumed (attention.py, whole_steps.py). A StreamedLinear
has the linear's values, shape and parameters (a tied embedding stays tied), and both give the library's
results up to the order of the sums.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _own_buffer(x: torch.Tensor) -> torch.Tensor:
    """`x` as a buffer of its own in a compiled graph, contiguous first (see the module docstring)."""
    x = x.contiguous()
    return x.as_strided(x.shape, x.stride())


class StreamedLinear(nn.Module):
    """x (..., in) -> (..., out), like the nn.Linear it was made from (`from_linear`), computed as a streaming
    reduction under torch.compile and by F.linear otherwise. Parameters: the linear's own `weight` (out, in)
    and `bias` (out,) or None, shared with it."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> StreamedLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        x = _own_buffer(x)
        y = (x.unsqueeze(-2) * self.weight).sum(-1, dtype=torch.float32).to(x.dtype)  # (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


def streamed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None = None
) -> torch.Tensor:
    """One query per row and head (a decode step), written as the reductions it is, for a compiled step:
    q (B, H, 1, D), k/v (B, H_kv, S, D), mask broadcastable to (B, 1, 1, S) with True = may attend, or None;
    returns (B, H, 1, D) like the other backends.

        scores[s] = q · k[s] · scale      p = softmax(scores)      y = sum_s p[s] · v[s]

    Inductor generates each sum as a loop over the cached keys and values, in float32 whatever their
    dtype, with the softmax fused between them: a single pass over the cache, where a library kernel
    built for many queries (sdpa's 16-bit path above all) spends most of its time on blocking that one
    query does not need. Eagerly it materialises the (B, H, S, D) products, so it is meant for compiled
    one-query steps only (attention.py times it there against sdpa and math)."""
    B, H, T, D = q.shape
    if T != 1:
        raise ValueError(f"streamed attention takes one query per row and head, got {T}")
    H_kv = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    dtype = q.dtype
    q = _own_buffer(q).float()  # in float32: the products with k and v are promoted too
    q = q.reshape(B, H_kv, H // H_kv, 1, D)  # (B, H_kv, n_rep, 1, D): the query heads sharing each K/V head
    scores = (q * k.unsqueeze(2)).sum(-1) * scale  # (B, H_kv, n_rep, S)
    if mask is not None:
        scores = scores.masked_fill(~mask.reshape(mask.shape[0], 1, 1, mask.shape[-1]), float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, H_kv, n_rep, S)
    y = (probs.unsqueeze(-1) * v.unsqueeze(2)).sum(-2)  # (B, H_kv, n_rep, D)
    return y.to(dtype).reshape(B, H, 1, D)
