"""Muon on 2 CPU processes (gloo), under DDP and FSDP2, against one process: plain (`model=demo optim=muon`)
and the recipe's (`model=recipe optim=recipe`: Polar Express on q, k and v apart, NorMuon, cautious weight
decay on a cosine, the momentum schedule).

The reference is one process training on one batch that holds both ranks' micro-batches (`TwoRankLoader`),
so it computes every matrix's update itself, from one mean gradient over all tokens. The two ranks average
two per-rank means instead and share the updates out (minigpt/cluster/whole_matrices.py). Two forked
processes run, in a row: DDP and FSDP2 of each setting, and the recipe under FSDP2 stopped halfway and
resumed; each rank counts what it orthogonalised and the bytes its Muon collectives brought it.
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
SETTINGS = {"plain": ["model=demo", "optim=muon"],  # at debug=fast's 2 layers x 32, 2 heads
            "recipe": ["model=recipe", "model.n_kv_head=null", "optim=recipe"]}
# The two routes sum the same gradients in a different order (float32 rounding, ~1e-7 relative); Muon's
# update is a smooth function of the momentum, and after STEPS steps the weights differ by ~1e-7 to 1e-6.
# A real mistake moves weights by ~muon_lr / sqrt(n) ~ 1e-3 per step or more: an update lost or applied twice,
# rows scattered to the wrong rank, a shard orthogonalised on its own (~0.2).
ATOL, RTOL = 1e-5, 1e-4
# The recipe amplifies that rounding: its cautious decay's mask flips where update x weight is near 0, and
# its AdamW scalars (eps 1e-10, x0 at lr 0.5, the backout at 0.2) step by the sign of near-zero gradients,
# the backout by up to 3e-2 of its value apart; Muon's matrices and their state then differ by up to ~3e-3
# of their norm. So the recipe's runs compare Muon's tensors by norm, within RECIPE_RTOL: a Muon step lost
# or doubled moves the zero-initialised output projections by a quarter or more. The step itself is the same
# up to the last bit of a matmul (`test_the_recipe_s_step_over_ranks_is_the_one_process_step`: one
# process orthogonalises same-shaped blocks as one stack, a rank each block alone, and a batched matmul may
# round a tiny block's products differently); the AdamW tensors are held to ATOL in the plain runs.
RECIPE_RTOL = 2e-2
STEP_RTOL, STEP_ATOL = 1e-6, 1e-7
# The optimizer alone, fed the same gradients on every rank: matrices of odd heights (under FSDP2 a rank holds
# 1 of (2, 5)'s rows, 3 and 2 of (5, 3)'s) and a fused one of a tall and two wide row blocks, whose rows of
# f = sqrt(2) and f = 1 the two ranks share unevenly, as a fused q/k/v matrix's are.
SHAPES, SPLITS = [(5, 3), (2, 5), (3, 7), (12, 4)], [8, 2, 2]


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

    def counted(real):
        def orthogonalize(g, steps, dtype):
            shapes[str(tuple(g.shape))] += 1
            return real(g, steps, dtype)
        return orthogonalize

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(whole_matrices, "dist", counting)
        for name in ("orthogonalize", "polar_express"):
            patch.setattr(muon, name, counted(getattr(muon, name)))
        train(cfg, out, env=env)
    (out / f"counts{env.rank}.json").write_text(json.dumps({"received": counting.received, "shapes": shapes}))


def _recipe_steps(route: str) -> dict[str, torch.Tensor]:
    """Three steps of the recipe's Muon on `SHAPES` in one process (route "one"), or over 2 ranks ("ddp",
    "fsdp": a collective), the same gradients everywhere: each matrix's weight and state, whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    wholes = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(3)]
    mesh = init_device_mesh("cpu", (2,)) if route == "fsdp" else None
    place = (lambda t: distribute_tensor(t, mesh, [Shard(0)])) if mesh else (lambda t: t)
    params = [torch.nn.Parameter(place(w)) for w in wholes]
    recipe = dict(muon=True, lr=0.02, cautious=True, beta2=0.9, orthogonalize="polar_express")
    groups = [{**recipe, "params": params[:-1]}, {**recipe, "params": params[-1:], "splits": SPLITS}]
    opt = muon.MuonAdamW(groups, over_ranks=route != "one")
    for step, step_grads in enumerate(grads):
        for p, g in zip(params, step_grads, strict=True):
            p.grad = place(g)
        for group in opt.param_groups:  # the schedules move both
            group.update(momentum=0.85 + 0.05 * step, weight_decay=0.28 * (1 - step / 3))
        opt.step()
    whole = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    return {f"{i}/{key}": whole(v) for i, p in enumerate(params)
            for key, v in [("weight", p.detach()), *opt.state[p].items()]}


def _worker(rank: int, port: int, root: str, cfgs: dict[str, TrainConfig]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    root_dir, env = Path(root), DistEnv(rank=rank, local_rank=rank, world_size=2)
    with process_group(env):
        for route in ("ddp", "fsdp"):
            torch.save(_recipe_steps(route), root_dir / f"steps_{route}{rank}.pt")
        for name, cfg in cfgs.items():
            _counted_train(cfg, root_dir / name / "ddp", env)
            _counted_train(_with(cfg, strategy="fsdp"), root_dir / name / "fsdp", env)
        fsdp = _with(cfgs["recipe"], strategy="fsdp")  # the recipe's state holds the plain one's and more
        train(_with(fsdp, max_steps=HALF), root_dir / "recipe" / "fsdp_resumed", env=env)
        train(_with(fsdp, resume="auto"), root_dir / "recipe" / "fsdp_resumed", env=env)


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
    cfgs = {name: to_object(compose_train([*overrides, *setting]), TrainConfig)
            for name, setting in SETTINGS.items()}
    assert cfgs["recipe"].optim.muon_orthogonalize == "polar_express" and cfgs["recipe"].model.smear
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "BatchLoader", TwoRankLoader)
        for name, cfg in cfgs.items():  # the first also prepares the data
            train(_with(cfg, batch_size=2 * cfg.trainer.batch_size), root / name / "single")
    import torch._dynamo  # noqa: F401 - DDP and FSDP import it; once here rather than in each fork

    mp.start_processes(_worker, args=(free_port(), str(root), cfgs), nprocs=2, start_method="fork")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("route", ["ddp", "fsdp"])
