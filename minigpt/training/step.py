"""One training step, split in its two halves: accumulate gradients, then update the weights; and the guard
that stops a diverging run before it writes a checkpoint.

Neither half reads a value back from the device: the loss and the gradient norm are returned as tensors,
so a step can be queued entirely on a GPU while the host prepares the next one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch

from minigpt.cluster import distributed
from minigpt.cluster.dist_env import DistEnv
from minigpt.device.runtime import Runtime, with_cpu_attention
from minigpt.errors import UserError
from minigpt.training.config import TrainConfig, TrainerConfig
from minigpt.training.seeding import forked_random_streams

log = logging.getLogger(__name__)


def grad_accum_steps(tc: TrainerConfig, block_size: int, world_size: int) -> int:
    """Micro-batches per step: `trainer.grad_accum_steps`, or derived from `trainer.tokens_per_step`."""
    if tc.tokens_per_step is None:
        return tc.grad_accum_steps
    micro = tc.batch_size * block_size * world_size
    if tc.tokens_per_step % micro:
        raise UserError(
            f"trainer.tokens_per_step={tc.tokens_per_step} is not a multiple of "
            f"batch_size x block_size x world_size = {micro} "
            f"(try {max(1, round(tc.tokens_per_step / micro)) * micro})"
        )
    return tc.tokens_per_step // micro


def with_attention_kernel(runtime: Runtime, cfg: TrainConfig, world_size: int) -> Runtime:
    """The runtime the steps run under: on a CPU, in one process, with SDPA's kernel chosen for the run's
    attention shape (device/runtime.py `with_cpu_attention`, kept in the data cache folder so that every run
    of this shape on this machine makes the same choice); elsewhere as it is (torch's choice)."""
    m = cfg.model
    if runtime.type != "cpu" or m.attention != "sdpa" or world_size > 1:
        return runtime
    shape = (cfg.trainer.batch_size, m.n_head, m.kv_heads, m.block_size, m.head_dim)
    return with_cpu_attention(runtime, shape, Path(cfg.data.cache_dir))


def accumulate_gradients(
    model: torch.nn.Module, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]], n_micro: int,
    runtime: Runtime, scaler: torch.amp.GradScaler,
) -> torch.Tensor:
    """Forward and backward `n_micro` micro-batches, summing their gradients; returns the mean loss tensor.

    Each micro-batch loss is divided by `n_micro`, so the summed gradients equal those of one batch
    `n_micro` times larger (the mean over all its tokens), whatever the accumulation. Under DDP/FSDP only the
    last backward averages the gradients across ranks (`gradient_sync`); the others just accumulate locally.
    """
    loss_sum = torch.zeros((), device=runtime.device)
    for i in range(n_micro):
        x, y = next_batch()  # (B, T), (B, T)
        with distributed.gradient_sync(model, enabled=i == n_micro - 1):
            with runtime.autocast():
                _, loss = model(x, y, return_logits=False)  # the loss alone: fused with the head (gpt.py)
            loss = loss / n_micro
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
    return loss_sum


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, grad_clip: float,
) -> torch.Tensor:
    """Clip, update, zero the gradients; returns the pre-clip grad norm. The caller sets the lr beforehand
    (`optim.LRSchedule.apply`)."""
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    max_norm = grad_clip or math.inf  # 0 disables clipping; the norm is still computed and logged
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # with fp16, skips the update if the gradients overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


class DivergenceError(UserError):
    """The loss became NaN, infinite, or exploded: a diverging run (too high a learning rate, too short a
    warmup). Raised before anything diverged is written."""


