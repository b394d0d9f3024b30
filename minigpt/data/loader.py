"""Random training batches of token windows from a split (all of its shards, read as one stream).

B start offsets are drawn per batch, each window T+1 tokens long, so that the inputs are the first T
tokens and the targets the same window shifted by one:

    window  t0 t1 t2 ... tT        x = window[:-1]   (B, T)
                                   y = window[1:]    (B, T)   y[b, i] is the token after x[b, i]

Every start in 0 .. N-T-1 of the split's N tokens is equally likely, whichever shard it falls in, and a
window may run across a shard boundary. The offsets come from a `torch.Generator` seeded from (seed,
rank), so every rank of a distributed run draws its own stream, and the same seed always gives the same
batches. Its state is part of `state_dict()`, so a resumed run continues the exact sequence of batches.
A batch-size warmup (training/batch_schedule.py) gives the loader the number of windows of each batch,
`batch_sizes(i)` for the i-th batch it draws (counting from 0), so a replay draws exactly what was drawn.

Evaluation reads fixed windows instead: `eval_windows.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from minigpt.data.shards import TokenSplit
from minigpt.errors import UserError


def check_length(split: TokenSplit, block_size: int) -> None:
    if len(split) < block_size + 1:
        raise UserError(
            f"the {split.name} split has {len(split)} tokens, fewer than block_size + 1 = {block_size + 1}; "
            "lower model.block_size or use a larger corpus / larger data.val_ratio"
        )


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        # Page-locked memory lets the copy run asynchronously, overlapping the previous step.
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def stream_seed(seed: int, rank: int) -> int:
    """A 64-bit seed for rank `rank` of a run seeded `seed`. SeedSequence mixes both numbers, so
    nearby seeds or ranks still give unrelated streams (seed + rank would make (1, 0) == (0, 1))."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, dtype=np.uint64)[0])


class BatchLoader:
    """Random (B, T) input/target batches from one split, for one rank.

    `world_size` only validates `rank`: random windows need no sharding, since each rank's stream
    is independent. `batch_sizes(i)`: the windows of the i-th batch (0-based), at most `batch_size`; None:
    `batch_size` every time. On CUDA the batch is pinned and copied with non_blocking=True.
    """

    def __init__(
        self,
        split: TokenSplit,
        block_size: int,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        batch_sizes: Callable[[int], int] | None = None,
    ):
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size={block_size} and batch_size={batch_size} must be positive")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        check_length(split, block_size)
        self.split = split
        self.block_size, self.batch_size = block_size, batch_size
        self.seed, self.rank = seed, rank
        self.device = torch.device(device)
        self.batch_sizes = batch_sizes or (lambda i: batch_size)
        self.generator = torch.Generator().manual_seed(stream_seed(seed, rank))
        self.batches_drawn = 0

    def _draw_starts(self, batch: int) -> torch.Tensor:
        """The window starts of the `batch`-th batch."""
        # A window starting at s reads s .. s+T, so the last valid start is N - T - 1: N - T choices.
        n = self.batch_sizes(batch)
        return torch.randint(len(self.split) - self.block_size, (n,), generator=self.generator)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (B, T) int64 on the loader's device, with y[:, i] == x[:, i + 1] inside the window
        (B = batch_sizes(i) for the i-th batch)."""
        T = self.block_size
        starts = self._draw_starts(self.batches_drawn)
        windows = np.stack([self.split.read(s, T + 1) for s in starts.tolist()])  # (B, T+1)
        windows = torch.from_numpy(windows.astype(np.int64))
        self.batches_drawn += 1
        # contiguous copies: callers may .view(-1) the targets for the loss
        x = windows[:, :-1].contiguous()  # (B, T)
        y = windows[:, 1:].contiguous()  # (B, T)
        return to_device(x, self.device), to_device(y, self.device)

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
        for i in range(self.batches_drawn):
            self._draw_starts(i)
