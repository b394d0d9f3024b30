"""Data-parallel training on 2 CPU processes (gloo): DDP and FSDP2 against one process, same global batch.

Two processes are started once for the whole module (their torch import is the expensive part) and run a few
short trainings in a row; the tests then compare what they wrote with single-process runs done here.

The reference is an independent route to the same numbers: one process, one batch holding both ranks' micro-
batches, so its gradient is one mean over all tokens, where DDP/FSDP average two per-rank means through gloo.
With dropout the ranks draw their own masks, so the dropout runs are compared with themselves: 10 steps +
resume + 10 steps against 20 straight, bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from cli_helpers import run_script
from cluster_helpers import TwoRankLoader, free_port, weights
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import read_checkpoint
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.distributed import gather_object, process_group
from minigpt.errors import UserError
from minigpt.runs.train import train
from minigpt.training import trainer as trainer_module
from minigpt.training.config import TrainConfig
from minigpt.training.trainer import Trainer

STEPS, HALF = 6, 3
DROP_STEPS, DROP_HALF = 20, 10  # the dropout runs
# The two routes sum the same gradients in a different order (float32 rounding, ~1e-7 relative). Adam divides
# by sqrt(v) + eps, so for the rare weight whose gradient is nearly zero, that rounding can move the update by
# up to a few 1e-5 (seen: 1 weight in 35k at 4e-5). A real mistake (a missing all-reduce, a sum instead of a
# mean, a rank's data dropped) moves nearly every weight by ~lr = 1e-2, a hundred times more than this.
ATOL, RTOL = 1e-4, 1e-4


def _with(cfg: TrainConfig, **trainer_fields) -> TrainConfig:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **trainer_fields))


def _dropout_cfg(cfg: TrainConfig) -> TrainConfig:
    """Dropout 0.1, DROP_STEPS steps, a checkpoint at DROP_HALF, a schedule that ignores max_steps."""
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.1),
                              optim=dataclasses.replace(cfg.optim, decay_steps=DROP_STEPS))
    return _with(cfg, max_steps=DROP_STEPS, eval_every=DROP_STEPS, ckpt_every=DROP_HALF, grad_accum_steps=1)


def _outputs_cfg(cfg: TrainConfig) -> TrainConfig:
    """The dropout config under FSDP, whose validation is 3 windows in batches of 1: ranks 0 and 1 score
    2 and 1 of them, and rank 1 runs one uncounted forward to keep FSDP's collectives in step."""
    drop = _dropout_cfg(cfg)
    return _with(drop, strategy="fsdp", batch_size=1, eval_tokens=3 * cfg.model.block_size)


def _forward_outputs(cfg: TrainConfig, out: Path, env: DistEnv) -> None:
    """Rank 0 saves every rank's logits for one fixed batch, in train mode (dropout on) and in eval mode,
    and the validation score (summed over ranks)."""
    trainer = Trainer(cfg, out, env=env)  # builds the run, writes nothing
    model = trainer.model
    x = (torch.arange(2 * cfg.model.block_size) % 200).view(2, -1)  # (2, T): the same batch on every rank
    with torch.no_grad():
        outputs = (model.train()(x)[0], model.eval()(x)[0])  # (2, T, V) each
    gathered = gather_object(outputs, env)
    score = trainer.evaluation.score()
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"outputs": gathered, "score": dataclasses.asdict(score)}, out / "outputs.pt")


