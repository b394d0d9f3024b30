"""The thread count re-chosen mid-run (device/governor.py), fed step times as the trainer feeds them and a
load the test sets: down after a sharp drop with a core taken, back up once it is free, no flapping."""

from __future__ import annotations

import json
import logging

import pytest
from test_threads import FakeLoad

from minigpt.device.governor import DROP_MEASURE_SECONDS, RECHECK_SECONDS, SETTLE_STEPS, ThreadGovernor
from minigpt.device.threads import ThreadChoice

TOKENS = 1024  # per step
QUICK, SLOW = 0.1, 0.3  # seconds per step: quiet, and beside a competitor with one thread too many


class Run:
    """A run's training clock, fed to a governor step by step."""

    def __init__(self, threads: int = 2, busy: float = 0.0, measured: bool = True) -> None:
        self.load = FakeLoad(busy)
        self.set: list[int] = []
        choice = ThreadChoice(threads, "test", ceiling=2, measured=measured)
        self.governor = ThreadGovernor(choice, cpu_load=self.load, set_threads=self.set.append)
        self.clock = 0.0

    def steps(self, n: int, seconds: float) -> None:
        for _ in range(n):
            self.clock += seconds
            self.governor.step_done(self.clock, TOKENS)


def test_a_sharp_drop_with_a_core_taken_goes_down_and_a_freed_core_comes_back(caplog) -> None:
    run = Run()
    with caplog.at_level(logging.INFO, logger="minigpt.device.governor"):
        run.steps(1 + SETTLE_STEPS + 10, QUICK)  # quiet: 2 threads stay
        assert run.set == []
        run.load.busy = 1.0  # a busy loop starts
        run.steps(SETTLE_STEPS, SLOW)  # the drop is noticed ...
        assert run.set == []
        run.steps(int(DROP_MEASURE_SECONDS / SLOW) + 1, SLOW)  # ... and measured for a second of training
        assert run.set == [1] and run.governor.threads == 1
        run.steps(int(RECHECK_SECONDS / QUICK) - 5, QUICK)  # it keeps running: one thread stays
        assert run.set == [1]
        run.load.busy = 0.02  # it ends
        run.steps(int(RECHECK_SECONDS / QUICK) + 1, QUICK)
    assert run.set == [1, 2] and run.governor.changes == 2
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0] == "threads: 2 -> 1 (tokens/s fell to 0.33x; other processes keep 1.00 of 2 cores busy)"
    assert lines[1] == "threads: 1 -> 2 (other processes keep 0.02 of 2 cores busy)"


def test_a_run_slow_from_its_start_gives_up_the_taken_core_at_the_first_recheck() -> None:
    run = Run(busy=1.0)  # a second training started at the same moment: no drop to notice
    run.steps(int(RECHECK_SECONDS / SLOW), SLOW)
    assert run.set == []
    run.steps(2, SLOW)
    assert run.set == [1]


@pytest.mark.parametrize("busy", [0.3, 0.45])
def test_between_a_quarter_and_half_a_core_neither_count_moves(busy: float) -> None:
    """The band that stops it flapping: half a core taken to give one up, under a quarter to take it back."""
    for threads in (1, 2):
        run = Run(threads=threads, busy=busy)
        run.steps(1 + SETTLE_STEPS, QUICK)
        run.steps(SETTLE_STEPS + int(DROP_MEASURE_SECONDS / SLOW) + 1, SLOW)  # a drop, measured
        run.steps(3 * int(RECHECK_SECONDS / QUICK), QUICK)  # and three rechecks
        assert run.set == [], (threads, busy)


def test_a_drop_the_load_does_not_explain_becomes_the_new_normal() -> None:
    """Longer sequences or a slower clock: measured once, then compared with as the speed, not every step."""
    run = Run()
    run.steps(1 + SETTLE_STEPS, QUICK)
    measured = []
    run.load.others_busy = lambda since: measured.append(run.clock) or 0.0
    run.steps(SETTLE_STEPS + 3 * int(DROP_MEASURE_SECONDS / SLOW), SLOW)
    assert len(measured) == 1 and run.set == []


@pytest.mark.parametrize("kind", ["set by device.threads", "one thread at most", "not a CPU run"])
def test_a_count_that_was_not_measured_or_not_on_a_cpu_is_left_alone(kind: str) -> None:
    run = Run(measured=kind != "set by device.threads")
    if kind == "one thread at most":
        run.governor = ThreadGovernor(ThreadChoice(1, "OMP_NUM_THREADS=1", ceiling=1, measured=False),
                                      cpu_load=run.load, set_threads=run.set.append)
    if kind == "not a CPU run":
        run.governor = ThreadGovernor(ThreadChoice(2, "test", ceiling=2, measured=True), enabled=False,
                                      cpu_load=run.load, set_threads=run.set.append)
    run.load.busy = 2.0
    run.steps(1 + SETTLE_STEPS, QUICK)
    run.steps(3 * int(RECHECK_SECONDS / SLOW), SLOW)
    assert run.set == []


@pytest.mark.slow
def test_the_trainer_feeds_the_governor_every_step_and_records_its_threads(make_train_cfg, tmp_path,
                                                                           monkeypatch) -> None:
    from minigpt.runs.train import train

    fed: list[tuple[float, int]] = []
    monkeypatch.setattr(ThreadGovernor, "step_done", lambda self, clock, tokens: fed.append((clock, tokens)))
    cfg = make_train_cfg("trainer.max_steps=3", "logging.sample_tokens=0")
    result = train(cfg, tmp_path / "run")
    clocks, tokens = zip(*fed, strict=True)
    assert len(fed) == 3 and list(clocks) == sorted(clocks) and clocks[0] > 0
    assert set(tokens) == {cfg.trainer.batch_size * cfg.model.block_size}
    machine = json.loads((result.checkpoint / "meta.json").read_text())["machine"]
    assert (machine["threads"], machine["threads_reason"]) == (1, "OMP_NUM_THREADS=1")  # tests/conftest.py
