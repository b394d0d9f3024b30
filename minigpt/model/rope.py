"""Rotary position embedding (RoPE): position enters attention as a rotation of q and k.

Each head vector is split into D/2 pairs; pair i at position p is rotated by the angle
p * theta_i with theta_i = base^(-2i/D). Because rotations compose, the dot product of a query
rotated by p and a key rotated by p' depends only on p - p': attention sees *relative* offsets,
and nothing is added to the residual stream.

Pairing convention: dimension j is paired with j + D/2 (the "rotate half" layout of GPT-NeoX and
Llama), which needs two contiguous slices instead of strided even/odd views. Any fixed pairing gives
the same relative-position property; this one only matters when importing weights trained with it.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Cos/sin tables for positions 0..max_len-1. positions (T,) or (B, T) -> (cos, sin).

    The returned tables have shape (T, D/2) or (B, 1, T, D/2): ready to broadcast against
    (B, H, T, D/2) halves of the heads in `apply_rope`. They are computed once per forward in
    GPT.forward and shared by every layer.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
        angles = torch.arange(max_len, dtype=torch.float64).unsqueeze(1) * inv_freq  # (max_len, D/2)
        # float64 then float32: positions times small frequencies lose digits in float32
        self.register_buffer("cos", torch.cos(angles).float(), persistent=False)
        self.register_buffer("sin", torch.sin(angles).float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos[positions], self.sin[positions]  # (T, D/2) or (B, T, D/2)
        if positions.dim() == 2:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, D/2): one table for all heads
        return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) heads by the angles in cos/sin; returns (B, H, T, D) in x's dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (B, H, T, D/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    # the 2-D rotation [[cos, -sin], [sin, cos]] applied to every pair (x1_i, x2_i)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D)
