"""`trainer.max_time`: a budget of training time, tested with an injected clock (nothing really waits).

The fake clock advances only when the loop draws a training micro-batch, by a fixed amount, so a step "takes"
exactly that long; evaluation is made to cost a lot of fake time too, to show it is not charged to the budget.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
from conftest import compose_train
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minigpt.checkpoint import format as ckpt
from minigpt.cli import to_object
from minigpt.errors import UserError
from minigpt.training.budget import Budget, format_duration, parse_duration
from minigpt.training.config import TrainConfig
from minigpt.training.dist_env import DistEnv
from minigpt.training.distributed import process_group
from minigpt.training.run_folder import RunFolder
from minigpt.training.trainer import Trainer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0  # not 0: only differences may matter

    def __call__(self) -> float:
        return self.now


def timed_trainer(cfg: TrainConfig, out: Path, step_s: float, eval_s: float = 100.0,
                  signal_at_batch: int | None = None, env: DistEnv | None = None) -> Trainer:
    """A Trainer whose clock moves `step_s` per step (spread over its micro-batches) and `eval_s` per
    evaluation; with `signal_at_batch`, SIGINT arrives while that micro-batch (1-based) is drawn."""
    clock = FakeClock()
    env = env or DistEnv()
    trainer = Trainer(cfg, RunFolder(out, enabled=env.is_main), env=env, clock=clock)
    draw, score = trainer.loader.next_batch, trainer.evaluation.score
    drawn = 0

    def next_batch():
        nonlocal drawn
        drawn += 1
        clock.now += step_s / trainer.grad_accum_steps
        if drawn == signal_at_batch:
            os.kill(os.getpid(), signal.SIGINT)  # GracefulStop: finish this step, save, return
        return draw()

    def slow_score():
        clock.now += eval_s  # inside meter.paused(): must not count
        return score()

    trainer.loader.next_batch, trainer.evaluation.score = next_batch, slow_score
    return trainer


TIMED = ("trainer.max_steps=null", "trainer.eval_every=4", "trainer.ckpt_every=3", "logging.log_every=1",
         "logging.sample_tokens=0", "optim.warmup_steps=3")


def _lrs(run: Path) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("optim/lr")]


@pytest.mark.slow
@pytest.mark.parametrize("step_s, budget, steps", [(0.7, "10s", 15), (1.0, "6s", 6), (0.25, "1.1s", 5)])
def test_stops_within_one_step_of_the_budget(make_train_cfg, tmp_path: Path, step_s: float, budget: str,
                                             steps: int):
    cfg = make_train_cfg(*TIMED, f"trainer.max_time={budget}", "trainer.grad_accum_steps=2")
    result = timed_trainer(cfg, tmp_path / "run", step_s).fit()
    limit = parse_duration(budget)
    assert result.step == steps == math.ceil(limit / step_s - 1e-9)  # the first step ending at/after it
    assert limit <= result.train_seconds < limit + step_s
    assert result.train_seconds == pytest.approx(steps * step_s)  # evaluations (100 s each) not counted
    meta = ckpt.read_meta(tmp_path / "run" / "checkpoints" / "last")
    assert meta["step"] == steps and meta["train_seconds"] == pytest.approx(result.train_seconds)
    assert result.val_loss < result.first_val_loss  # the final eval still happened, and the run learned


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_the_lr_follows_the_time_used_and_reaches_its_floor_at_the_budgets_end(make_train_cfg, tmp_path: Path,
                                                                               schedule: str):
    peak, floor_ratio, step_s, budget = 1e-2, 0.1, 0.5, 8.0
    cfg = make_train_cfg(*TIMED, f"trainer.max_time={budget}s", f"optim.lr={peak}",
                         f"optim.schedule={schedule}", "optim.cooldown_ratio=0.5",
                         f"optim.min_lr_ratio={floor_ratio}")
    trainer = timed_trainer(cfg, tmp_path / "run", step_s)
    trainer.fit()
    lrs = _lrs(tmp_path / "run")  # logged at step k+1 for the update of step k
    assert [s for s, _ in lrs] == list(range(1, 17))
    for logged_at, lr in lrs:
        step = logged_at - 1
        p = step * step_s / budget  # the share of the budget used before this step
        decay = 0.5 * (1 + math.cos(math.pi * p)) if schedule == "cosine" else min(1.0, (1 - p) / 0.5)
        want = peak * min(1.0, (step + 1) / 3) * (floor_ratio + (1 - floor_ratio) * decay)
        assert lr == pytest.approx(want), step
    # The last update starts one step before the end; at the end of the budget the lr is on its floor.
    assert lrs[-1][1] > peak * floor_ratio
    assert trainer.schedule.lr(16, budget) == pytest.approx(peak * floor_ratio)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "last" / ckpt.WEIGHTS)


@pytest.mark.slow
def test_resume_continues_the_remaining_budget(make_train_cfg, tmp_path: Path):
    """Stopped by Ctrl-C after 4 of 10 fake seconds, resumed: 6 more steps, and the same weights as a run
    that was never interrupted (so every step also had the same lr)."""
    common = (*TIMED, "trainer.max_time=10s", "model.dropout=0.1")
    straight = timed_trainer(make_train_cfg(*common), tmp_path / "straight", 1.0).fit()
    assert straight.step == 10 and not straight.interrupted

    first = timed_trainer(make_train_cfg(*common), tmp_path / "split", 1.0, signal_at_batch=4).fit()
    assert first.interrupted and first.step == 4 and first.train_seconds == pytest.approx(4.0)
    assert ckpt.read_meta(tmp_path / "split" / "checkpoints" / "last")["train_seconds"] == pytest.approx(4.0)
    second = timed_trainer(make_train_cfg(*common, "trainer.resume=auto"), tmp_path / "split", 1.0).fit()
    assert second.step == 10 and second.train_seconds == pytest.approx(10.0)
    assert _lrs(tmp_path / "split") == _lrs(tmp_path / "straight")  # the same lr at every step
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "split")
    for name in a:
        assert torch.equal(a[name], b[name]), name

    # The budget is used up: resuming again is refused, and says how to go on.
    with pytest.raises(UserError, match=r"already trained for 0:10.*raise trainer.max_time"):
        timed_trainer(make_train_cfg(*common, "trainer.resume=auto"), tmp_path / "split", 1.0)


@pytest.mark.slow
def test_with_both_limits_the_first_one_reached_ends_the_run(make_train_cfg, tmp_path: Path):
    cfg = make_train_cfg(*TIMED, "trainer.max_steps=5", "trainer.max_time=1h")
    result = timed_trainer(cfg, tmp_path / "steps_first", 1.0).fit()
    assert result.step == 5
    cfg = make_train_cfg(*TIMED, "trainer.max_steps=500", "trainer.max_time=3s")
    assert timed_trainer(cfg, tmp_path / "time_first", 1.0).fit().step == 3


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("3min", 180), ("1h", 3600), ("1.5h", 5400),
                                           ("1h30min", 5400), ("0.5s", 0.5), ("2 min", 120)])
def test_durations(text: str, seconds: float):
    assert parse_duration(text) == seconds
    cfg = to_object(compose_train([f"trainer.max_time='{text}'"]), TrainConfig)
    assert cfg.trainer.max_seconds == seconds


@pytest.mark.parametrize("text", ["90", "3m", "3mins", "-5s", "0s", "min", "1h30", "ten s", "5 s s", ""])
def test_bad_durations_are_one_line_user_errors(text: str):
    with pytest.raises(UserError, match=r"trainer\.max_time=.* (is not a duration|must be a positive)") as e:
        to_object(compose_train([f"trainer.max_time='{text}'"]), TrainConfig)
    assert "\n" not in str(e.value)


def test_no_budget_at_all_is_refused():
    with pytest.raises(UserError, match="trainer.max_steps=null needs a time budget"):
        to_object(compose_train(["trainer.max_steps=null"]), TrainConfig)


def test_budget_words():
    assert Budget(400, None).describe() == "400 steps"
    assert Budget(None, 180.0).describe() == "3:00 of training time"
    assert Budget(400, 180.0).describe() == "3:00 of training time or 400 steps, whichever comes first"
    assert format_duration(3725.9) == "1:02:05" and format_duration(7.2) == "0:07"
    assert Budget(400, 180.0).remaining(100, 60.0, 0.5) == 120.0  # time binds: 120 s < 300 steps x 0.5 s
    assert Budget(400, 180.0).remaining(390, 60.0, 0.5) == 5.0  # steps bind


def _budget_worker(rank: int, port: int, root: str, cfg: TrainConfig) -> None:
    """One of two DDP ranks whose clocks disagree: rank 1's runs three times as fast as rank 0's."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    env = DistEnv.from_env()
    with process_group(env):
        trainer = timed_trainer(cfg, Path(root) / "run", 1.0 if rank == 0 else 3.0, env=env)
        lrs, apply = [], trainer.schedule.apply
        trainer.schedule.apply = lambda opt, step, seconds: lrs.append(apply(opt, step, seconds)) or lrs[-1]
        result = trainer.fit()
    (Path(root) / f"rank{rank}.json").write_text(json.dumps({"step": result.step, "lrs": lrs}))


@pytest.mark.slow
def test_under_ddp_every_rank_follows_rank_zeros_clock(make_train_cfg, tmp_path: Path):
    """Rank 1 alone would stop after 2 steps of a 6 s budget, rank 0 after 6: they must stop together, at
    rank 0's step, with the same lr at every step (else the replicas drift apart, or a rank hangs in a
    collective the other never reaches)."""
    import torch.multiprocessing as mp

    cfg = make_train_cfg(*TIMED, "trainer.max_time=6s", "device.peak_tflops=1")
    # prepares the data once, before the ranks start
    Trainer(cfg, RunFolder(tmp_path / "prepare"), env=DistEnv())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.start_processes(_budget_worker, args=(port, str(tmp_path), cfg), nprocs=2, start_method="fork",
                             join=False)
    deadline = time.monotonic() + 300  # a guard against a hang, not a timing assertion
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("the ranks did not finish together: one waits in a collective the other left")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["step"] == ranks[1]["step"] == 6
    assert ranks[0]["lrs"] == ranks[1]["lrs"] and len(ranks[0]["lrs"]) == 6
