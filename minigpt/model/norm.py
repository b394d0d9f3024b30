"""Normalisation layers: LayerNorm and RMSNorm, both (B, T, C) -> (B, T, C), per token; BatchNorm, an
ablation, per channel over the batch.

- LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias. Each token is centred and
  scaled to unit variance over its C features, then given a learned scale and shift.
- RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight. No centring and no bias: cheaper, and in
  practice as good (Llama and most recent models use it).
- BatchNorm (`model.norm=batchnorm`, an ablation, there to show why a transformer does not use it): each
  channel c is centred and scaled over all B·T tokens of the batch, y[b, t, c] = (x[b, t, c] - mean_c) /
  sqrt(var_c + eps) * weight_c + bias_c. It does not normalise "the whole input" but one feature across
  tokens, so in training a token's output depends on every other token of the batch, other sequences and
  its own future included; in eval it uses running averages of the training batches' statistics instead,
  so a model meets other numbers in eval than the ones it was trained on.

torch provides all three (nn.LayerNorm, nn.RMSNorm, nn.BatchNorm1d), so minigpt uses them rather than
re-deriving them; the tests check the defining properties (zero mean / unit variance, unit RMS, the batch
statistics and the running averages) independently.
"""

from __future__ import annotations

import torch
from torch import nn


class BatchNorm(nn.BatchNorm1d):
    """nn.BatchNorm1d over the channels of (B, T, C) -> (B, T, C); without `bias`, a scale only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d wants (B, C, T)


def build_norm(kind: str, n_embd: int, eps: float, bias: bool) -> nn.Module:
    """A norm over the last dimension; `bias` applies to LayerNorm and BatchNorm (RMSNorm has none)."""
    if kind == "layernorm":
        return nn.LayerNorm(n_embd, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(n_embd, eps=eps)
    if kind == "batchnorm":
        return BatchNorm(n_embd, eps=eps, bias=bias)  # running averages with torch's momentum 0.1
    raise ValueError(f"unknown norm {kind!r}")  # unreachable: ModelConfig.validate checks the name
