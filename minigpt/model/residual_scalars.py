"""Learned scalars on the residual stream: how much of it each block reads, how much of the embedding comes
back in, and how much of the middle of the stack the head leaves out.

- `model.residual_scalars`: before block i the stream becomes

      x <- a_i · x + b_i · x0          x0: the embedding output, the stream that entered block 0

  with a_i and b_i learned, a_i = 1 and b_i = 0 at first (the plain model). b_i hands every block the
  token's own embedding directly, however much the blocks before it have written over it; a_i lets a block
  weigh what the blocks before it wrote against what it adds itself.
- `model.backout`: the head reads x - c · x_mid instead of x, x_mid the stream after the middle block
  (block L // 2) and c learned, 0 at first. The head predicts the next token, while the first blocks'
  features mostly describe the current one; the backout lets the model subtract them instead of
  overwriting them.

Both act on each position alone, so decoding with a KV cache computes exactly what a full forward does.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualScalars(nn.Module):
    """Parameters: resid (L,) = a and x0 (L,) = b with `mix`; backout () = c with `backout`."""

    def __init__(self, n_layer: int, mix: bool, backout: bool) -> None:
        super().__init__()
        if mix:
            self.resid = nn.Parameter(torch.ones(n_layer))
            self.x0 = nn.Parameter(torch.zeros(n_layer))
        if backout:
            self.backout = nn.Parameter(torch.zeros(1))  # (1,): FSDP2 shards no 0-d parameter
        self.mix, self.mid_layer = mix, n_layer // 2

    def block_input(self, i: int, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """(B, T, C) x and x0 -> (B, T, C): what block `i` reads, a_i x + b_i x0."""
        return self.resid[i] * x + self.x0[i] * x0 if self.mix else x

    def head_input(self, x: torch.Tensor, x_mid: torch.Tensor) -> torch.Tensor:
        """(B, T, C) x and x_mid (the stream after block `mid_layer`) -> (B, T, C): what the head reads."""
        return x - self.backout * x_mid if hasattr(self, "backout") else x
