"""The throughput clock: tokens per second and model-FLOPs utilisation of the training steps alone.

Evaluation, sampling and checkpointing are not training work, so they run with the clock paused
(`paused()`); the device is synchronised at each boundary, because queued GPU work would otherwise be
charged to whichever interval happens to wait for it. The numbers are read once per log interval, the
loop's only host-device sync.

    MFU = flops_per_token * tokens_per_s / peak_flops

with `flops_per_token` the model's own count (`GPT.flops_per_token`: 6N + attention) and `peak_flops` the
device's peak in the dtype the matmuls run in. The same clock (`seconds`) measures a run's training time
against `trainer.max_time` (`budget.py`), so tokens/s x training time = tokens trained.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass
class Interval:
    """What one log interval measured."""

    steps: int
    seconds: float
    tokens_per_s: float
    mfu: float

    @property
    def step_s(self) -> float:
        return self.seconds / max(self.steps, 1)


class ThroughputMeter:
    """Counts training steps and their wall-clock time between `interval()` calls (and over the run)."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float,
                 synchronize: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_flops = peak_flops
        self.synchronize, self.clock = synchronize, clock
        self.start = clock()  # of the running stretch of training work
        self.window_steps, self.window_time = 0, 0.0  # this interval, before the running stretch
        self.total_steps, self.total_time = 0, 0.0  # every closed interval of the run

    def restart(self) -> None:
        """Start the running stretch now (at the loop's start: setting up the run is not training work)."""
        self.start = self.clock()

    def step_done(self) -> None:
        self.window_steps += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run the block (evaluation, a checkpoint) outside the clock."""
        self.synchronize()
        self.window_time += self.clock() - self.start
        try:
            yield
        finally:
            self.start = self.clock()

    @property
    def seconds(self) -> float:
        """Training time since the meter was built: every closed interval, plus the open one up to now.

        Call it between steps, not inside `paused()`. No device sync: on a GPU the host may be a step or two
        ahead of the queued work, which `interval()` settles at the next log line.
        """
        return self.total_time + self.window_time + self.clock() - self.start

    def interval(self) -> Interval:
        """Close the current interval (one device sync) and return what it measured."""
        self.synchronize()
        now = self.clock()
        seconds = self.window_time + now - self.start
        steps = self.window_steps
        self.total_steps, self.total_time = self.total_steps + steps, self.total_time + seconds
        self.start, self.window_steps, self.window_time = now, 0, 0.0
        tokens_per_s = steps * self.tokens_per_step / max(seconds, 1e-9)
        return Interval(steps, seconds, tokens_per_s, self.flops_per_token * tokens_per_s / self.peak_flops)

    @property
    def run_tokens_per_s(self) -> float:
        """Mean throughput over the closed intervals of the whole run."""
        return self.total_steps * self.tokens_per_step / max(self.total_time, 1e-9)
