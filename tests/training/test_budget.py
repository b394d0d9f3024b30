"""`trainer.max_time`: a budget of training time, tested with an injected clock (nothing really waits).

The fake clock advances only when the loop draws a training micro-batch, by a fixed amount, so a step "takes"
exactly that long; evaluation is made to cost a lot of fake time too, to show it is not charged to the budget.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
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
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.distributed import process_group
from minigpt.errors import UserError
from minigpt.runs.run_folder import RunFolder
from minigpt.runs.same_run import compare
from minigpt.runs.train import start_trainer
from minigpt.training.budget import Budget, format_duration, parse_duration
from minigpt.training.config import OptimConfig, TrainConfig
from minigpt.training.optim import LRSchedule
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
    trainer = start_trainer(cfg, RunFolder(out, enabled=env.is_main), env, clock)
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


def _scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` over every event file of the run, by step. The reader's purge stays off: it
    reads files in name order, and two writers of one process in one second are named by a counter, so a
    resume's file (uid 10) can sort before its first part's (uid 9) and purge that part as out of order."""
    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    events.Reload()
    latest = {e.step: e.value for e in sorted(events.Scalars(tag), key=lambda e: e.wall_time)}
    return sorted(latest.items())


def _lrs(run: Path) -> list[tuple[int, float]]:
    return _scalars(run, "optim/lr")


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
    assert trainer.schedule.lr(16, budget, 16 * 128) == pytest.approx(peak * floor_ratio)


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
def test_a_flops_budget_trains_the_steps_it_buys_and_reports_its_flops(make_train_cfg, tmp_path: Path):
    """5.5 steps' worth of FLOPs (debug=fast: 4 x 32 = 128 tokens per step) end the run after step 6; the
    FLOPs in TensorBoard, meta.json and the result are the tokens times the model's count per token."""
    probe = Trainer(make_train_cfg(*TIMED, "trainer.max_steps=1"), tmp_path / "probe",
                    env=DistEnv())
    per_step = 128 * probe.model.flops_per_token()
    cfg = make_train_cfg(*TIMED, f"trainer.max_flops={5.5 * per_step}", "trainer.max_time=1h")
    result = timed_trainer(cfg, tmp_path / "run", 0.5).fit()
    assert result.step == 6 and result.tokens_seen == 6 * 128 and result.flops == 6 * per_step
    flops = _scalars(tmp_path / "run", "progress/flops")
    assert {step for step, _ in flops} == set(range(0, 7))  # every log interval and evaluation
    for step, value in flops:
        assert value == pytest.approx(step * per_step, rel=1e-6), step  # float32 event values
    meta = ckpt.read_meta(tmp_path / "run" / "checkpoints" / "last")
    assert meta["flops"] == 6 * per_step and meta["tokens_seen"] == 6 * 128
    assert meta["machine"]["dtype"] == "float32" and meta["machine"]["cores"] >= 1  # debug=fast: float32
    lrs = _lrs(tmp_path / "run")  # the decay follows the FLOPs: step k's lr from k * per_step used
    assert lrs[-1][1] == pytest.approx(trainer_lr(cfg, 5, 5 / 5.5))


def trainer_lr(cfg: TrainConfig, step: int, progress: float) -> float:
    """The lr of `step` at `progress` of the budget, from the documented formula (wsd, the default)."""
    o = cfg.optim
    assert o.schedule == "wsd"
    warm = min(1.0, (step + 1) / o.warmup_steps)
    decay = 1.0 if progress <= 1 - o.cooldown_ratio else (1 - progress) / o.cooldown_ratio
    return o.lr * warm * (o.min_lr_ratio + (1 - o.min_lr_ratio) * decay)


