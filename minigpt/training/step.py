"""One training step, split in its two halves: accumulate gradients, then update the weights.

Neither half reads a value back from the device: the loss and the gradient norm are returned as tensors,
so a step can be queued entirely on a GPU while the host prepares the next one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from minigpt.device.runtime import Runtime
from minigpt.errors import UserError
from minigpt.training import distributed
from minigpt.training.config import TrainerConfig
from minigpt.training.dist_env import DistEnv

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


class NonFiniteLossError(UserError):
    """The loss became NaN or infinite: a diverging run (too high a learning rate, too short a warmup)."""


class NonFiniteGuard:
    """Watches the loss for NaN/inf, per `trainer.on_nonfinite`.

    stop (default): remember, on the device, the first step whose loss was not finite -- no host sync on the
        hot path -- and raise in `check`, which the trainer calls at log intervals and before every
        checkpoint, so a diverged model never overwrites a good checkpoint.
    skip: read the loss every step (one host sync per step, the price of deciding before the update) and
        skip the update of a step whose loss is not finite on any rank.
    """

    def __init__(self, policy: str, device: torch.device) -> None:
        self.policy, self.skipped = policy, 0
        self.first_bad_step = torch.zeros((), dtype=torch.long, device=device)  # 0: none (steps count from 1)

    def should_skip(self, loss: torch.Tensor, step: int, env: DistEnv) -> bool:
        """Called after the backward pass of step `step` (1-based), before its update."""
        bad = ~torch.isfinite(loss)
        if self.policy == "skip":
            if not distributed.any_rank(bool(bad), env):
                return False
            self.skipped += 1
            log.warning("step %d: the loss is not finite on at least one rank; update skipped "
                        "(trainer.on_nonfinite=skip, %d skipped so far)", step, self.skipped)
            return True
        self.first_bad_step = torch.where(bad & (self.first_bad_step == 0), step, self.first_bad_step)
        return False

    def check(self, env: DistEnv, on_disk: Callable[[], str]) -> None:
        """Raise NonFiniteLossError if a step's loss was not finite (policy stop); `on_disk()` tells what is
        saved."""
        if self.policy != "stop":
            return
        step = distributed.min_positive_over_ranks(int(self.first_bad_step.item()), env)
        if step:
            raise NonFiniteLossError(
                f"the training loss became non-finite (NaN or inf) at step {step}; stopped, and {on_disk()} "
                "(lower optim.lr, raise optim.warmup_steps, or set trainer.on_nonfinite=skip to skip such "
                "steps)"
            )
