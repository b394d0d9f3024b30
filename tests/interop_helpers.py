"""Shared helpers of the interop tests: small checkpoints of the shapes every export is checked on.

    gpt2_block  GPT-2's block (learned positions, LayerNorm, tanh GELU, biases, tied head)
    odd_gpt2    GPT-2's block at an odd width: 3 heads of 16, hidden 120, no biases, untied head
    demo        configs/model/demo.yaml exactly: RoPE, RMSNorm, SwiGLU, 1 KV head for 3 query heads, untied
    odd_llama   a Llama block at odd sizes: 6 heads of 10 sharing 2 KV heads, hidden 120, biases, rope base
                500, eps 1e-6, tied, and a model vocabulary 7 ids larger than the tokenizer's
    qwen3       Qwen3's block: the demo with its queries and keys RMS-normalised (model.qk_norm=true), at
                odd sizes: 4 heads of 12 sharing 2 KV heads, eps 1e-6, tied
    arcee       Arcee's block: the demo with a two-matrix ReLU² MLP (model.activation=relu2), 2 layers, 4
                heads of 8 sharing 2 KV heads, hidden 96

Weights are re-drawn wide (`wide_model`) so a wrong mapping shows in the logits and greedy decoding wanders
through the vocabulary; the tokenizer is a small bpe trained on a few standard-library modules.
"""

from __future__ import annotations

import dataclasses
import functools
import sysconfig
from pathlib import Path

import torch
from model_helpers import load_preset, tiny_config

from minigpt.checkpoint.format import save_checkpoint
from minigpt.data.tokenizers import TiktokenTokenizer, Tokenizer, train_bpe
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT

STDLIB = Path(sysconfig.get_paths()["stdlib"])
BPE_VOCAB = 512
SHAPES = {
    "gpt2_block": tiny_config(n_layer=2, n_head=4, n_embd=64, block_size=128, activation="gelu_tanh"),
    "odd_gpt2": tiny_config(n_layer=3, n_head=3, n_embd=48, block_size=112, activation="gelu_tanh",
                            ffn_mult=2.5, bias=False, tie_weights=False),
    "demo": load_preset("demo"),
    "odd_llama": ModelConfig(n_layer=3, n_head=6, n_kv_head=2, n_embd=60, block_size=112,
                             pos_encoding="rope", rope_base=500.0, norm="rmsnorm", norm_eps=1e-6,
                             activation="swiglu", ffn_mult=3.0, bias=True, tie_weights=True,
                             vocab_size=BPE_VOCAB + 7),
    "qwen3": dataclasses.replace(load_preset("demo"), qk_norm=True, n_layer=3, n_head=4, n_kv_head=2,
                                 n_embd=48, norm_eps=1e-6, tie_weights=True),
    "arcee": dataclasses.replace(load_preset("demo"), activation="relu2", n_layer=2, n_head=4, n_kv_head=2,
                                 n_embd=32, ffn_mult=3.0),
}
LLAMA_SHAPES = ("demo", "odd_llama", "qwen3", "arcee")  # rotary positions


def stdlib_texts() -> list[str]:
    """A few standard-library modules: real Python, present wherever Python is."""
    files = sorted((STDLIB / "json").glob("*.py")) + sorted((STDLIB / "email").glob("*.py"))
    return [f.read_text(encoding="utf-8") for f in files]


@functools.cache
def small_bpe() -> TiktokenTokenizer:
    return train_bpe(stdlib_texts(), BPE_VOCAB)


def wide_model(cfg: ModelConfig, vocab_size: int, seed: int = 0) -> GPT:
    """Matrices N(0, 0.2), norm scales N(1, 0.1), biases N(0, 0.1): logits of std ~1.5 whose greedy sequences
    wander (norm scales drawn around 0 instead would silence the blocks and decode one token forever)."""
    torch.manual_seed(seed)
    model = build_model(cfg, vocab_size).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:
                norm = ".ln_" in f".{name}" or "_norm." in name  # ln_1, ln_f, the query and key norms
                p.normal_(1.0 if norm and name.endswith("weight") else 0.0, 0.1)
    return model


def save_model(folder: Path, model: GPT, tokenizer: Tokenizer) -> Path:
    """A checkpoint folder (weights, meta.json, tokenizer/) the way an import writes one."""
    model_config = dataclasses.asdict(model.config)
    meta = {"model_config": model_config, "config": {"model": model_config}, "step": 0}
    return save_checkpoint(folder, model, {"step": 0}, meta, tokenizer)


def make_checkpoint(folder: Path, shape: str, tokenizer: Tokenizer | None = None) -> tuple[Path, GPT]:
    tokenizer = tokenizer or small_bpe()
    model = wide_model(SHAPES[shape], tokenizer.vocab_size)
    return save_model(folder, model, tokenizer), model
