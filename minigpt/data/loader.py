"""Batches of token windows from the prepared .bin files.

Training draws random windows: B start offsets, each window T+1 tokens long, so that the inputs
are the first T tokens and the targets the same window shifted by one:

    window  t0 t1 t2 ... tT        x = window[:-1]   (B, T)
                                   y = window[1:]    (B, T)   y[b, i] is the token after x[b, i]

The offsets come from a `torch.Generator` seeded from (seed, rank), so every rank of a
distributed run draws its own stream, and the same seed always gives the same batches. Its state
is part of `state_dict()`, so a resumed run continues the exact sequence of batches.

Evaluation walks the split in order instead (`iter_eval_batches`), so a val loss is exact and
repeatable rather than a random estimate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minigpt.data.prepare import DTYPES, META_FILE
from minigpt.errors import UserError


def open_tokens(bin_path: Path, dtype: str | None = None) -> np.memmap:
    """Memory-map a token file; its dtype comes from the meta.json beside it unless given.

    One memmap is kept open for the loader's life: the OS pages the file in on demand and can
    drop those pages again, so even a corpus larger than RAM costs only what is being read.
    """
    bin_path = Path(bin_path)
    if not bin_path.is_file():
        raise UserError(f"token file {bin_path} does not exist; prepare the data (scripts/prepare_data.py)")
    if dtype is None:
        meta_path = bin_path.parent / META_FILE
        if not meta_path.is_file():
            raise UserError(f"no {META_FILE} beside {bin_path} to read its dtype; prepare the data again")
        dtype = json.loads(meta_path.read_text(encoding="utf-8"))["dtype"]
    return np.memmap(bin_path, dtype=DTYPES[dtype], mode="r")


def _check_length(tokens: np.ndarray, bin_path: Path, block_size: int) -> None:
    if len(tokens) < block_size + 1:
        raise UserError(
            f"{bin_path} has {len(tokens)} tokens, fewer than block_size + 1 = {block_size + 1}; "
            "lower model.block_size or use a larger corpus / larger data.val_ratio"
        )


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        # Page-locked memory lets the copy run asynchronously, overlapping the previous step.
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def stream_seed(seed: int, rank: int) -> int:
    """A 64-bit seed for rank `rank` of a run seeded `seed`. SeedSequence mixes both numbers, so
    nearby seeds or ranks still give unrelated streams (seed + rank would make (1, 0) == (0, 1))."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, dtype=np.uint64)[0])


class BatchLoader:
    """Random (B, T) input/target batches from one token file, for one rank.

    `world_size` only validates `rank`: random windows need no sharding, since each rank's stream
    is independent. On CUDA the batch is pinned and copied with non_blocking=True.
    """

    def __init__(
        self,
        bin_path: Path,
        block_size: int,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        dtype: str | None = None,
    ):
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size={block_size} and batch_size={batch_size} must be positive")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.bin_path = Path(bin_path)
        self.block_size, self.batch_size = block_size, batch_size
        self.seed, self.rank = seed, rank
        self.device = torch.device(device)
        self.tokens = open_tokens(self.bin_path, dtype)
        _check_length(self.tokens, self.bin_path, block_size)
        self.generator = torch.Generator().manual_seed(stream_seed(seed, rank))
        self.batches_drawn = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (B, T) int64 on the loader's device, with y[:, i] == x[:, i + 1] inside the window."""
        T = self.block_size
        # A window starting at s reads s .. s+T, so the last valid start is len - T - 1.
        starts = torch.randint(len(self.tokens) - T, (self.batch_size,), generator=self.generator)
        windows = np.stack([self.tokens[s : s + T + 1] for s in starts.tolist()])  # (B, T+1)
        windows = torch.from_numpy(windows.astype(np.int64))
        self.batches_drawn += 1
        # contiguous copies: callers may .view(-1) the targets for the loss
        x = windows[:, :-1].contiguous()  # (B, T)
        y = windows[:, 1:].contiguous()  # (B, T)
        return _to_device(x, self.device), _to_device(y, self.device)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same batch sequence (safe for torch.load(weights_only=True))."""
        return {
            "seed": self.seed,
            "rank": self.rank,
            "batches_drawn": self.batches_drawn,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`. A state saved by this (seed, rank) restores the generator directly;
        one saved by another rank (e.g. only rank 0 saves) is replayed on this rank's own stream, by
        drawing `batches_drawn` offsets -- the window reads are skipped, so that is fast."""
        self.batches_drawn = int(state["batches_drawn"])
        if state["seed"] == self.seed and state["rank"] == self.rank:
            self.generator.set_state(state["generator"])
            return
        self.generator.manual_seed(stream_seed(self.seed, self.rank))
        for _ in range(self.batches_drawn):
            torch.randint(len(self.tokens) - self.block_size, (self.batch_size,), generator=self.generator)


def iter_eval_batches(
    bin_path: Path,
    block_size: int,
    batch_size: int,
    device: str | torch.device = "cpu",
    max_batches: int | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    dtype: str | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The split in order as non-overlapping windows: window k is tokens[kT : kT+T+1], so every
    token (except a final stub shorter than a window) is predicted exactly once.

    Batches hold up to B windows (the last may hold fewer). `max_batches` keeps the first ones.
    With several ranks, batch i goes to rank i % world_size; sum loss*tokens and tokens over ranks.
    """
    bin_path = Path(bin_path)
    tokens = open_tokens(bin_path, dtype)
    _check_length(tokens, bin_path, block_size)
    device = torch.device(device)
    T = block_size
    n_windows = (len(tokens) - 1) // T
    n_batches = -(-n_windows // batch_size)  # ceil
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for i in range(rank, n_batches, world_size):
        first = i * batch_size
        count = min(batch_size, n_windows - first)
        flat = np.asarray(tokens[first * T : (first + count) * T + 1], dtype=np.int64)
        # Windows overlap by one token (the last target of one is the first input of the next).
        x = torch.from_numpy(flat[:-1].reshape(count, T))  # (b, T)
        y = torch.from_numpy(flat[1:].reshape(count, T))  # (b, T)
        yield _to_device(x, device), _to_device(y, device)
