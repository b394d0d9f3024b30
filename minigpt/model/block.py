"""One transformer block: attention then FFN, each wrapped in a residual connection and a norm.

Where the norm sits (`model.norm_placement`):
- `pre` (GPT-2 and nearly every model since): x = x + Drop(Attn(Norm(x))); x = x + Drop(FFN(Norm(x))).
  The residual stream itself is never normalised, so gradients reach early layers through an
  identity path; this is what makes deep stacks train without warmup tricks.
- `post` (the original Transformer): x = Norm(x + Drop(Attn(x))); x = Norm(x + Drop(FFN(x))).
  Every block renormalises the stream itself, so its magnitude is reset at each sublayer.

`model.residual=false` (an ablation) drops the `x +` of both formulas: x = Drop(Attn(Norm(x))) and so on.
A block whose sublayers output zero is then no longer the identity but zero: the skip path is what
carries the signal past a sublayer that has nothing to add, and the gradient back to earlier layers.

Dropout (inverted: scaled by 1/(1-p) in training, identity in eval) sits on each sublayer's output
before it joins the residual stream (`dropout_1` after W_O, `dropout_2` after the FFN's down
projection), never on the residual stream itself.
"""

from __future__ import annotations

import torch
from torch import nn

from minigpt.model.attention import CausalSelfAttention
from minigpt.model.config import ModelConfig
from minigpt.model.ffn import MLP
from minigpt.model.norm import build_norm


class Block(nn.Module):
    """x (B, T, C) -> (B, T, C). Submodules: ln_1, attn, dropout_1, ln_2, mlp, dropout_2."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.residual = config.residual
        self.ln_1 = build_norm(config.norm, config.n_embd, config.norm_eps, config.bias, config.norm_gain)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.dropout_1 = nn.Dropout(config.dropout)
        self.ln_2 = build_norm(config.norm, config.n_embd, config.norm_eps, config.bias, config.norm_gain)
        self.mlp = MLP(config)
        self.dropout_2 = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = True,
        kv_cache=None,
        value_embed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The keyword arguments are passed to the attention unchanged (see CausalSelfAttention)."""
        def attn(h: torch.Tensor) -> torch.Tensor:
            return self.attn(h, rope=rope, mask=mask, is_causal=is_causal, kv_cache=kv_cache,
                             value_embed=value_embed)

        if self.pre_norm:
            x = self.skip(x) + self.dropout_1(attn(self.ln_1(x)))
            return self.skip(x) + self.dropout_2(self.mlp(self.ln_2(x)))
        x = self.ln_1(self.skip(x) + self.dropout_1(attn(x)))
        return self.ln_2(self.skip(x) + self.dropout_2(self.mlp(x)))

    def skip(self, x: torch.Tensor) -> torch.Tensor | float:
        """The residual path: x itself, or 0 without it (`model.residual=false`)."""
        return x if self.residual else 0.0