@pytest.mark.slow
def test_resume_continues_the_remaining_tokens(make_train_cfg, tmp_path: Path):
    """A 10-step token budget stopped by Ctrl-C after step 4 and resumed ends like a run never stopped."""
    common = (*TIMED, "trainer.max_tokens=1280", "model.dropout=0.1")  # 10 steps of 128 tokens
    straight = timed_trainer(make_train_cfg(*common), tmp_path / "straight", 1.0).fit()
    assert straight.step == 10
    first = timed_trainer(make_train_cfg(*common), tmp_path / "split", 1.0, signal_at_batch=4).fit()
    assert first.interrupted and first.step == 4
    second = timed_trainer(make_train_cfg(*common, "trainer.resume=auto"), tmp_path / "split", 1.0).fit()
    assert second.step == 10 and second.tokens_seen == 1280 and second.flops == straight.flops
    assert _lrs(tmp_path / "split") == _lrs(tmp_path / "straight")
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "split")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    with pytest.raises(UserError, match=r"already trained on 1,280 tokens.*raise trainer.max_tokens"):
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
    assert Budget(max_tokens=1_500_000).describe() == "1,500,000 tokens"
    assert Budget(max_flops=8.16e12, flops_per_token=1.0).describe() == "8.16e+12 FLOPs"
    ratio = Budget(max_tokens_per_param=2, params=787_296)
    assert ratio.describe() == "2 tokens per parameter (1,574,592 tokens)"
    assert format_duration(3725.9) == "1:02:05" and format_duration(7.2) == "0:07"
    assert Budget(400, 180.0).remaining(100, 60.0, 0, 0.5) == 120.0  # time binds: 120 s < 300 steps x 0.5 s
    assert Budget(400, 180.0).remaining(390, 60.0, 0, 0.5) == 5.0  # steps bind


# Rates of a made-up run: 1,000 tokens per step, 3e6 FLOPs per token (so 3e9 FLOPs per step).
RATES = {"tokens_per_step": 1000, "flops_per_token": 3e6}


@pytest.mark.parametrize("budget, last", [
    (Budget(max_tokens=10_000, **RATES), 10),  # exactly 10 steps of 1,000
    (Budget(max_tokens=10_001, **RATES), 11),  # the first step at or past the limit: one over
    (Budget(max_flops=3e10, **RATES), 10),  # 3e10 / 3e9 per step
    (Budget(max_flops=3.1e10, **RATES), 11),
    (Budget(max_steps=7, max_flops=3e10, **RATES), 7),  # the first limit reached
    (Budget(max_tokens=20_000, max_flops=3e10, **RATES), 10),
    (Budget(max_tokens_per_param=2.0, params=5000, **RATES), 10),  # 2 x 5,000 parameters
    (Budget(max_tokens_per_param=2.5, params=5000, max_tokens=20_000, **RATES), 13),  # 12,500 tokens
])
def test_token_and_flops_budgets_end_at_the_first_step_at_or_past_them(budget: Budget, last: int):
    steps = [s for s in range(1, 30) if budget.done(s, 0.0, s * 1000)]
    assert steps[0] == last == budget.last_step(0, 0)
    assert not budget.done(last - 1, 1e9, (last - 1) * 1000) or budget.max_seconds is not None
    assert budget.last_step(4, 4000) == last  # the same end seen from later on


