"""Weight-only int8: every linear layer's matrix stored as int8, with one float scale per output channel.

    scale[o] = max_i |w[o, i]| / 127        q[o, i] = round(w[o, i] / scale[o])  in [-127, 127]
    y = x Wᵀ + b  ≈  (x qᵀ) · scale + b     (the scale of output o multiplies column o of the product)

A decode step reads every weight once per token and does ~2 FLOPs per weight it reads, so its time is the
bytes it reads: int8 matrices are a quarter of float32's. Only the matrices shrink; activations, norms,
embeddings, biases and the KV cache keep a float dtype (`activation dtype` below), and every product is
computed in it. Symmetric rounding (no zero point, -128 unused) keeps the dequantised weight `q · scale`
an exact odd function of w, and per-channel scales keep one large weight from costing every other output
channel its precision.

Two products, which must agree (tests/model/test_int8.py):
- `int8_linear_reference`: the formula above as written, converting q to the activation dtype each call.
  The simple path, and the CUDA one: torch.compile fuses the conversion into the matmul there (torchao's
  plain int8 weight-only scheme computes this formula on every device).
- `torch.ops.aten._weight_int8pack_mm`: PyTorch's own int8 weight-only kernel (CPU and MPS), which reads
  q as int8 and applies the scales in its epilogue, never materialising a float weight. It wants a 2-D
  input contiguous in its last dimension and scales in the activation dtype. Its 16-bit CPU kernel walks
  the input dimension in blocks of 16 and returns garbage (or crashes) for other sizes, so a layer whose
  input width is not a multiple of 16 uses the reference product in 16-bit activations
  (`has_packed_kernel`; the tests pin that behaviour down).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INT8_MAX = 127  # symmetric: q in [-127, 127], so -q is always representable


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight -> (q (out, in) int8, scale (out,) float32) with w ≈ q · scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / INT8_MAX  # (out,)
    # an all-zero row would divide by zero; any scale reproduces its zeros exactly
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale.unsqueeze(1)).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)  # (out, in)
    return q, scale


def int8_linear_reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (..., in) -> (..., out): x qᵀ · scale + b, the int8 weight converted to x's dtype for the product."""
    y = F.linear(x, q.to(x.dtype)) * scale.to(x.dtype)
    return y if bias is None else y + bias


class Int8Linear(nn.Module):
    """x (..., in) -> (..., out), like the nn.Linear it was made from (`from_linear`), with an int8 weight.

    Buffers: `q` (out, in) int8, `scale` (out,) and `bias` (out,) or None in the activation dtype. `weight`
    is the dequantised (out, in) matrix, made on each access, for code that needs the matrix itself (the
    fused loss head of GPT.forward); products never use it.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, packed_kernel: bool):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.packed_kernel = packed_kernel  # True: `_weight_int8pack_mm`; False: `int8_linear_reference`

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype, packed_kernel: bool) -> Int8Linear:
        """Quantise `linear`'s weight (`quantize_per_channel`); scale and bias in the activation `dtype`."""
        q, scale = quantize_per_channel(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(q.contiguous(), scale.to(dtype), bias, packed_kernel)

    @property
    def weight(self) -> torch.Tensor:
        return self.q.to(self.scale.dtype) * self.scale.unsqueeze(1)  # (out, in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed_kernel:
            return int8_linear_reference(x, self.q, self.scale, self.bias)
        rows = x.reshape(-1, self.in_features).contiguous()  # (N, in): the kernel takes 2-D inputs
        y = torch.ops.aten._weight_int8pack_mm(rows, self.q, self.scale)  # (N, out)
        y = y.view(*x.shape[:-1], self.out_features)  # (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        kernel = "_weight_int8pack_mm" if self.packed_kernel else "reference"
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={kernel}"


PACKED_BLOCK = 16  # the input-width granularity of `_weight_int8pack_mm`'s 16-bit CPU kernel


def has_packed_kernel(device: torch.device, dtype: torch.dtype, in_features: int) -> bool:
    """Whether `_weight_int8pack_mm` computes a layer of `in_features` inputs in activation `dtype` on
    `device`: it has kernels for CPU and MPS only (elsewhere the reference product, which torch.compile
    fuses), and the 16-bit ones need a multiple of 16 inputs."""
    if torch.device(device).type not in ("cpu", "mps"):
        return False
    return dtype == torch.float32 or in_features % PACKED_BLOCK == 0


@torch.no_grad()
def quantize_int8(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace every nn.Linear of `model` by an Int8Linear, in place; everything else is cast to `dtype`, the
    activation dtype. A tied embedding keeps its float matrix (a lookup reads one row per token); the head's
    matrix is quantised like any other. Returns `model`."""
    device = next(model.parameters()).device
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                packed = has_packed_kernel(device, dtype, child.in_features)
                setattr(parent, name, Int8Linear.from_linear(child, dtype, packed))
    return model.to(dtype)  # floats only: int8 buffers are left as they are
