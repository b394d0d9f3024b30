"""Surviving crashes: SIGKILL at several points, then `trainer.resume=auto` ends bitwise where an unbroken
run ends; no partial checkpoint is ever loadable; SIGTERM stops cleanly (every stop signal through the real
command line: test_signals.py); a NaN loss stops or is skipped (divergence: test_divergence.py).

The killed runs are forked child processes (the parent already paid for importing torch). A child runs the
real trainer with one function wrapped so that, at the chosen point, it tells the parent where it is and
waits; the parent then kills it with SIGKILL -- the same thing an OOM killer or a lost machine does.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model, resolve_checkpoint
from minigpt.errors import UserError
from minigpt.model.gpt import GPT
from minigpt.runs.train import train
from minigpt.training import trainer as trainer_module

STEPS = 8
RUN_OVERRIDES = (f"trainer.max_steps={STEPS}", "trainer.ckpt_every=2", "trainer.eval_every=4",
                 "logging.sample_tokens=0", "optim.lr=1e-2")


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "last" / ckpt.WEIGHTS))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _kill_at(cfg, out: Path, install: Callable[[Callable[[str], None]], None]) -> str:
    """Train in a forked child that calls `pause(tag)` somewhere (set up by `install`); SIGKILL it there."""
    read_fd, write_fd = os.pipe()

    def child() -> None:
        os.close(read_fd)

        def pause(tag: str) -> None:
            os.write(write_fd, tag.encode() + b"\n")
            time.sleep(300)  # the parent's SIGKILL arrives here

        install(pause)
        train(cfg, out)
        os.write(write_fd, b"finished\n")

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], 120)
    tag = os.read(read_fd, 100).decode().strip() if ready else "timeout"
    os.close(read_fd)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    return tag


def _check_nothing_partial_is_loadable(run: Path) -> int:
    """Every folder in checkpoints/ either loads completely and consistently, or is refused; returns the step
    that `trainer.resume=auto` will continue from."""
    for folder in (run / "checkpoints").iterdir():
        try:
            model, _, meta = load_model(folder, "cpu")
            state = ckpt.load_state(folder)
        except UserError:
            assert folder.name not in ("last", "best"), f"{folder} is refused"
            continue
        assert state["step"] == meta["step"] and model is not None
    return ckpt.read_meta(resolve_checkpoint(run))["step"]


def _optimizer_step_pausing_at(step: int, pause):
    real, calls = trainer_module.optimizer_step, [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == step:  # gradients computed, weights not yet updated
            pause(f"mid-step {step}")
        return real(*args, **kwargs)

    return wrapped


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_auto_is_bitwise_exact(make_train_cfg, tmp_path: Path):
    reference = train(make_train_cfg(*RUN_OVERRIDES), tmp_path / "straight")
    assert reference.step == STEPS
    run, cfg = tmp_path / "killed", make_train_cfg(*RUN_OVERRIDES, "trainer.resume=auto")

    # 1. In the middle of step 5 (after backward, before the update): the step-4 checkpoint survives.
    def mid_step(pause):
        trainer_module.optimizer_step = _optimizer_step_pausing_at(5, pause)

    assert _kill_at(cfg, run, mid_step) == "mid-step 5"
    assert _check_nothing_partial_is_loadable(run) == 4

    # 2. Halfway through writing state.pt of the step-6 checkpoint: a truncated temporary folder remains.
    def mid_write(pause):
        real_write = ckpt._write_file

        def half_write(file: Path, data) -> None:
            if not (file.parent.name.startswith(".last.tmp") and file.name == ckpt.STATE):  # e.g. `best`
                return real_write(file, data)
            real_write(file, bytes(data)[: len(data) // 2])
            pause("mid-write")

        ckpt._write_file = half_write  # fine inside the forked child only

    assert _kill_at(cfg, run, mid_write) == "mid-write"
    assert any(p.name.startswith(".last.tmp") for p in (run / "checkpoints").iterdir())
    assert _check_nothing_partial_is_loadable(run) == 4

    # 3. Between the two renames of the step-6 checkpoint: `last` is gone for a moment, `.last.old` complete.
    def between_renames(pause):
        real_replace = os.replace

        def replace(src, dst):
            if Path(src).name.startswith(".last.tmp") and not Path(dst).exists():
                pause("between renames")
            real_replace(src, dst)

        ckpt.os.replace = replace  # ckpt.os is the os module: fine inside the forked child only

    assert _kill_at(cfg, run, between_renames) == "between renames"
    assert not (run / "checkpoints" / "last").exists()
    assert _check_nothing_partial_is_loadable(run) == 4

    # 4. Resume to the end: the same weights, bit for bit, and the temporaries are cleaned up.
    result = train(cfg, run)
    assert result.step == STEPS and result.tokens_seen == reference.tokens_seen
    _assert_same(_weights(run), _weights(tmp_path / "straight"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "last"]


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_resumes_exactly(make_train_cfg, tmp_path, monkeypatch):
    train(make_train_cfg(*RUN_OVERRIDES), tmp_path / "straight")
    real, calls = trainer_module.optimizer_step, [0]

    def signalling_step(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step; the step still completes
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "optimizer_step", signalling_step)
    run = tmp_path / "stopped"
    before = signal.getsignal(signal.SIGTERM)
    result = train(make_train_cfg(*RUN_OVERRIDES), run)
    assert result.interrupted and result.step == 3
    assert ckpt.read_meta(run / "checkpoints" / "last")["step"] == 3
    monkeypatch.setattr(trainer_module, "optimizer_step", real)
    assert signal.getsignal(signal.SIGTERM) is before  # the loop's handler is removed after the run
    result = train(make_train_cfg(*RUN_OVERRIDES, "trainer.resume=auto"), run)
    assert not result.interrupted and result.step == STEPS
    _assert_same(_weights(run), _weights(tmp_path / "straight"))


def _nan_loss_at(monkeypatch, steps: set[int]) -> None:
    """Make the model's loss NaN during the given optimizer steps (1-based; one micro-batch per step). A
    step's forward builds a graph; the divergence guard's probe runs in training mode too, but without."""
    real_forward, calls = GPT.forward, [0]

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if targets is not None and self.training and torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] in steps:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


@pytest.mark.slow
def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(make_train_cfg, tmp_path,
                                                                                  monkeypatch):
    _nan_loss_at(monkeypatch, {5})
    run = tmp_path / "run"
    with pytest.raises(UserError, match=r"non-finite.*step 5.*trainer\.on_nonfinite=skip"):
        train(make_train_cfg(*RUN_OVERRIDES, "logging.log_every=3"), run)
    last = run / "checkpoints" / "last"
    assert ckpt.read_meta(last)["step"] == 4
    assert all(torch.isfinite(w).all() for w in _weights(run).values())


@pytest.mark.slow
def test_nonfinite_loss_skip_leaves_the_weights_unchanged(make_train_cfg, tmp_path, monkeypatch):
    _nan_loss_at(monkeypatch, {3})
    run = tmp_path / "run"
    real, calls = trainer_module.optimizer_step, [0]

    def counting_step(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "optimizer_step", counting_step)
    result = train(make_train_cfg(*RUN_OVERRIDES, "trainer.on_nonfinite=skip", "trainer.max_steps=5"), run)
    assert result.step == 5 and result.skipped_steps == 1
    assert calls[0] == 4  # the poisoned step never reached the optimizer
    assert all(torch.isfinite(w).all() for w in _weights(run).values())
