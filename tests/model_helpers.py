"""Shared helpers of the model tests: the real presets, shrunk to test size, and a small learnable process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf

from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT

PRESET_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"
PRESETS = ("tiny", "small", "gpt2", "seed", "modern")
VOCAB = 61  # odd on purpose: no shape may silently depend on a round vocabulary
# GPT-2's block at the `tiny` size (configs/model/tiny.yaml): learned positions, pre-norm LayerNorm, GELU,
# tied embeddings, biases, plain multi-head attention.
TINY = dict(n_layer=4, n_head=4, n_kv_head=None, n_embd=128, pos_encoding="learned", norm="layernorm",
            activation="gelu", bias=True, tie_weights=True)


def tiny_config(**overrides) -> ModelConfig:
    """The `tiny` preset's GPT-2 block, with `overrides` (any ModelConfig field)."""
    return ModelConfig(**{**TINY, **overrides})


def load_preset(name: str) -> ModelConfig:
    """The preset exactly as the YAML file defines it (vocab_size still null)."""
    return ModelConfig(**OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml"), resolve=True))


def shrunk_config(name: str, **overrides) -> ModelConfig:
    """A preset with its architecture kept (positions, norm, placement, activation, GQA, bias, tying)
    and its sizes cut to test scale: 2 layers, 32 wide, 4 heads, context 16, no dropout."""
    raw = OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml"), resolve=True)
    raw.update(n_layer=2, n_embd=32, n_head=4, block_size=16, vocab_size=VOCAB, dropout=0.0)
    if raw.get("n_kv_head") is not None:
        raw["n_kv_head"] = 2  # keep grouped-query attention: 2 query heads per key/value head
    raw.update(overrides)
    return ModelConfig(**raw)


def shrunk_model(name: str, **overrides) -> GPT:
    return build_model(shrunk_config(name, **overrides)).eval()


def assert_backends_agree(models: list[GPT], idx: torch.Tensor) -> None:
    """Models with the same weights and different attention backends give the first one's logits and the
    gradient of its first layer's qkv weight, for a training step on idx (B, T) predicting itself."""
    outs = []
    for m in models:
        logits, loss = m(idx, idx)
        loss.backward()
        outs.append((logits, m.transformer.h[0].attn.c_attn.weight.grad))
    for logits, grad in outs[1:]:
        torch.testing.assert_close(logits, outs[0][0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(grad, outs[0][1], atol=2e-5, rtol=1e-4)


def mute(model: GPT, layer: int, heads: list[int]) -> GPT:
    """A copy in eval mode with the given heads' columns of W_O (c_proj) zeroed: their outputs never reach
    the residual stream."""
    muted = build_model(model.config).eval()
    muted.load_state_dict(model.state_dict())
    D = model.config.head_dim
    with torch.no_grad():
        for h in heads:
            muted.transformer.h[layer].attn.c_proj.weight[:, h * D : (h + 1) * D] = 0.0
    return muted


# ---------------------------------------------------------------------------------------- a learnable process

WALK_V, WALK_T, LAG = 16, 32, 2


def walk(n_seq: int, seed: int) -> torch.Tensor:
    """(n_seq, T+1) two interleaved random walks on a ring of 16 tokens: x_t = x_{t-2} + 1 (p = 3/4) or
    + 2 (p = 1/4). Predicting x_{t+1} needs x_{t-1}, one token back, so attention has work to do.

    A causal model can do no better than the step's entropy (after two random tokens), and its greedy
    continuation takes the +1 steps; a model that sees the next token can drive its loss to 0 by copying.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, WALK_V, (n_seq, WALK_T + 1), generator=g)
    steps = 1 + (torch.rand(n_seq, WALK_T + 1, generator=g) < 0.25).long()
    for t in range(LAG, WALK_T + 1):
        x[:, t] = (x[:, t - LAG] + steps[:, t]) % WALK_V
    return x


def fit(model: GPT, batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], steps: int, lr: float = 1e-2,
        weight_decay: float = 0.0) -> float:
    """Train `model` (in training mode) with AdamW on `batch(step)` = (inputs, targets) for `steps` steps;
    returns the last training loss. The model is left in training mode."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    for step in range(steps):
        _, loss = model(*batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()


def walk_batch(n_seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh walks as (inputs, next-token targets), each (n_seq, WALK_T)."""
    seq = walk(n_seq, seed)
    return seq[:, :-1], seq[:, 1:]
