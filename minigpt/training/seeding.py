"""The run's random streams: seeded once at the start, saved with every checkpoint, restored on resume.

One seed for the weights on every rank (`seed_everything`), then a dropout stream per rank
(`seed_rank_stream`); the state of every stream is saved in each checkpoint (`rng_state`) and put back when
the run is resumed (`set_rng_state`), so a resumed run draws exactly what it would have drawn. The loader
draws its batches from a generator of its own (data/loader.py, also per rank), sampling during training uses
its own seeded generator (sampling/decode.py), and the divergence guard's probe, which runs in training mode
between steps, draws its dropout from copies of the streams (`forked_random_streams`): none of them shifts
these.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

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
    seeds; a resumed run restores each rank's saved state instead (`set_rng_state`).
    """
    entropy = np.random.SeedSequence([seed, rank, DROPOUT_STREAM]).generate_state(1, dtype=np.uint64)[0]
    torch.manual_seed(int(entropy))


def rng_state() -> dict[str, Any]:
    """Every random stream this process draws from, as tensors and plain Python (safe for `weights_only`).

    CUDA: the generator of the current device only (under torchrun each rank has its own device and saves
    its own state; reading every device's would open a CUDA context on each of them from every rank), and
    only once CUDA is in use, so a CPU run never initialises it. The trainer saves one of these per rank.
    """
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (in the process, and on the current CUDA device, it describes)."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "has_gauss": n["has_gauss"], "gauss": n["gauss"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]}})
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list):  # older checkpoints: one state per visible device
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda)


def forked_random_streams(device: torch.device) -> contextlib.AbstractContextManager:
    """Inside: torch's random streams on the CPU and on `device` are copies, so whatever is drawn there leaves
    the run's own streams as they were (the divergence guard's probe in training mode draws dropout)."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)


def _as_tuple(x: Any) -> Any:
    """`random.setstate` wants tuples; a round trip through some serialisers turns them into lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
