"""The throughput clock: tokens per second and model-FLOPs utilisation of the training steps alone.

Evaluation, sampling and checkpointing are not training work, so they run with the clock paused
(`paused()`); the device is synchronised at each boundary, because queued GPU work would otherwise be
charged to whichever interval happens to wait for it. The numbers are read once per log interval, the
loop's only host-device sync.

    MFU = flops_per_token * (tokens_per_s / world_size) / peak_flops

per device: `tokens_per_s` counts every rank's tokens, and each of the `world_size` devices did its share of
them. `flops_per_token` is the model's own count (`GPT.flops_per_token`: 6N + attention) and `peak_flops` one
device's peak in the dtype the matmuls run in (`device/runtime.peak_flops`). The same clock (`seconds`)
measures a run's training time against `trainer.max_time` (`budget.py`), so tokens/s x training time =
tokens trained.

No MFU above 100% is ever reported. A datasheet peak is a true bound, but a measured one is a 0.2 s probe of
square matmuls: a busy machine can slow the probe more than the model, and the model's own shapes may tile
better. So the peak is the best rate seen on this device in this run, the probe's or the model's own: when an
interval beats the peak, the peak is raised to it (MFU 100%), a warning says so once, and later intervals
are measured against the raised peak.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Interval:
    """What one log interval measured."""

    steps: int
    seconds: float
    tokens_per_s: float  # every rank's tokens
    mfu: float  # per device, in [0, 1]

    @property
    def step_s(self) -> float:
        return self.seconds / max(self.steps, 1)


class ThroughputMeter:
    """Counts training steps and their wall-clock time between `interval()` calls (and over the run)."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float, world_size: int,
                 synchronize: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token  # tokens: all ranks
        self.peak_flops, self.world_size = peak_flops, world_size  # peak: of one device
        self.peak_raised = False  # the model beat the given peak once (see the module docstring)
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
        return Interval(steps, seconds, tokens_per_s, self.mfu(tokens_per_s))

    def mfu(self, tokens_per_s: float) -> float:
        """Model FLOPs utilisation of one device at a throughput of `tokens_per_s` over all ranks."""
        achieved = self.flops_per_token * tokens_per_s / self.world_size  # FLOP/s of one device
        if achieved > self.peak_flops:
            if not self.peak_raised:
                log.warning("the model reached %.4g FLOP/s per device, above the peak MFU is measured "
                            "against (%.4g, a probe or device.peak_tflops); that rate is the peak from now "
                            "on (set device.peak_tflops to the true peak of the dtype in use)", achieved,
                            self.peak_flops)
            self.peak_flops, self.peak_raised = achieved, True
        return achieved / self.peak_flops

    @property
    def run_tokens_per_s(self) -> float:
        """Mean throughput over the closed intervals of the whole run."""
        return self.total_steps * self.tokens_per_step / max(self.total_time, 1e-9)

    @property
    def run_mfu(self) -> float:
        """MFU per device over the closed intervals of the whole run."""
        return self.mfu(self.run_tokens_per_s)
