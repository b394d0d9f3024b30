"""The run's random streams: one seed for the weights on every rank, then a dropout stream per rank.

The loader draws its batches from a generator of its own (data/loader.py, also per rank), and sampling during
training uses its own seeded generator (sampling/decode.py), so neither touches these.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed every global RNG the run may touch (dropout uses torch's; the loader has its own generator).

    The same on every rank, so every rank initialises the same weights (FSDP shards them without the
    broadcast DDP does); `seed_rank_stream` then gives each rank its own dropout masks.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


DROPOUT_STREAM = 1  # keeps the dropout stream of (seed, rank) apart from the loader's (loader.stream_seed)


def seed_rank_stream(seed: int, rank: int) -> None:
    """After initialisation: torch's global RNG (dropout, on CPU and CUDA) gets a stream of its own per rank.

    With one stream, every rank would draw the same masks for its different batch, which is less
    regularisation than the same run on one device. SeedSequence mixes (seed, rank, stream) into unrelated
    seeds; a resumed run restores each rank's saved state instead (resume.py).
    """
    entropy = np.random.SeedSequence([seed, rank, DROPOUT_STREAM]).generate_state(1, dtype=np.uint64)[0]
    torch.manual_seed(int(entropy))