def _worker(rank: int, world_size: int, port: int, root: str, cfg: TrainConfig) -> None:
    """One rank of the 2-process run: DDP straight, DDP half + resume, FSDP straight."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    root_dir = Path(root)
    env = DistEnv.from_env()
    with process_group(env):
        train(cfg, root_dir / "ddp", env=env)
        train(_with(cfg, max_steps=HALF), root_dir / "ddp_resumed", env=env)
        train(_with(cfg, resume="auto"), root_dir / "ddp_resumed", env=env)
        # FSDP on CPU is slow per op (DTensor dispatch): evaluate and checkpoint only at the end.
        train(_with(cfg, strategy="fsdp", eval_every=STEPS, ckpt_every=STEPS), root_dir / "fsdp", env=env)
        drop = _dropout_cfg(cfg)
        train(drop, root_dir / "drop", env=env)
        train(_with(drop, max_steps=DROP_HALF), root_dir / "drop_resumed", env=env)
        train(_with(drop, resume="auto"), root_dir / "drop_resumed", env=env)
        # FSDP: it shards whatever each rank initialised, without DDP's broadcast of rank 0's weights
        _forward_outputs(_outputs_cfg(cfg), root_dir / "outputs", env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Single-process reference + the 2-process runs; returns their folders."""
    from conftest import compose_train, fast_overrides, write_corpus

    from minigpt.cli import to_object

    root = tmp_path_factory.mktemp("dist")
    corpus = write_corpus(root / "corpus")
    # grad_accum_steps=2 exercises no_sync; eval/ckpt every 2 steps exercises the rank-0-only writes mid-run.
    overrides = [*fast_overrides(root, corpus), f"trainer.max_steps={STEPS}", "trainer.grad_accum_steps=2",
                 "trainer.eval_every=2", "trainer.ckpt_every=2",
                 "optim=adamw", "optim.lr=1e-2",  # AdamW here; Muon on 2 ranks: test_muon_distributed.py
                 f"optim.decay_steps={STEPS}",  # the schedule must not depend on max_steps (HALF then resume)
                 "logging.sample_tokens=4", "device.peak_tflops=1"]  # peak given: no matmul timing
    cfg = to_object(compose_train(overrides), TrainConfig)
    with pytest.MonkeyPatch.context() as mp_patch:
        mp_patch.setattr(trainer_module, "BatchLoader", TwoRankLoader)
        train(_with(cfg, batch_size=2 * cfg.trainer.batch_size), root / "single")  # also prepares the data
    # Forked workers inherit this process's imports; DDP and FSDP import torch._dynamo: do it once, here.
    import torch._dynamo  # noqa: F401

    mp.start_processes(_worker, args=(2, free_port(), str(root), cfg), nprocs=2, start_method="fork")
    _forward_outputs(_outputs_cfg(cfg), root / "outputs_single", DistEnv())
    return root


@pytest.mark.slow
def test_ddp_matches_one_process_with_the_same_global_batch(runs: Path):
    single, ddp = weights(runs / "single"), weights(runs / "ddp")
    assert single.keys() == ddp.keys()
    for name in single:
        torch.testing.assert_close(ddp[name], single[name], atol=ATOL, rtol=RTOL, msg=name)
    meta = ckpt.read_meta(runs / "ddp" / "checkpoints" / "last")
    assert meta["step"] == STEPS
    assert meta["tokens_seen"] == STEPS * 2 * 2 * 4 * 32  # steps x ranks x accum x B x T
    assert meta["world_size"] == 2


@pytest.mark.slow
def test_only_rank_zero_writes(runs: Path):
    ddp = runs / "ddp"
    assert sorted(p.name for p in ddp.iterdir()) == ["checkpoints", "tb"]
    # events.out.tfevents.<time>.<host>.<pid>.<n>
    writers = {p.name.split(".")[-2] for p in (ddp / "tb").glob("events.out.tfevents.*")}
    assert len(writers) == 1  # one process wrote TensorBoard events
    assert sorted(p.name for p in (ddp / "checkpoints").iterdir()) == ["best", "last"]


@pytest.mark.slow
def test_ddp_resume_is_exact(runs: Path):
    straight, resumed = weights(runs / "ddp"), weights(runs / "ddp_resumed")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


@pytest.mark.slow
def test_dropout_masks_differ_between_ranks_after_the_same_initialisation(runs: Path):
    (train0, eval0), (train1, eval1) = torch.load(runs / "outputs" / "outputs.pt")["outputs"]
    [(_, eval_single)] = torch.load(runs / "outputs_single" / "outputs.pt")["outputs"]
    # FSDP computes with every rank's shard: the same as one process only if every rank initialised alike
    torch.testing.assert_close(eval0, eval_single, atol=1e-6, rtol=1e-6)
    assert torch.equal(eval0, eval1)
    assert not torch.equal(train0, eval0) and not torch.equal(train1, eval1)  # dropout is active
    assert not torch.equal(train0, train1)  # each rank drew its own masks


