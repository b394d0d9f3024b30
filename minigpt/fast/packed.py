"""Packed weights: a linear layer's matrix reordered once, at load, into the tiles oneDNN reads fastest.

A decode step multiplies one row (or a few) by every matrix of the model, so its time is how fast each matrix
streams in from memory. nn.Linear keeps its weight as a plain (out, in) array, and the kernels for a plain
array are tuned for the large products of training. oneDNN, the CPU library behind PyTorch's 16-bit products,
can instead reorder a matrix ahead of time into tiles laid out exactly as its inner-product kernel walks them
for a given number of rows (`torch.ops.mkldnn._reorder_linear_weight`, the reorder torch.compile's own
weight-freezing pass uses); every later product (`torch.ops.mkldnn._linear_pointwise`) then streams the tiles
without reshuffling them. Same values, same shape, another memory order: the result equals nn.Linear's up to
the order of the sums.

The packed matrix is an opaque oneDNN tensor, which torch.compile's code generator cannot lower, so the
product is registered as an operator of its own (`minigpt::packed_linear`): the compiled graph calls it as it
calls a library kernel. `PackedLinear.weight` unpacks the matrix on access, for code that needs the matrix
itself.

Packing is for decoding on a CPU with oneDNN (`can_pack`); whether it pays is measured, never assumed
(products.py). A packed model is for inference only: its matrices are buffers, not parameters.
"""

from __future__ import annotations

import torch
from torch import nn

# The operator is declared through torch.library's low-level API rather than `torch.library.custom_op`, whose
# Python wrapper adds several microseconds to every call: a decode step makes one call per matrix.
_LIBRARY = torch.library.Library("minigpt", "DEF")
_LIBRARY.define("packed_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor")


@torch.library.impl(_LIBRARY, "packed_linear", "CompositeExplicitAutograd")
def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   out_features: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@torch.library.register_fake("minigpt::packed_linear")
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)  # what torch.compile traces: the shape and dtype only


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                  out_features: int) -> torch.Tensor:
    """x (..., in) times the packed (out, in) matrix, plus bias (out,) or None -> (..., out)."""
    return torch.ops.minigpt.packed_linear(x, packed, bias, out_features)


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` (out, in) can be packed here: a float32 or bfloat16 matrix on a CPU with oneDNN."""
    return (weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available())


def pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """(out, in) float matrix -> the same matrix in oneDNN's blocked layout for products of `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows)


class PackedLinear(nn.Module):
    """x (..., in) -> (..., out), like the nn.Linear it was made from (`from_linear`), with a packed matrix.

    Buffers: `packed` (out, in) in oneDNN's blocked layout for `rows` rows, `bias` (out,) or None."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, rows: int) -> None:
        super().__init__()
        self.out_features, self.in_features = packed.shape
        self.rows = rows
        self.register_buffer("packed", packed)
        self.register_buffer("bias", bias)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, rows: int) -> PackedLinear:
        """`linear`'s matrix packed for products of `rows` rows (any other number still computes right)."""
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(pack(linear.weight, rows), bias, rows)

    @property
    def weight(self) -> torch.Tensor:
        return self.packed.to_dense()  # (out, in), the original values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed, self.bias, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rows={self.rows}"