def test_progress_is_the_share_of_the_furthest_limit():
    budget = Budget(max_steps=100, max_seconds=60.0, max_flops=3e11, **RATES)  # FLOPs: 100,000 tokens
    assert budget.progress(10, 6.0, 10_000) == pytest.approx(0.1)
    assert budget.progress(10, 30.0, 10_000) == pytest.approx(0.5)  # time is ahead
    assert budget.progress(10, 6.0, 40_000) == pytest.approx(0.4)  # FLOPs are ahead (a larger batch)
    assert budget.flops(40_000) == 1.2e11
    assert Budget(max_tokens=5000, max_flops=3e10, **RATES).token_limit == 5000  # 3e10 FLOPs = 10,000 tokens
    # 2 s per step, 40 of the 100 steps left (FLOPs bind at step 100 too; time has 20 s left)
    assert budget.remaining(60, 40.0, 60_000, 2.0) == 20.0
    assert Budget(max_flops=3e11, **RATES).remaining(60, 40.0, 60_000, 2.0) == 80.0


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_the_lr_follows_the_flops_used(schedule: str):
    """The lr of a FLOPs budget is the documented formula of the share of FLOPs used, computed here."""
    cfg = OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.1, schedule=schedule, cooldown_ratio=0.5)
    lr = LRSchedule(cfg, Budget(max_flops=6e10, **RATES)).lr  # 20 steps of 3e9 FLOPs
    for step in range(0, 25):
        p = min(step * 3e9 / 6e10, 1.0)
        decay = 0.5 * (1 + math.cos(math.pi * p)) if schedule == "cosine" else min(1.0, (1 - p) / 0.5)
        assert lr(step, 0.0, step * 1000) == pytest.approx(0.1 + 0.9 * decay), step
    decayed = LRSchedule(OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0, decay_steps=40,
                                     schedule="cosine"), Budget(max_flops=6e11, **RATES))
    assert decayed.progress(10, 0.0, 10_000) == pytest.approx(0.25)  # decay_steps ahead of the FLOPs


@pytest.mark.parametrize("override, message", [
    ("trainer.max_tokens=0", "trainer.max_tokens=0 must be at least 1"),
    ("trainer.max_flops=0", "trainer.max_flops=0.0 must be positive"),
    ("trainer.max_flops=inf", "trainer.max_flops=inf must be positive"),
    ("trainer.max_tokens_per_param=-2", "trainer.max_tokens_per_param=-2.0 must be positive"),
])
def test_bad_token_and_flops_budgets_are_one_line_user_errors(override: str, message: str):
    with pytest.raises(UserError, match=re.escape(message)):
        to_object(compose_train([override]), TrainConfig)


def test_a_flops_budget_is_written_as_a_number():
    cfg = to_object(compose_train(["trainer.max_steps=null", "trainer.max_flops=8.16e12",
                                   "trainer.max_tokens=2000000"]), TrainConfig)
    assert cfg.trainer.max_flops == 8.16e12 and cfg.trainer.max_tokens == 2_000_000


def _budget_worker(rank: int, port: int, root: str, cfg: TrainConfig) -> None:
    """One of two DDP ranks whose clocks disagree: rank 1's runs three times as fast as rank 0's."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    env = DistEnv.from_env()
    with process_group(env):
        trainer = timed_trainer(cfg, Path(root) / "run", 1.0 if rank == 0 else 3.0, env=env)
        lrs, apply = [], trainer.schedule.apply
        trainer.schedule.apply = lambda *args: lrs.append(apply(*args)) or lrs[-1]
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
    Trainer(cfg, tmp_path / "prepare", env=DistEnv())
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


def test_resuming_with_a_larger_flops_budget_says_how_the_lr_moves():
    """A token or FLOPs budget is the schedule's horizon like max_steps: changing it on resume is allowed,
    with one line giving the next step's lr under both budgets (cosine, written out here)."""
    saved = TrainConfig()
    saved.trainer.max_steps, saved.trainer.max_flops = None, 1e12
    saved.optim.schedule, saved.optim.warmup_steps, saved.optim.min_lr_ratio = "cosine", 0, 0.1
    resumed = copy.deepcopy(saved)
    resumed.trainer.max_flops = 2e12
    meta = {"tokens_seen": 50_000, "flops": 5e11, "params": 1000}  # half the saved budget used
    lines = compare(dataclasses.asdict(saved), resumed, "ckpt", 10, 0.0, (1024, 1024), meta)
    peak = saved.optim.lr
    old = peak * (0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)
    new = peak * (0.1 + 0.9 * (1 + math.cos(math.pi * 0.25)) / 2)
    assert lines == [f"trainer.max_flops=2000000000000.0 (the checkpoint's: 1000000000000.0): the schedule's "
                     f"horizon moved, so the lr of step 11 jumps from {old:.2e} to {new:.2e}"]  # 1.58x
