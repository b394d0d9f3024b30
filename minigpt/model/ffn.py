"""The position-wise feed-forward network: up projection, activation, down projection.

Attention mixes information *between* tokens; the FFN then transforms each token on its own,
widening C to a hidden size (ffn_mult · C, 4C by default) where the nonlinearity acts, and
projecting back to C.

Activations (`model.activation`):
- `relu`: max(0, x), the original Transformer's.
- `relu2`: max(0, x)², ReLU squared (So et al., 2021, "Primer"): as sparse as ReLU, but smooth at 0 and
  growing quadratically, which record-setting small-GPT runs found to learn faster than GELU.
- `gelu`: x · Φ(x), smooth, exact (erf) form.
- `gelu_tanh`: the tanh approximation of GELU that GPT-2 was trained with; use it to load GPT-2.
- `swiglu`: a gated unit, SiLU(x W_gate) ⊙ (x W_up), then down. It has three matrices instead of
  two, so the hidden size is 2/3 of ffn_mult · C to keep the parameter count about the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.model.config import ModelConfig


def ffn_hidden_size(config: ModelConfig) -> int:
    """Hidden width: ffn_mult · C (2/3 of it for swiglu), rounded up to a multiple of 8 for tensor cores."""
    hidden = config.ffn_mult * config.n_embd
    if config.activation == "swiglu":
        hidden = hidden * 2 / 3
    return max(8, 8 * math.ceil(round(hidden, 6) / 8))  # round(): 2/3 · 384·4 must give 1024, not 1024.0001


class ReLUSquared(nn.Module):
    """relu(x)², elementwise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class MLP(nn.Module):
    """x (B, T, C) -> (B, T, C). Parameters: c_fc (C -> hidden, or C -> 2·hidden fused gate+up for
    swiglu) and c_proj (hidden -> C). Dropout after c_proj is applied by the block (block.py)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.hidden = ffn_hidden_size(config)
        self.gated = config.activation == "swiglu"
        self.c_fc = nn.Linear(config.n_embd, self.hidden * (2 if self.gated else 1), bias=config.bias)
        self.c_proj = nn.Linear(self.hidden, config.n_embd, bias=config.bias)
        if config.activation == "relu":
            self.act = nn.ReLU()
        elif config.activation == "relu2":
            self.act = ReLUSquared()
        elif config.activation == "gelu":
            self.act = nn.GELU()
        elif config.activation == "gelu_tanh":
            self.act = nn.GELU(approximate="tanh")
        else:
            self.act = nn.SiLU()  # the swish half of SwiGLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (B, T, hidden) or (B, T, 2·hidden)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # (B, T, hidden) each
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.c_proj(h)  # (B, T, C)

