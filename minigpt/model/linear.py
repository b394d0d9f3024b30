"""nn.Linear with a faster weight layout for CPU inference (every linear layer of the model uses it).

nn.Linear keeps its weight as (out, in) and multiplies by the transpose. For the one or few rows of a
decode step the product is a matrix-vector product that must stream the whole weight from memory,
and MKL streams a transposed (out, in) operand about half as fast as an (in, out) one: for the
(50304, 384) head of the generation benchmark, ~22 ms against ~9 ms per token on one core, and the
blocks' smaller matrices gain ~8% of a decode step more. So in float32 CPU inference (eval mode, no
autograd) this layer multiplies by an (in, out)-contiguous copy of its weight, made on first use.

The copy must never go stale. It is dropped whenever the module's mode is set (`train()`, `eval()`:
a trainer switches modes around every evaluation) and on any forward in training or autograd mode,
and it is remade when the weight's storage or version counter changes (`load_state_dict`, in-place
edits). The version counter alone is not enough: torch's fused AdamW updates weights in place without
moving it. Training, autograd, other dtypes and other devices use the plain F.linear, so the doubled
weight memory is paid only while inference runs. Parameters, names and hooks are nn.Linear's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    """x (..., in) -> (..., out), like nn.Linear; see the module docstring for the inference layout."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._weight_t: torch.Tensor | None = None  # (in, out) copy for CPU inference
        self._weight_t_key: tuple | None = None

    def train(self, mode: bool = True) -> Linear:
        self._weight_t = self._weight_t_key = None  # weights may change before the next inference
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        plain = self.training or torch.is_grad_enabled() or w.device.type != "cpu" or w.dtype != torch.float32
        if plain or w.is_inference():  # (inference-mode tensors carry no version counter)
            if self._weight_t is not None:  # back to training: free the copy
                self._weight_t = self._weight_t_key = None
            return F.linear(x, w, self.bias)
        key = (w.data_ptr(), w._version)
        if self._weight_t_key != key:
            self._weight_t, self._weight_t_key = w.detach().t().contiguous(), key  # (in, out)
        out = x.reshape(-1, x.shape[-1]) @ self._weight_t  # (N, in) @ (in, out)
        if self.bias is not None:
            out += self.bias  # a plain matmul + add rather than addmm, so FLOP counters see a matmul
        return out.view(*x.shape[:-1], out.shape[-1])  # (..., out)