@pytest.mark.slow
def test_validation_is_split_over_ranks_and_summed(runs: Path):
    two = torch.load(runs / "outputs" / "outputs.pt")["score"]
    one = torch.load(runs / "outputs_single" / "outputs.pt")["score"]
    assert two["tokens"] == one["tokens"] == 3 * 32 and two["bytes"] == one["bytes"] > 0
    assert two["nats"] == pytest.approx(one["nats"], rel=1e-6)


@pytest.mark.slow
def test_resume_with_dropout_on_two_ranks_is_exact(runs: Path):
    straight, resumed = runs / "drop" / "checkpoints" / "last", runs / "drop_resumed" / "checkpoints" / "last"
    assert ckpt.read_meta(resumed)["step"] == DROP_STEPS
    a, b = weights(runs / "drop"), weights(runs / "drop_resumed")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    opt_a, opt_b = ckpt.load_state(straight)["optimizer"], ckpt.load_state(resumed)["optimizer"]
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for name, moments in opt_a["state"].items():
        for key, value in moments.items():
            assert torch.equal(value, opt_b["state"][name][key]), (name, key)
    rng = ckpt.load_state(straight)["rng"]  # one state per rank, and they differ
    assert len(rng) == 2 and not torch.equal(rng[0]["torch"], rng[1]["torch"])


def _scalars(run: Path, tag: str) -> dict[int, float]:
    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


@pytest.mark.slow
def test_mfu_is_per_device(runs: Path):
    """MFU = flops_per_token x tokens/s / (ranks x peak): compared through the logged inputs, not timings.

    The single process and the 2 ranks train the same global batch, so MFU / tokens_per_s (both logged) must
    be half as large on 2 ranks: each device did half the tokens.
    """
    per_token = {}
    for name in ("single", "ddp"):
        mfu = _scalars(runs / name, "throughput/mfu")
        tokens_per_s = _scalars(runs / name, "throughput/tokens_per_s")
        assert mfu.keys() == tokens_per_s.keys() and mfu
        ratios = {step: mfu[step] / tokens_per_s[step] for step in mfu}
        assert all(0 < v <= 1 for v in mfu.values())
        per_token[name] = ratios
    model = read_checkpoint(runs / "ddp")[0]
    peak = 1e12  # device.peak_tflops=1
    for step, ratio in per_token["single"].items():
        assert ratio == pytest.approx(model.flops_per_token() / peak, rel=1e-5)
        assert per_token["ddp"][step] == pytest.approx(ratio / 2, rel=1e-5)


@pytest.mark.slow
def test_fsdp_matches_one_process_and_its_checkpoint_generates(runs: Path, capsys):
    single, fsdp = weights(runs / "single"), weights(runs / "fsdp")
    assert single.keys() == fsdp.keys()
    for name in single:
        torch.testing.assert_close(fsdp[name], single[name], atol=ATOL, rtol=RTOL, msg=name)
    # A plain single-process generate reads the gathered checkpoint.
    result = run_script("generate", [f"checkpoint={runs / 'fsdp'}", "max_new_tokens=5", "device=cpu",
                                     "stream=false", f"hydra.run.dir={runs / 'gen'}"], capsys)
    assert result.code == 0, result.err
    assert (runs / "gen" / "samples.txt").read_text().startswith("--- sample 0")


@pytest.mark.slow
def test_resume_with_another_world_size_is_refused(runs: Path, make_train_cfg, tmp_path: Path):
    cfg = make_train_cfg(f"trainer.resume={runs / 'ddp'}", f"trainer.max_steps={STEPS + 2}",
                         "trainer.grad_accum_steps=2")
    with pytest.raises(UserError, match=r"2 process.*--nproc_per_node=2"):
        train(cfg, tmp_path / "one_process")


def test_torchrun_environment_is_read_and_checked():
    assert DistEnv.from_env({}) == DistEnv(rank=0, local_rank=0, world_size=1)  # plain python: one process
    env = DistEnv.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert (env.rank, env.local_rank, env.world_size, env.is_main, env.enabled) == (3, 1, 4, False, True)
    with pytest.raises(UserError, match="RANK='x' is not an integer"):
        DistEnv.from_env({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(UserError, match="inconsistent torchrun environment"):
        DistEnv.from_env({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})
