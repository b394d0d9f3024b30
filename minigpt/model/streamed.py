"""Streamed products: a linear layer that a compiled decode step computes as one generated loop over its
matrix.

A decode step multiplies one row (or a few) by every matrix of the model, so its time is how fast each matrix
streams in from memory. A library GEMM is built for large products: for one row it spends its effort on
blocking and packing that a single pass over the matrix does not need. Written as what the product is,

    y[..., o] = sum_i x[..., i] · W[o, i]        (x.unsqueeze(-2) * W).sum(-1)

torch.compile's Inductor turns it into one generated kernel that walks W once, row by row, vectorised along
`in` and split across threads along `out`: a streaming reduction, as fast as memory allows. Eagerly the same
expression would build the whole (..., out, in) product first, so outside compilation the layer calls
F.linear, and a prefill of many tokens (eager) costs what an nn.Linear costs.

Two details keep the generated loop a pure stream:
- The input is made a real buffer first (`as_strided` onto itself, free eagerly): otherwise Inductor may
  recompute whatever made x (a norm, an activation) inside the loop, once per output.
- The sum accumulates in float32 whatever the weights' dtype (as the library's 16-bit products do), and the
  result is cast back.

Whether it pays is measured, never assumed (generation/kernels.py); same values, same shape, same parameter
(a tied embedding stays tied); the result equals nn.Linear's up to the order of the sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
        x = x.as_strided(x.shape, x.stride())  # a buffer of its own in the graph (see the module docstring)
        y = (x.unsqueeze(-2) * self.weight).sum(-1, dtype=torch.float32).to(x.dtype)  # (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"
