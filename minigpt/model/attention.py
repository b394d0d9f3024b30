"""Causal multi-head self-attention, with three interchangeable backends.

One fused linear `c_attn` produces queries, keys and values for every head at once; they are split
into heads, scored with q·kᵀ/√D, masked so no token sees its future, turned into probabilities by a
softmax over each row, used to average the values, and the heads are concatenated back and mixed
by the output projection `c_proj` (W_O).

Backends (`model.attention`), which must agree numerically (the tests compare them):
- `math`: every step written out; the only one that can hand back the probabilities.
- `sdpa`: torch's fused `scaled_dot_product_attention` (flash / memory-efficient kernels on GPU).
- `online`: streams over key/value blocks with a running softmax (online_softmax.py); never
  materialises the (T, S) score matrix.
A decode step (one new query per row on a KV cache) may instead be handed any function that computes the
same attention for one query (`decode_attention`); the prefill keeps the model's own backend.

Grouped-query attention: with H_kv < H key/value heads, query head h uses key/value head
h // (H / H_kv). The KV cache stores only H_kv heads, so it shrinks by H / H_kv.

Two ablation switches reach this file, and every backend honours both: `model.attn_scale=none`
(scores are q·kᵀ, `scale=1.0`; the default `scale=None` means 1/√D) and `model.causal=false`, which
arrives as `is_causal=False` with no mask: every query then sees every key, future ones included.
GPT.forward decides when that happens (training mode only).

Two technique switches change what enters the scores and the weighted sum, before any backend (and
before the KV cache, which therefore stores the changed keys and values):
- `model.qk_norm`: q and k are RMS-normalised per head (each with a learned gain per channel, none with
  `model.norm_gain=false`) and multiplied by `model.qk_scale`, so a score is a cosine similarity times the
  gains' product and can no longer grow without bound with the weights' scale. RoPE rotates pairs of
  channels, which keeps their norm, so normalising before it is the same as after it.
- `model.value_embeds`: each layer's values get a token-indexed vector added, v += g · e[token], where e
  is the layer's own table (GPT owns the tables and passes the rows in as `value_embed`) and
  g = m·sigmoid(x W_g) is one gate per key/value head, read from the block's input (its first
  `model.ve_gate_channels` channels; m = `model.ve_gate_max`, 2 by default, so that g = 1 at W_g = 0).
  The table gives every layer direct access to the token's identity. With `model.value_embed_every=k`
  only every k-th layer has a table (and a gate), counted back from the last.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.model.config import ModelConfig
from minigpt.model.online_softmax import online_attention
from minigpt.model.rope import apply_rope

# The attention of one new query per row and head on a KV cache: q (B, H, 1, D), k/v (B, H_kv, S, D), the
# cache's mask (broadcastable to (B, 1, 1, S), True = may attend) or None, the scores' scale (None: 1/√D)
# -> (B, H, 1, D)
OneQueryAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float | None],
                             torch.Tensor]


def causal_mask(t: int, s: int, device: torch.device) -> torch.Tensor:
    """(T, S) boolean, True where query i may attend to key j: the last T of S positions are queries."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, H_kv, S, D) -> (B, H_kv * n_rep, S, D): each key/value head serves n_rep query heads."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout: nn.Module | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit reference. q (B, H, T, D), k/v (B, H_kv, S, D), mask broadcastable to (B, H, T, S)
    with True = may attend; scale multiplies the scores (None: 1/√D). Returns the output (B, H, T, D)
    and the probabilities (B, H, T, S)."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)
    # divide by √D: with unit-variance q and k the dot product has variance D, and a softmax of such
    # wide scores saturates to one-hot rows whose gradients vanish
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if is_causal:
        mask = causal_mask(q.shape[2], k.shape[2], q.device)  # (T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # softmax turns -inf into exactly 0
    # torch.softmax subtracts each row's max first, so huge scores cannot overflow exp
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, T, S), rows sum to 1
    weights = dropout(probs) if dropout is not None else probs
    return weights @ v, probs  # (B, H, T, D)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float | None = None,
) -> torch.Tensor:
    """torch's fused kernel; same arguments and (B, H, T, D) output as `math_attention`."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )


class CausalSelfAttention(nn.Module):
    """x (B, T, C) -> (B, T, C). Parameters: c_attn (C -> (H + 2·H_kv)·D), c_proj = W_O (C -> C).

    Dropout after W_O is applied by the block (block.py), so this module's output is the bare W_O y.
    Set `record_probs = True` to run the math backend and keep the probabilities in `self.probs`
    (GPT.attention_probs does this for inspection).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # which slot of the KV cache is ours
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        qkv_width = (self.n_head + 2 * self.n_kv_head) * self.head_dim  # 3C without GQA
        self.c_attn = nn.Linear(config.n_embd, qkv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=config.norm_eps, elementwise_affine=config.norm_gain)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=config.norm_eps, elementwise_affine=config.norm_gain)
            self.qk_scale = config.qk_scale
        if config.has_value_embed(layer_idx):
            self.ve_gate_channels = config.ve_gate_channels or config.n_embd
            self.ve_gate_max = config.ve_gate_max
            self.ve_gate = nn.Linear(self.ve_gate_channels, self.n_kv_head, bias=False)  # init.py draws it
        self.attn_drop = nn.Dropout(config.attn_dropout)  # on the probabilities; p = 0 by default
        self.backend = config.attention
        # a decode step's attention, when one is handed in (any function computing the same); None: `backend`
        self.decode_attention: OneQueryAttention | None = None
        self.scale = None if config.attn_scale == "sqrt" else 1.0  # None: every backend's 1/√D
        self.online_block_size = config.online_block_size
        self.record_probs = False
        self.probs: torch.Tensor | None = None

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
        """rope: (cos, sin) from RotaryEmbedding at this call's positions, or None.
        mask: (B, 1, T, S) boolean from the KV cache, or None. is_causal: apply the plain causal mask
        (the caller sets it only when keys are exactly this call's tokens, T == S); False with no mask
        lets every query see every key (the `model.causal=false` ablation, in training mode).
        kv_cache: a KVCache; our new K/V are written into it and we attend over everything it holds.
        value_embed: (B, T, H_kv·D), this layer's value-embedding rows for the tokens (model.value_embeds)."""
        B, T, C = x.shape
        H, H_kv, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split([H * D, H_kv * D, H_kv * D], dim=2)  # (B, T, H·D), (B, T, H_kv·D) x2
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        v = v.view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        if value_embed is not None:
            gate = self.ve_gate(x[..., :self.ve_gate_channels])  # (B, T, H_kv)
            gate = self.ve_gate_max * torch.sigmoid(gate).transpose(1, 2).unsqueeze(-1)  # (B, H_kv, T, 1)
            v = v + gate * value_embed.view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # (B, H, T, D), (B, H_kv, T, D): unit RMS per head
            if self.qk_scale != 1.0:
                q, k = q * self.qk_scale, k * self.qk_scale
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_idx, k, v)  # (B, H_kv, S, D): cached + new
        if kv_cache is not None and T == 1 and self.decode_attention is not None:  # a decode step's one query
            y = self.decode_attention(q, k, v, mask, self.scale)  # (B, H, 1, D)
        else:
            y = self._attend(q, k, v, mask, is_causal, self.backend)  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads concatenated
        return self.c_proj(y)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                is_causal: bool, backend: str) -> torch.Tensor:
        p_drop = self.attn_drop.p if self.training else 0.0
        if self.record_probs or backend == "math":
            dropout = self.attn_drop if p_drop > 0 else None
            y, probs = math_attention(q, k, v, mask, is_causal, dropout, self.scale)
            self.probs = probs.detach() if self.record_probs else None
            return y
        if backend == "sdpa":
            return sdpa_attention(q, k, v, mask, is_causal, p_drop, self.scale)
        return online_attention(
            q, k, v, mask=mask, is_causal=is_causal, block_size=self.online_block_size,
            dropout=self.attn_drop if p_drop > 0 else None, scale=self.scale,
        )
