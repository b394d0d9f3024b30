"""Normalisation layers: LayerNorm and RMSNorm, both (B, T, C) -> (B, T, C), per token.

- LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias. Each token is centred and
  scaled to unit variance over its C features, then given a learned scale and shift.
- RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight. No centring and no bias: cheaper, and in
  practice as good (Llama and most recent models use it).

torch provides both (nn.LayerNorm, nn.RMSNorm), so minigpt uses them rather than re-deriving them;
the tests check the defining properties (zero mean / unit variance, unit RMS) independently.

Without a gain (`model.norm_gain=false`) a norm only normalises: y = x / sqrt(mean(x^2) + eps), no
parameters. The layer after it (a linear map) can scale its input however it likes, so the gain adds little
but another vector for the optimizer to move.
"""

from __future__ import annotations

from torch import nn


def build_norm(kind: str, n_embd: int, eps: float, bias: bool, gain: bool = True) -> nn.Module:
    """A norm over the last dimension; `bias` only applies to LayerNorm (RMSNorm has none); without `gain`
    it has no parameters at all."""
    if kind == "layernorm":
        return nn.LayerNorm(n_embd, eps=eps, bias=bias, elementwise_affine=gain)
    if kind == "rmsnorm":
        return nn.RMSNorm(n_embd, eps=eps, elementwise_affine=gain)
    raise ValueError(f"unknown norm {kind!r}")  # unreachable: ModelConfig.validate checks the name
