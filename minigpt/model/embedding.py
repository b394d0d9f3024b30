"""Additive positional encodings: what tells the model *where* each token is.

Attention by itself is blind to order (permuting the keys permutes nothing in the result), so
position has to be injected. The two schemes here add a C-wide vector to each token's embedding:

- `sinusoidal` (the original Transformer): a fixed table, PE(pos, 2i) = sin(pos / 10000^(2i/C)),
  PE(pos, 2i+1) = cos(pos / 10000^(2i/C)). Each pair of dimensions is a clock turning at its own
  speed, so PE(pos + k) is a rotation of PE(pos) by an angle that depends only on k.
- `learned` (GPT-2): a trainable (block_size, C) table, one row per position.

The third scheme, `rope`, rotates queries and keys inside attention instead (see rope.py).

Raw integer positions (`integer`: the index p added to every channel) exist only as an ablation, to
show why it is one: the value grows with p and dwarfs the ~0.02-sized token
embeddings, and a weight w reading it in y = w·p + ... gets the gradient dL/dw = dL/dy · p, so the
same error teaches ~p times harder at position p than at position 1. `none` adds nothing at all.

Both modules take absolute positions (T,) or (B, T) (the latter when batched prompts are
left-padded, so each row counts from its own first token) and return (T, C) or (B, T, C).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(n_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The (n_positions, dim) sinusoidal table; even columns are sines, odd columns cosines."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    # 1 / base^(2i/dim) for i = 0 .. dim/2 - 1: wavelengths from 2*pi up to base*2*pi
    inv_freq = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = pos * inv_freq  # (P, dim/2)
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.float()  # computed in float64 so large positions keep their precision


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings. positions (T,) or (B, T) -> (T, C) or (B, T, C).

    The table is a non-persistent buffer: it is a pure function of (block_size, C), so it is rebuilt
    on construction and never stored in checkpoints.
    """

    def __init__(self, block_size: int, n_embd: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(block_size, n_embd), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]


class LearnedPositionalEncoding(nn.Embedding):
    """A trainable row per position (GPT-2's `wpe`). positions (T,) or (B, T) -> (T, C) or (B, T, C).

    A subclass of nn.Embedding, so its parameter is `wpe.weight` exactly as in GPT-2 checkpoints.
    Positions >= block_size have no row: looking one up is an error (IndexError on CPU).
    """

    def __init__(self, block_size: int, n_embd: int) -> None:
        super().__init__(block_size, n_embd)


class IntegerPositionalEncoding(nn.Module):
    """The ablation `integer`: PE(pos, c) = pos for every channel c. positions (T,) or (B, T) -> (T, C) or
    (B, T, C).

    Stored as a table like the sinusoidal one (a non-persistent buffer), so it follows the model's dtype
    and device and is never saved in checkpoints.
    """

    def __init__(self, block_size: int, n_embd: int) -> None:
        super().__init__()
        table = torch.arange(block_size, dtype=torch.float32).unsqueeze(1).expand(block_size, n_embd)
        self.register_buffer("table", table.contiguous(), persistent=False)  # (block_size, C)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]
