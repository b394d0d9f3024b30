"""Scoring a model on text: loss, perplexity and bits per byte, the numbers runs are compared on.

`score_batches` is the one scoring function: training's validation (training/evaluation.py, on the fixed
windows of data/eval_windows.py) and `scripts/evaluate.py` (`evaluate` below) both call it, so the same
windows give the same number. It adds up, over every scored target,

    nats    the cross-entropy -ln p(target | context), summed     loss = nats / tokens  (token-weighted)
    tokens  how many targets were scored                           perplexity = exp(loss)
    bytes   the UTF-8 bytes of the targets' text                   bits per byte = nats / ln 2 / bytes

Perplexity is the number of equally likely tokens the model is, on average, choosing between; it depends
on the tokenizer (a byte model chooses among 257 ids, a BPE model among thousands, per a different amount
of text). Bits per byte divides the same total surprise by the length of the text instead, so a bpe, char
or byte model, or two vocabulary sizes, can be compared on it. <|endoftext|> targets count 0 bytes: they
are document boundaries, not text (`Tokenizer.token_byte_lengths`).

`evaluate` scores a whole split or file with a sliding window. The model can only look back
`block_size` tokens, and cutting the text into disjoint windows would give the first tokens of every
window almost no context, so windows slide by `stride` tokens instead: each window re-reads
`block_size - stride` tokens of context and scores only its last `stride` targets (the first window
scores all of its own). Every target is scored exactly once, with at least `block_size - stride` tokens
before it (or all of them, near the start). stride = block_size is the disjoint-window layout training's
`trainer.eval_tokens=all` scores; stride = 1 gives every token a full context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from minigpt.checkpoint.load import load_model
from minigpt.data.config import DataConfig
from minigpt.data.eval_windows import IGNORE_INDEX
from minigpt.data.sources import load_corpus
from minigpt.device.allocator import keep_freed_memory
from minigpt.errors import UserError
from minigpt.inspect.config import EvaluateConfig

log = logging.getLogger(__name__)
LN2 = math.log(2.0)


@dataclass
class Score:
    """Sums over scored targets; add two (e.g. of two ranks' shares) with `+`."""

    nats: float  # summed cross-entropy, natural log
    tokens: int  # scored targets
    bytes: int  # UTF-8 bytes of their text (0 when no byte table was given)

    def __add__(self, other: Score) -> Score:
        return Score(self.nats + other.nats, self.tokens + other.tokens, self.bytes + other.bytes)

    @property
    def loss(self) -> float:
        """Mean cross-entropy per scored token (every token weighs the same, whatever its batch)."""
        return self.nats / self.tokens if self.tokens else math.nan

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))  # capped: exp overflows a float beyond ~709

    @property
    def bpb(self) -> float:
        """Bits per UTF-8 byte of the scored text."""
        return self.nats / LN2 / self.bytes if self.bytes else math.nan


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # x, y, target_bytes: (b, T) each