class DivergenceGuard:
    """Watches every loss the run computes and stops the run before a diverged model is saved.

    A loss has diverged when it is not finite, or when it is above both `ratio` times the best (lowest) loss
    of its kind so far and ln V, the loss of a uniform guess over the tokenizer's V tokens:

        diverged(loss) = not finite(loss)  or  loss > max(ratio * best, ln V)

    A healthy run's loss moves by tens of percent from step to step and does not climb back by a factor of
    ten, while a diverging one jumps by orders of magnitude within a few steps (docs/faults.md has both). The
    ln V floor keeps a run whose loss is near zero (a model that can copy, as in the no-causal-mask ablation)
    from being stopped by a jump from 0.01 to 0.2: only a loss worse than knowing nothing counts. Training
    losses are compared with the best training loss since this process started training (a resumed run
    starts from its checkpoint's best validation loss), validation losses with the best validation loss.

    policy stop (default): remember, on the device, the first step whose loss diverged -- no host sync on
        the hot path -- and raise in `check`, which the trainer calls at log intervals and before every
        checkpoint.
    policy skip: read the loss every step (one host sync per step, the price of deciding before the
        update) and skip the update of a step whose loss is not finite on any rank; one that explodes
        still stops the run.

    Before a checkpoint is written, `check_weights` makes sure its weights are finite and give a training
    loss that has not diverged on the latest batch (the loss the next step would see): `last` and `best`
    always hold a model that can train on. That loss is computed as the steps compute theirs, in training
    mode, so it is compared like with like: a model whose two modes differ by design (one trained without
    the causal mask is causal in eval mode only, and copies the next token in training) has an eval-mode loss
    far above its training losses without having diverged.
    """

    def __init__(self, policy: str, ratio: float | None, vocab_size: int, device: torch.device,
                 best: float = math.inf) -> None:
        self.policy, self.ratio, self.skipped = policy, ratio, 0
        self.floor = math.log(vocab_size)
        self.first_bad_step = torch.zeros((), dtype=torch.long, device=device)  # 0: none (steps count from 1)
        self.bad_loss = torch.zeros((), device=device)
        self.best = torch.full((), best, device=device)  # the lowest finite training loss so far

    def diverged(self, loss: torch.Tensor, best: torch.Tensor | float) -> torch.Tensor:
        """The rule of the class docstring, as a boolean tensor (on the loss' device)."""
        bad = ~torch.isfinite(loss)
        if self.ratio is not None:
            limit = torch.clamp(torch.as_tensor(best, device=loss.device) * self.ratio, min=self.floor)
            bad = bad | (loss > limit)
        return bad

    def should_skip(self, loss: torch.Tensor, step: int, env: DistEnv) -> bool:
        """Called after the backward pass of step `step` (1-based), before its update."""
        loss = loss.detach().float()
        skip = self.policy == "skip" and distributed.any_rank(not bool(torch.isfinite(loss)), env)
        bad = self.diverged(loss, self.best)
        if self.policy == "skip":
            bad = bad & torch.isfinite(loss)  # skipped below, not fatal
        first = bad & (self.first_bad_step == 0)
        self.first_bad_step = torch.where(first, step, self.first_bad_step)
        self.bad_loss = torch.where(first, loss, self.bad_loss)
        self.best = torch.where(torch.isfinite(loss), torch.minimum(self.best, loss), self.best)
        if skip:
            self.skipped += 1
            log.warning("step %d: the loss is not finite on at least one rank; update skipped "
                        "(trainer.on_nonfinite=skip, %d skipped so far)", step, self.skipped)
        return skip

    def check(self, env: DistEnv, on_disk: Callable[[], str]) -> None:
        """Raise DivergenceError on every rank if a training loss diverged on any; `on_disk()` tells what to
        resume from."""
        step = distributed.min_positive_over_ranks(int(self.first_bad_step.item()), env)
        if step:
            mine = int(self.first_bad_step) == step
            loss = self._agreed_loss(float(self.bad_loss) if mine else None, env)
            raise DivergenceError(self.message("training", step, loss, float(self.best), on_disk()))

    def check_weights(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor] | None,
                      runtime: Runtime, step: int, env: DistEnv, on_disk: Callable[[], str]) -> None:
        """Before a checkpoint of step `step`: raise DivergenceError (on every rank) unless the weights are
        finite and their training loss on `batch` has not diverged from the best training loss. Training
        mode, as the steps have it (the class docstring says why); its dropout draws come from forked random
        streams, so the run's own streams go on as if it had not been computed. Under FSDP the forward is a
        collective: every rank calls this."""
        loss = math.nan
        finite = all(bool(torch.isfinite(distributed.local_tensor(p)).all()) for p in model.parameters())
        if finite and batch is not None:
            was_training = model.training
            model.train()
            with torch.no_grad(), forked_random_streams(runtime.device), runtime.autocast():
                _, probe = model(*batch, return_logits=False)
            model.train(was_training)
            loss = float(probe)
        bad = not finite or (batch is not None and bool(self.diverged(torch.tensor(loss), float(self.best))))
        if distributed.any_rank(bad, env):
            loss = self._agreed_loss(loss if bad else None, env)
            raise DivergenceError(self.message("training", step + 1, loss, float(self.best), on_disk()))

    def check_val(self, val_loss: float, best_val: float, step: int, on_disk: Callable[[], str]) -> None:
        """Raise DivergenceError if a validation loss (the same on every rank) diverged."""
        if bool(self.diverged(torch.tensor(val_loss), best_val)):
            raise DivergenceError(self.message("validation", step, val_loss, best_val, on_disk()))

    def message(self, kind: str, step: int, loss: float, best: float, on_disk: str) -> str:
        if math.isfinite(loss):
            what = (f"the {kind} loss exploded at step {step} ({loss:.4g}: over {self.ratio:g}x the run's "
                    f"best, {best:.4g}, and worse than a uniform guess, ln V = {self.floor:.3g})")
        else:
            what = f"the {kind} loss became non-finite (NaN or inf) at step {step}"
        return f"{what}; stopped before writing a checkpoint; {on_disk}"

    @staticmethod
    def _agreed_loss(mine: float | None, env: DistEnv) -> float:
        """The diverged loss as the ranks that saw it report it (any non-finite one wins): the same number on
        every rank, so every rank raises the same message."""
        nonfinite = mine is not None and not math.isfinite(mine)
        flag, value = distributed.max_over_ranks(
            [float(nonfinite), mine if mine is not None and math.isfinite(mine) else -math.inf], env)
        return math.nan if flag > 0 else value
