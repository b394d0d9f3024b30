"""A fixed set of validation windows spread over the whole split, and batches of them with the bytes of
every scored target (for bits per byte).

A window starting at s reads tokens[s : s+T+1]: inputs tokens[s : s+T], targets tokens[s+1 : s+T+1].
`eval_windows(n_tokens, T, max_tokens)` chooses the starts from the split's length alone, so they are the
same at every evaluation and in every run on the same data:

    max_tokens=None   every target 1..N-1 scored exactly once: disjoint windows at 0, T, 2T, ..., plus, when
                      N-1 is not a multiple of T, one last window ending at the split's end (start N-1-T)
                      that scores only its last (N-1) mod T targets, the rest of it being context that an
                      earlier window scored. This is the layout `scripts/evaluate.py stride=<block_size>`
                      scores (`minigpt.inspect.perplexity.windows`).
    max_tokens=M      k = max(2, M // T) whole windows, evenly spaced from start 0 to start N-1-T:
                      s_i = floor(i * (N-1-T) / (k-1)), so the first and the last document are both scored.
                      Starts are at least floor((N-1-T) / (k-1)) >= T apart when k <= (N-1) // T: windows
                      never overlap. A budget that needs more windows than that gets the whole split.

`eval_batches` reads them in order, B at a time, as `EvalBatch(x, y, target_bytes)`; unscored targets are
IGNORE_INDEX in `y` (`F.cross_entropy(..., ignore_index=IGNORE_INDEX)`, as `GPT.forward` does) and 0 in
`target_bytes`. Bits per byte over a set of batches: sum of the nats of the scored targets / ln 2 /
sum of `target_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from minigpt.data.loader import check_length, to_device
from minigpt.data.shards import TokenSplit
from minigpt.errors import UserError

IGNORE_INDEX = -1  # the target value that cross-entropy skips (GPT.forward's ignore_index)


@dataclass(frozen=True)
class EvalWindows:
    """Where the evaluation windows of a split start, and how many targets of each are scored."""

    starts: np.ndarray  # (W,) int64, increasing: window w reads tokens[starts[w] : starts[w] + T + 1]
    scored: np.ndarray  # (W,) int64: the last scored[w] targets of window w count (T, except a final stub)
    block_size: int  # T

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def n_targets(self) -> int:
        """Targets scored over all windows (N - 1 for the whole split)."""
        return int(self.scored.sum())


@dataclass(frozen=True)
class EvalBatch:
    x: torch.Tensor  # (b, T) int64 inputs
    y: torch.Tensor  # (b, T) int64 targets; IGNORE_INDEX where the target is context only
    target_bytes: torch.Tensor  # (b, T) int64: UTF-8 bytes of each scored target (0 if unscored or a special)


def eval_windows(n_tokens: int, block_size: int, max_tokens: int | None = None) -> EvalWindows:
    """The evaluation windows of a split of `n_tokens` tokens (see the module docstring).

    `max_tokens=None` scores the whole split; otherwise about `max_tokens` targets, in at least two
    windows. Raises UserError when the split is shorter than one window (block_size + 1 tokens).
    """
    T = block_size
    if T < 1:
        raise ValueError(f"block_size={block_size} must be positive")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be positive, or None for the whole split")
    if n_tokens < T + 1:
        raise UserError(f"the validation split has {n_tokens} tokens, fewer than block_size + 1 = {T + 1}; "
                        "lower model.block_size or use a larger corpus / larger data.val_ratio")
    full = (n_tokens - 1) // T  # disjoint whole windows that fit
    rest = (n_tokens - 1) - full * T  # targets after them
    k = None if max_tokens is None else max(2, max_tokens // T)
    if k is None or k > full:  # the whole split, end to end
        starts = np.arange(full, dtype=np.int64) * T
        scored = np.full(full, T, dtype=np.int64)
        if rest:
            starts = np.append(starts, n_tokens - 1 - T)
            scored = np.append(scored, rest)
        return EvalWindows(starts, scored, T)
    last = n_tokens - 1 - T  # the last valid start: its window ends with the split's last token
    starts = np.arange(k, dtype=np.int64) * last // (k - 1)  # exact integer floor(i * last / (k-1))
    return EvalWindows(starts, np.full(k, T, dtype=np.int64), T)


def eval_batches(
    split: TokenSplit,
    windows: EvalWindows,
    batch_size: int,
    *,
    token_bytes: np.ndarray,
    device: str | torch.device = "cpu",
) -> Iterator[EvalBatch]:
    """The windows of `split` in order, up to `batch_size` per batch (the last may hold fewer).

    `token_bytes` is the tokenizer's `token_byte_lengths()` (V,). Every rank can read the same batches:
    they are fixed, so sharding them is the caller's choice (e.g. batch i on rank i % world_size).
    """
    check_length(split, windows.block_size)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be positive")
    device = torch.device(device)
    T = windows.block_size
    for i in range(0, len(windows), batch_size):
        starts, scored = windows.starts[i : i + batch_size], windows.scored[i : i + batch_size]
        rows = np.stack([split.read(int(s), T + 1) for s in starts]).astype(np.int64)  # (b, T+1)
        x = rows[:, :-1]  # (b, T)
        y = rows[:, 1:].copy()  # (b, T)
        context = np.arange(T)[None, :] < (T - scored)[:, None]  # (b, T): True where already scored
        nbytes = token_bytes[y]  # (b, T)
        nbytes[context] = 0
        y[context] = IGNORE_INDEX
        x, y, nbytes = (to_device(torch.from_numpy(np.ascontiguousarray(a)), device) for a in (x, y, nbytes))
        yield EvalBatch(x, y, nbytes)