@torch.no_grad()
def score_batches(
    model: nn.Module, batches: Iterable[Batch],
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Score:
    """Score `batches` of (x, y, target_bytes), all (b, T) on the model's device; y = IGNORE_INDEX (-1)
    marks context-only positions, whose target bytes are 0. Eval mode (no dropout); the mode is restored.

    The loss comes from the model's fused head (`return_logits=False`: no (b, T, V) logits are kept) as the
    mean over a batch's scored targets, times their count. Sums stay on the device (float64, except on MPS,
    which has none): one host sync at the end.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64
    nats = torch.zeros((), dtype=acc_dtype, device=device)
    tokens = torch.zeros((), dtype=torch.long, device=device)
    nbytes = torch.zeros((), dtype=torch.long, device=device)
    try:
        for x, y, target_bytes in batches:
            with autocast():
                _, mean_loss = model(x, y, return_logits=False)  # scalar: mean over y != -1
            scored = (y != IGNORE_INDEX).sum()
            nats += mean_loss.to(acc_dtype) * scored
            tokens += scored
            nbytes += target_bytes.sum()
    finally:
        model.train(was_training)
    return Score(nats.item(), int(tokens.item()), int(nbytes.item()))


@dataclass
class Perplexity:
    """What `evaluate` reports: the score, and the windows it was computed with."""

    score: Score
    window: int  # the context length used
    stride: int

    @property
    def loss(self) -> float:
        return self.score.loss

    @property
    def tokens(self) -> int:  # scored tokens (every token but the first)
        return self.score.tokens

    @property
    def perplexity(self) -> float:
        return self.score.perplexity

    @property
    def bpb(self) -> float:
        return self.score.bpb

    def summary(self) -> str:
        bpb = f", {self.bpb:.4f} bits/byte over {self.score.bytes:,} bytes" if self.score.bytes else ""
        return (
            f"loss {self.loss:.4f} nats/token, perplexity {format_perplexity(self.perplexity, 3)} over "
            f"{self.tokens:,} tokens"
            f"{bpb} (window {self.window}, stride {self.stride})"
        )


def format_perplexity(ppl: float, decimals: int = 1) -> str:
    """exp(loss) for a log line: fixed-point while it is readable, else in exponent form (a diverged model's
    exp(700) would be 305 digits)."""
    return f"{ppl:.{decimals}f}" if ppl < 1e6 else f"{ppl:.3g}"


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


def sliding_window_loss(
    model: nn.Module, tokens: torch.Tensor, *, stride: int | None = None, batch_size: int = 8,
    token_bytes: np.ndarray | None = None,
) -> Perplexity:
    """Score `model` on `tokens` (N,), every target once (see the module docstring). `token_bytes` (V,):
    the tokenizer's `token_byte_lengths()`, for bits per byte (None: no bytes are counted)."""
    window = model.config.block_size
    stride = window // 2 if stride is None else stride
    if not 1 <= stride <= window:
        raise UserError(f"stride={stride} must be between 1 and the model's context ({window})")
    n = tokens.numel()
    if n < 2:
        raise UserError("the text is too short: it needs at least one token after <|endoftext|>")
    device = next(model.parameters()).device
    byte_table = torch.as_tensor(token_bytes if token_bytes is not None else np.zeros(0), dtype=torch.long)
    spans = list(windows(n, window, stride))

    def batches() -> Iterator[Batch]:
        for i in range(0, len(spans), batch_size):
            batch = spans[i : i + batch_size]  # windows all have one length (only a lone window is shorter)
            x = torch.stack([tokens[s : e - 1] for s, e, _ in batch])  # (B, T)
            y = torch.stack([tokens[s + 1 : e] for s, e, _ in batch]).clone()  # (B, T)
            for row, (s, e, scored) in enumerate(batch):
                y[row, : (e - 1 - s) - scored] = IGNORE_INDEX  # context only: an earlier window scored it
            scored = y != IGNORE_INDEX
            nbytes = byte_table[y.clamp(min=0)] * scored if len(byte_table) else torch.zeros_like(y)
            yield x.to(device), y.to(device), nbytes.to(device)

    return Perplexity(score_batches(model, batches()), window=window, stride=stride)


def recorded_corpus(meta: dict) -> DataConfig:
    """The corpus a checkpoint was trained on, from its meta.json. Keys this minigpt no longer has (a
    checkpoint from before a data option was renamed, e.g. num_threads) are dropped, with a log line."""
    try:
        recorded = dict(meta["config"]["data"])
    except (KeyError, TypeError):
        raise UserError("the checkpoint records no training corpus; pass data=<option>") from None
    known = {f.name for f in dataclasses.fields(DataConfig)}
    if dropped := sorted(set(recorded) - known):
        log.info("ignoring data keys this minigpt does not have: %s", ", ".join(dropped))
    return DataConfig(**{k: v for k, v in recorded.items() if k in known})


def evaluate(cfg: EvaluateConfig) -> tuple[Perplexity, str]:
    """Load the checkpoint, tokenise the chosen text with its tokenizer, score it. Returns (result, what)."""
    model, tokenizer, meta = load_model(cfg.checkpoint, cfg.device.type, cfg.weights_dtype)
    if next(model.parameters()).device.type == "cpu":  # each batch frees the logits the next one allocates
        log.info("memory: %s", keep_freed_memory())
    if cfg.text_file:
        file = Path(cfg.text_file).expanduser()
        if not file.is_file():
            raise UserError(f"text_file={cfg.text_file} does not exist (give a path to a text file)")
        try:
            texts, what = [file.read_text(encoding="utf-8")], str(file)
        except UnicodeDecodeError:
            raise UserError(f"text_file={cfg.text_file} is not UTF-8 text") from None
    else:
        data = cfg.data if cfg.data is not None else recorded_corpus(meta)
        docs = list(load_corpus(data, Path(data.cache_dir)).documents(cfg.split))
        texts, what = [d.text for d in docs], f"{data.source} {cfg.split} split ({len(docs)} documents)"
    tokens = document_tokens(texts, tokenizer)
    if cfg.max_tokens is not None:
        tokens = tokens[: cfg.max_tokens]
    return sliding_window_loss(model, tokens, stride=cfg.stride, batch_size=cfg.batch_size,
                               token_bytes=tokenizer.token_byte_lengths()), what
