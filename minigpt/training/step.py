"""One training step, split in its two halves: accumulate gradients, then update the weights.

Neither half reads a value back from the device: the loss and the gradient norm are returned as tensors,
so a step can be queued entirely on a GPU while the host prepares the next one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minigpt.training.device import Runtime


def accumulate_gradients(
    model: torch.nn.Module, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]], n_micro: int,
    runtime: Runtime, scaler: torch.amp.GradScaler,
) -> torch.Tensor:
    """Forward and backward `n_micro` micro-batches, summing their gradients; returns the mean loss tensor.

    Each micro-batch loss is divided by `n_micro`, so the summed gradients equal those of one batch
    `n_micro` times larger (the mean over all its tokens), whatever the accumulation.
    """
    loss_sum = torch.zeros((), device=runtime.device)
    for _ in range(n_micro):
        x, y = next_batch()  # (B, T), (B, T)
        with runtime.autocast():
            _, loss = model(x, y)
        loss = loss / n_micro
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    return loss_sum


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler, grad_clip: float,
) -> tuple[torch.Tensor, float]:
    """Clip, update, zero the gradients, advance the schedule; returns (pre-clip grad norm, lr used)."""
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    max_norm = grad_clip or math.inf  # 0 disables clipping; the norm is still computed and logged
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]  # a Python float: reading it costs no sync
    scaler.step(optimizer)  # with fp16, skips the update if the gradients overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return grad_norm, lr