def test_the_recipe_s_step_over_ranks_is_the_one_process_step(runs: Path, route: str):
    reference = _recipe_steps("one")
    assert any(key.endswith("second_moment.1") for key in reference)  # the fused matrix's wide block
    for rank in (0, 1):
        got = torch.load(runs / f"steps_{route}{rank}.pt")
        assert got.keys() == reference.keys()
        for key, value in reference.items():  # the same operations on the same numbers, wherever they ran
            torch.testing.assert_close(got[key], value, rtol=STEP_RTOL, atol=STEP_ATOL, msg=(rank, key))


def _muon_state(run: Path) -> dict[str, torch.Tensor]:
    """Each Muon matrix's momentum and second moments, as "<parameter>/<key>"."""
    state = ckpt.load_state(run / "checkpoints" / "last")["optimizer"]["state"]
    return {f"{name}/{key}": value for name, s in state.items() if "momentum_buffer" in s
            for key, value in s.items()}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_muon_on_two_ranks_matches_one_process(runs: Path, setting: str, strategy: str):
    single, two = weights(runs / setting / "single"), weights(runs / setting / strategy)
    state, reference = _muon_state(runs / setting / strategy), _muon_state(runs / setting / "single")
    # a momentum for each of 2 layers x 4 matrices (the recipe's 9th: layer 1's value-embedding gate, 2 x 12),
    # and in the recipe a second moment for each, q, k and v's apart
    assert state.keys() == reference.keys() and len(state) == {"plain": 8, "recipe": 9 + 9 + 2 * 2}[setting]
    assert single.keys() == two.keys()
    matrices = {name.split("/")[0] for name in state}
    # the state gathered whole from the shards (FSDP); rank 0's has every matrix's (DDP)
    for got, want in ((two, single), (state, reference)):
        for name in want:
            if setting == "plain":
                torch.testing.assert_close(got[name], want[name], atol=ATOL, rtol=RTOL, msg=name)
            elif name.split("/")[0] in matrices:
                assert (got[name] - want[name]).norm() <= RECIPE_RTOL * want[name].norm(), name


@pytest.mark.slow
def test_fsdp_muon_resume_is_exact(runs: Path):
    straight, resumed = runs / "recipe" / "fsdp", runs / "recipe" / "fsdp_resumed"
    assert ckpt.read_meta(resumed / "checkpoints" / "last")["step"] == STEPS
    a, b = weights(straight), weights(resumed)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    state = _muon_state(straight)
    assert any("second_moment" in name for name in state)
    for name, value in state.items():
        assert torch.equal(value, _muon_state(resumed)[name]), name


def _matrix_shapes(run: Path) -> list[tuple[int, int]]:
    model = read_checkpoint(run)[0]
    return [(p.shape[0], p.shape[1]) for p in muon_matrices(model)]


def _counts(run: Path) -> list[dict]:
    return [json.loads((run / f"counts{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_matrix_is_orthogonalised_once_per_step_by_its_owner(runs: Path, strategy: str):
    run = runs / "plain" / strategy
    shapes = _matrix_shapes(run)
    owner = whole_matrices.owners([muon.newton_schulz_flops(s) for s in shapes], 2)
    counts = _counts(run)
    for rank, count in enumerate(counts):
        mine = Counter(str(s) for s, o in zip(shapes, owner, strict=True) if o == rank)
        assert count["shapes"] == {s: STEPS * n for s, n in mine.items()}, rank
        assert 0 < len(mine) < len(shapes)  # both ranks did some, neither did all
    # the bytes the collectives brought the two ranks, against the algorithm's count (docs/clusters.md)
    received = sum(c["received"] for c in counts)
    assert received == STEPS * whole_matrices.communication_bytes(shapes, 2, sharded=strategy == "fsdp")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_recipe_orthogonalises_each_block_once_and_sends_its_second_moments(runs: Path, strategy: str):
    run = runs / "recipe" / strategy
    shapes = _matrix_shapes(run)
    n = shapes[0][1]  # 32 wide: the fused q/k/v matrix (96, 32) is three (32, 32) blocks
    blocks = Counter(str(s) for s in shapes if s != (3 * n, n))
    blocks[str((n, n))] += 3 * shapes.count((3 * n, n))
    counts = _counts(run)
    done = Counter(counts[0]["shapes"]) + Counter(counts[1]["shapes"])
    assert done == {s: STEPS * k for s, k in blocks.items()}  # by one rank each, every step
    assert all(count["shapes"] for count in counts)  # both ranks did some
    moments = sum(v.numel() for name, v in _muon_state(run).items() if "second_moment" in name)
    received = sum(c["received"] for c in counts)
    assert received == STEPS * whole_matrices.communication_bytes(shapes, 2, sharded=strategy == "fsdp",
                                                                   state_bytes=4 * moments)
