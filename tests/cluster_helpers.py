"""Helpers of the cluster tests: a 2-rank reference run in forked processes, one process drawing both ranks'
batches, and reading a run's weights.

The reference trains exactly what a launcher's processes train (the same TrainConfig, DDP over gloo, two
ranks), but started the simplest way: two forks of the test process, which has torch imported already. The
launcher runs (torchrun across two "nodes", submitit jobs) must reproduce its weights bit for bit: the same
additions of the same two gradients, in the same order, on one thread each.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from minigpt.checkpoint import format as ckpt
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.distributed import process_group
from minigpt.data.loader import BatchLoader
from minigpt.runs.train import train
from minigpt.training.config import TrainConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, runs: list[tuple[TrainConfig, str]], local_ranks: tuple[int, int]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    env = DistEnv(rank=rank, local_rank=local_ranks[rank], world_size=2)
    with process_group(env):
        for cfg, out_dir in runs:
            train(cfg, Path(out_dir), env=env)


def train_two_ranks(runs: list[tuple[TrainConfig, Path]], local_ranks: tuple[int, int] = (0, 1)) -> None:
    """Train each (config, run folder) in turn with DDP over two forked processes (gloo)."""
    import torch._dynamo  # noqa: F401 - DDP imports it; once here rather than in each fork

    jobs = [(cfg, str(out_dir)) for cfg, out_dir in runs]
    mp.start_processes(_worker, args=(free_port(), jobs, local_ranks), nprocs=2, start_method="fork")


class TwoRankLoader:
    """One process drawing rank 0's and rank 1's micro-batches and stacking them: the same global batch."""

    def __init__(self, bin_path, block_size, batch_size, *, seed, rank, world_size, device, batch_sizes):
        assert (rank, world_size) == (0, 1) and batch_size % 2 == 0
        assert batch_sizes(0) == batch_size  # no batch-size warmup: each rank draws half of every batch
        self.parts = [BatchLoader(bin_path, block_size, batch_size // 2, seed=seed, rank=r, world_size=2,
                                  device=device) for r in range(2)]

    def next_batch(self):
        (x0, y0), (x1, y1) = (p.next_batch() for p in self.parts)
        return torch.cat([x0, x1]), torch.cat([y0, y1])  # (2B, T) each

    def state_dict(self):
        return self.parts[0].state_dict()


def weights(run: Path) -> dict[str, torch.Tensor]:
    """The weights of a run folder's last checkpoint, or of a weights file."""
    return load_file(str(run if run.is_file() else run / "checkpoints" / "last" / ckpt.WEIGHTS))


def assert_same_weights(run: Path, reference: Path) -> None:
    got, want = weights(run), weights(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def event_writers(run: Path) -> set[str]:
    """The process ids that wrote TensorBoard events (events.out.tfevents.<time>.<host>.<pid>.<n>)."""
    return {f.name.split(".")[-2] for f in (run / "tb").glob("events.out.tfevents.*")}
