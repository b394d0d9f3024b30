"""Muon (the default optimizer) on 2 CPU processes (gloo), under DDP and FSDP2, against one process.

The reference is one process training on one batch that holds both ranks' micro-batches (`TwoRankLoader`),
so it orthogonalises every matrix itself, from one mean gradient over all tokens. The two ranks average two
per-rank means instead and share the orthogonalisations out (minigpt/cluster/whole_matrices.py). Two forked
processes run, in a row: DDP, FSDP2, and FSDP2 stopped halfway and resumed; each rank counts what it
orthogonalised and the bytes its Muon collectives brought it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from cluster_helpers import TwoRankLoader, free_port, weights

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import read_checkpoint
from minigpt.cluster import whole_matrices
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.distributed import process_group
from minigpt.runs.train import train
from minigpt.training import muon
from minigpt.training import trainer as trainer_module
from minigpt.training.config import TrainConfig
from minigpt.training.optim import muon_matrices

STEPS, HALF = 4, 2
# The two routes sum the same gradients in a different order (float32 rounding, ~1e-7 relative); Muon's
# update is a smooth function of the momentum, and after STEPS steps the weights differ by ~1e-7 to 1e-6.
# A real mistake moves weights by ~muon_lr / sqrt(n) ~ 1e-3 per step or more: an update lost or applied twice,
# rows scattered to the wrong rank, a shard orthogonalised on its own (~0.2).
ATOL, RTOL = 1e-5, 1e-4


def _with(cfg: TrainConfig, **trainer_fields) -> TrainConfig:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **trainer_fields))


class _CountingDist:
    """torch.distributed as whole_matrices.py sees it, adding up the bytes its collectives bring this rank."""

    def __init__(self) -> None:
        self.received = 0

    def __getattr__(self, name):
        return getattr(dist, name)

    def gather(self, tensor, gather_list=None, dst=None, **kwargs):
        if gather_list is not None:  # the owner: every other rank's rows arrive
            self.received += (len(gather_list) - 1) * tensor.nbytes
        return dist.gather(tensor, gather_list, dst=dst, **kwargs)

    def scatter(self, tensor, scatter_list=None, src=None, **kwargs):
        if scatter_list is None:  # not the owner: this rank's rows arrive
            self.received += tensor.nbytes
        return dist.scatter(tensor, scatter_list, src=src, **kwargs)

    def broadcast(self, tensor, src, **kwargs):
        if dist.get_rank() != src:
            self.received += tensor.nbytes
        return dist.broadcast(tensor, src, **kwargs)


def _counted_train(cfg: TrainConfig, out: Path, env: DistEnv) -> None:
    """`train`, writing what this rank orthogonalised and received into out/counts<rank>.json."""
    counting, shapes = _CountingDist(), Counter()

    def orthogonalize(g, steps):
        shapes[str(tuple(g.shape))] += 1
        return real(g, steps)

    real = muon.orthogonalize
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(whole_matrices, "dist", counting)
        patch.setattr(muon, "orthogonalize", orthogonalize)
        train(cfg, out, env=env)
    (out / f"counts{env.rank}.json").write_text(json.dumps({"received": counting.received, "shapes": shapes}))


def _worker(rank: int, port: int, root: str, cfg: TrainConfig) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    root_dir, env = Path(root), DistEnv(rank=rank, local_rank=rank, world_size=2)
    fsdp = _with(cfg, strategy="fsdp")
    with process_group(env):
        _counted_train(cfg, root_dir / "ddp", env)
        _counted_train(fsdp, root_dir / "fsdp", env)
        train(_with(fsdp, max_steps=HALF), root_dir / "fsdp_resumed", env=env)
        train(_with(fsdp, resume="auto"), root_dir / "fsdp_resumed", env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from conftest import compose_train, fast_overrides, write_corpus

    from minigpt.cli import to_object

    root = tmp_path_factory.mktemp("muon")
    corpus = write_corpus(root / "corpus")
    # grad_accum_steps=2: only the last micro-batch syncs; checkpoints at the end only (FSDP on CPU is slow
    # per op); the schedule fixed by decay_steps, so that HALF + resume follows the straight run's lr.
    overrides = [*fast_overrides(root, corpus), f"trainer.max_steps={STEPS}", "trainer.grad_accum_steps=2",
                 f"trainer.eval_every={STEPS}", f"trainer.ckpt_every={STEPS}", f"optim.decay_steps={STEPS}",
                 "optim.warmup_steps=0", "logging.sample_tokens=0", "device.peak_tflops=1"]
    cfg = to_object(compose_train(overrides), TrainConfig)
    assert cfg.optim.name == "muon"  # the default
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "BatchLoader", TwoRankLoader)
        train(_with(cfg, batch_size=2 * cfg.trainer.batch_size), root / "single")  # also prepares the data
    import torch._dynamo  # noqa: F401 - DDP and FSDP import it; once here rather than in each fork

    mp.start_processes(_worker, args=(free_port(), str(root), cfg), nprocs=2, start_method="fork")
    return root


def _momenta(run: Path) -> dict[str, torch.Tensor]:
    state = ckpt.load_state(run / "checkpoints" / "last")["optimizer"]["state"]
    return {name: s["momentum_buffer"] for name, s in state.items() if "momentum_buffer" in s}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_muon_on_two_ranks_matches_one_process(runs: Path, strategy: str):
    single, two = weights(runs / "single"), weights(runs / strategy)
    assert single.keys() == two.keys()
    for name in single:
        torch.testing.assert_close(two[name], single[name], atol=ATOL, rtol=RTOL, msg=name)
    momenta, reference = _momenta(runs / strategy), _momenta(runs / "single")
    assert momenta.keys() == reference.keys() and len(momenta) == 2 * 4  # 2 layers x 4 matrices
    for name in reference:  # gathered whole from the shards (FSDP); rank 0's has every matrix's (DDP)
        torch.testing.assert_close(momenta[name], reference[name], atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.slow
def test_fsdp_muon_resume_is_exact(runs: Path):
    straight, resumed = runs / "fsdp", runs / "fsdp_resumed"
    assert ckpt.read_meta(resumed / "checkpoints" / "last")["step"] == STEPS
    a, b = weights(straight), weights(resumed)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    for name, momentum in _momenta(straight).items():
        assert torch.equal(momentum, _momenta(resumed)[name]), name


def _matrix_shapes(run: Path) -> list[tuple[int, int]]:
    model = read_checkpoint(run)[0]
    return [(p.shape[0], p.shape[1]) for p in muon_matrices(model)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_matrix_is_orthogonalised_once_per_step_by_its_owner(runs: Path, strategy: str):
    shapes = _matrix_shapes(runs / strategy)
    owner = whole_matrices.owners([muon.newton_schulz_flops(s) for s in shapes], 2)
    counts = [json.loads((runs / strategy / f"counts{rank}.json").read_text()) for rank in (0, 1)]
    for rank, count in enumerate(counts):
        mine = Counter(str(s) for s, o in zip(shapes, owner, strict=True) if o == rank)
        assert count["shapes"] == {s: STEPS * n for s, n in mine.items()}, rank
        assert 0 < len(mine) < len(shapes)  # both ranks did some, neither did all
    # the bytes the collectives brought the two ranks, against the algorithm's count (docs/clusters.md)
    received = sum(c["received"] for c in counts)
    assert received == STEPS * whole_matrices.communication_bytes(shapes, 2, sharded=strategy == "fsdp")
