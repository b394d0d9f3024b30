"""Exact loss and perplexity of a model over a whole text: every token scored once, with a sliding window.

Perplexity is exp(mean cross-entropy per token): the number of equally likely tokens the model is,
on average, choosing between. Training's `val/loss` estimates it from a few fixed batches; this is the
exact number over a whole split or file.

The model can only look back `block_size` tokens. Cutting the text into disjoint windows would give
the first tokens of every window almost no context, so windows slide by `stride` tokens instead:
each window re-reads `block_size - stride` tokens of context and scores only its last `stride`
targets (the first window scores all of its own). Every target is scored exactly once, with at
least `block_size - stride` tokens before it (or all of them, near the start). stride = block_size
is the fast, disjoint-window estimate; stride = 1 gives every token a full context.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.checkpoint.load import load_model
from minigpt.data.config import DataConfig
from minigpt.data.sources import load_corpus
from minigpt.errors import UserError
from minigpt.inspect.config import EvaluateConfig


@dataclass
class Perplexity:
    loss: float  # mean cross-entropy, nats per scored token
    tokens: int  # scored tokens (every token but the first)
    window: int  # the context length used
    stride: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    def summary(self) -> str:
        return (
            f"loss {self.loss:.4f} nats/token, perplexity {self.perplexity:.3f} over {self.tokens:,} tokens "
            f"(window {self.window}, stride {self.stride})"
        )


def document_tokens(texts: Sequence[str], tokenizer) -> torch.Tensor:
    """(N,) int64: each text as [<|endoftext|>, its tokens...], concatenated — the layout training read."""
    ids: list[int] = []
    for encoded in tokenizer.encode_batch(list(texts)):
        ids.append(tokenizer.eot_id)
        ids.extend(encoded)
    return torch.tensor(ids, dtype=torch.long)


def windows(n: int, window: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, scored): inputs tokens[start : end-1], targets tokens[start+1 : end], of which the
    last `scored` are counted. The targets counted are 1..n-1, each exactly once, in order."""
    first = 1  # token 0 has no context, so nothing predicts it
    while first < n:
        end = min(first + (window if first == 1 else stride), n)  # one past the last target
        start = max(0, end - 1 - window)
        yield start, end, end - first
        first = end


@torch.no_grad()
def sliding_window_loss(
    model: nn.Module, tokens: torch.Tensor, *, stride: int | None = None, batch_size: int = 8
) -> Perplexity:
    """Mean cross-entropy of `model` on `tokens` (N,), every target scored once (see the module docstring)."""
    window = model.config.block_size
    stride = window // 2 if stride is None else stride
    if not 1 <= stride <= window:
        raise UserError(f"stride={stride} must be between 1 and the model's context ({window})")
    n = tokens.numel()
    if n < 2:
        raise UserError("the text is too short: it needs at least one token after <|endoftext|>")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, counted = torch.zeros((), dtype=torch.float64), 0
    spans = list(windows(n, window, stride))
    try:
        for i in range(0, len(spans), batch_size):
            batch = spans[i : i + batch_size]  # windows all have one length (only a lone window is shorter)
            x = torch.stack([tokens[s : e - 1] for s, e, _ in batch]).to(device)  # (B, T)
            y = torch.stack([tokens[s + 1 : e] for s, e, _ in batch]).clone()  # (B, T)
            for row, (s, e, scored) in enumerate(batch):
                y[row, : (e - 1 - s) - scored] = -1  # context only: already scored by an earlier window
            logits, _ = model(x)  # (B, T, V)
            nll = F.cross_entropy(
                logits.float().flatten(0, 1), y.to(device).flatten(), ignore_index=-1, reduction="sum"
            )
            total += nll.double().cpu()
            counted += sum(scored for _, _, scored in batch)
    finally:
        model.train(was_training)
    return Perplexity(loss=(total / counted).item(), tokens=counted, window=window, stride=stride)


def evaluate(cfg: EvaluateConfig) -> tuple[Perplexity, str]:
    """Load the checkpoint, tokenise the chosen text with its tokenizer, score it. Returns (result, what)."""
    model, tokenizer, meta = load_model(cfg.checkpoint, cfg.device.type, cfg.weights_dtype)
    if cfg.text_file:
        file = Path(cfg.text_file).expanduser()
        if not file.is_file():
            raise UserError(f"text_file={cfg.text_file} does not exist (give a path to a text file)")
        try:
            texts, what = [file.read_text(encoding="utf-8")], str(file)
        except UnicodeDecodeError:
            raise UserError(f"text_file={cfg.text_file} is not UTF-8 text") from None
    else:
        data = cfg.data
        if data is None:  # the corpus the checkpoint was trained on
            try:
                data = DataConfig(**meta["config"]["data"])
            except (KeyError, TypeError):
                raise UserError("the checkpoint records no training corpus; pass data=<option>") from None
        docs = list(load_corpus(data, Path(data.cache_dir)).documents(cfg.split))
        texts, what = [d.text for d in docs], f"{data.source} {cfg.split} split ({len(docs)} documents)"
    tokens = document_tokens(texts, tokenizer)
    if cfg.max_tokens is not None:
        tokens = tokens[: cfg.max_tokens]
    return sliding_window_loss(model, tokens, stride=cfg.stride, batch_size=cfg.batch_size), what
