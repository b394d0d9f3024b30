"""Two cheap ways to show each token its predecessor before the first attention layer.

A transformer can learn bigram statistics (which token tends to follow which), but only after a layer of
attention has learned to look one position back. Both switches here hand it that look-back for free, on the
token embedding, before any block:

- `model.smear` ("smear"): x_t <- x_t + λ · sigmoid(w · x_t) · x_{t-1}. A learned scalar gate per token,
  read from the token itself (its first `model.smear_gate_channels` channels; 0: all), mixes in the
  previous token's embedding. λ starts at 0, so the model starts without it and learns how much to use.
- `model.bigram_embed=N` (a hashed bigram embedding): x_t <- x_t + E[h(token_{t-1}, token_t)], a table of N
  rows indexed by a hash of the token pair. V² pairs share N rows; the frequent pairs, which are what the
  loss rewards, rarely share theirs. E starts at zero.

Both need the token before each position. Inside one forward call that is the previous column of `idx`; for
the first token of a decode step it is the last token the KV cache holds (`KVCache.previous_tokens`). The
first token of a sequence (position 0) has none and is left as it is, in training and decoding alike, so a
re-prefilled window starts the way training windows do.
"""

from __future__ import annotations

import torch
from torch import nn

NO_TOKEN = -1  # the "previous token" of position 0
HASH_MULTIPLIER = 1_000_003  # a prime: consecutive previous tokens land far apart in the table


def previous_tokens(idx: torch.Tensor, first: torch.Tensor | None,
                    has_previous: torch.Tensor) -> torch.Tensor:
    """idx (B, T) -> (B, T): the token before each position, NO_TOKEN where there is none.

    first: (B,) the token before idx[:, 0] (from the KV cache), or None when the call starts the sequence.
    has_previous: (T,) or (B, T) booleans, False at position 0 (and at left padding)."""
    B = idx.shape[0]
    if first is None:
        first = torch.full((B,), NO_TOKEN, dtype=idx.dtype, device=idx.device)
    prev = torch.cat([first.view(B, 1), idx[:, :-1]], dim=1)  # (B, T)
    return prev.masked_fill(~has_previous, NO_TOKEN)


class Smear(nn.Module):
    """x (B, T, C), x_prev (B, T, C) (zeros where there is no previous token) -> (B, T, C).

    Parameters: gate (`channels` of C -> 1, no bias), lam (one number, 0 at init;
    shape (1,), not (), as FSDP2 shards no 0-dimensional parameter)."""

    def __init__(self, n_embd: int, channels: int = 0) -> None:
        super().__init__()
        self.channels = channels or n_embd  # the gate reads x's first `channels` channels
        self.gate = nn.Linear(self.channels, 1, bias=False)
        self.lam = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.gate(x[..., :self.channels]))  # (B, T, 1), broadcasts over C
        return x + self.lam * gate * x_prev


class BigramEmbedding(nn.Module):
    """(prev, idx) (B, T) each -> (B, T, C): the hashed pair's row, zero where prev is NO_TOKEN.

    Parameter: table (a rows x C embedding), zero at init."""

    def __init__(self, rows: int, n_embd: int) -> None:
        super().__init__()
        self.rows = rows
        self.table = nn.Embedding(rows, n_embd)

    def bucket(self, prev: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) rows of the pairs: (prev · HASH_MULTIPLIER + idx) mod rows. int64 cannot overflow here
        (token ids < 2^32)."""
        return (prev.clamp(min=0) * HASH_MULTIPLIER + idx) % self.rows

    def forward(self, prev: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows = self.table(self.bucket(prev, idx))  # (B, T, C)
        return rows * (prev != NO_TOKEN).unsqueeze(-1).to(rows.dtype)
