"""How far along a run is: its budget (when it ends) and the clock and meter that measure it.

**The budget.** A run ends after `trainer.max_steps` optimizer steps, `trainer.max_time` of training,
`trainer.max_tokens` training tokens, `trainer.max_flops` model FLOPs or `trainer.max_tokens_per_param`
tokens per parameter, whichever of those that are set comes first. FLOPs are the model's own count per
trained token (`GPT.flops_per_token`, the count MFU uses) times the tokens trained, so a FLOPs budget is a
token budget scaled by the model's cost: a model twice as costly per token trains on half the tokens. Tokens
per parameter scale the other way, with the model's size (its non-embedding parameters, `GPT.num_params`,
the N of the 6N FLOPs per token): the budget of a scaling ladder, whose sizes all train at one ratio. All
three are counted, not timed, so two runs with the same budget do the same work on any machine, busy or
idle; that is what makes their losses comparable. Time is for "what can I get in 3 minutes on my machine".

Training time is the throughput meter's clock (below): the steps themselves, with evaluation, samples
and checkpoints paused out of it. So a `3min` budget buys 3 minutes of optimisation however often the run
evaluates, and `tokens_per_s x max_time` is the number of tokens it trains on; the run's wall time is that
plus its evaluations, checkpoints and data preparation. The steps, tokens and time used are saved in every
checkpoint, so a resumed run continues the remaining budget, in any of its units.

The budget is checked after every step: a run stops at the first step that ends at or past one of its
limits, so it overshoots a time, token or FLOPs budget by less than one step. `progress` is the share of the
budget used, the larger over the limits that are set; the lr schedule follows it (`optim.LRSchedule`). No
torch is imported here (the config validates `max_time` with `parse_duration`).

**The meter.** Tokens per second and model-FLOPs utilisation of the training steps alone. Evaluation,
sampling and checkpointing are not training work, so they run with the clock paused (`paused()`); the device
is synchronised at each boundary, because queued GPU work would otherwise be charged to whichever interval
happens to wait for it. The numbers are read once per log interval, the loop's only host-device sync.

    MFU = flops_per_token * (tokens_per_s / world_size) / peak_flops

per device: `tokens_per_s` counts every rank's tokens, and each of the `world_size` devices did its share of
them. `flops_per_token` is the model's own count (`GPT.flops_per_token`: 6N + attention) and `peak_flops` one
device's peak in the dtype the matmuls run in (`device/runtime.peak_flops`). The same clock (`seconds`)
measures a run's training time against `trainer.max_time`, so tokens/s x training time = tokens trained.

No MFU above 100% is ever reported. A datasheet peak is a true bound, but a measured one is a 0.2 s probe of
square matmuls: a busy machine can slow the probe more than the model, and the model's own shapes may tile
better. So the peak is the best rate seen on this device in this run, the probe's or the model's own: when an
interval beats the peak, the peak is raised to it (MFU 100%), a warning says so once, and later intervals
are measured against the raised peak.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from minigpt.errors import UserError

log = logging.getLogger(__name__)

# Unit -> seconds. One spelling each: `m` would be minutes to some readers and metres or months to others.
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(s|min|h)")


def parse_duration(text: str, key: str = "trainer.max_time") -> float:
    """Seconds in `text`: a positive number and a unit, `90s`, `3min`, `1.5h`, or several, `1h30min`."""
    compact = str(text).replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(a + u for a, u in parts) != compact:
        raise UserError(f"{key}={text!r} is not a duration; write a number and a unit (s, min, h), "
                        "e.g. 90s, 3min, 1h30min")
    seconds = sum(float(amount) * UNITS[unit] for amount, unit in parts)
    if not seconds > 0 or not math.isfinite(seconds):
        raise UserError(f"{key}={text!r} must be a positive duration, e.g. 90s or 3min")
    return seconds


def format_duration(seconds: float) -> str:
    """`1:05:09`, `3:00`, `0:07`: hours only when there are any; rounded down to the second."""
    whole = int(max(seconds, 0.0))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_count(n: float) -> str:
    """`1.23e+12`: a FLOPs count (or a large token count) in three significant digits."""
    return f"{n:.3g}" if abs(n) < 1e5 else f"{n:.2e}"


@dataclass(frozen=True)
class Budget:
    """The run's end: any of `max_steps`, `max_seconds` of training, `max_tokens`, `max_flops` (at least one).

    `tokens_per_step` (every rank's), `flops_per_token` and `params` (the model's, `GPT.flops_per_token` and
    `GPT.num_params`) are the run's rates: they turn tokens into FLOPs, and the token, FLOPs and ratio limits
    into the step the run will end at. `warmup_tokens`: the tokens of each of the first steps where a
    batch-size warmup trains on fewer than `tokens_per_step` (training/batch_schedule.py).
    """

    max_steps: int | None = None
    max_seconds: float | None = None
    max_tokens: int | None = None
    max_flops: float | None = None
    max_tokens_per_param: float | None = None
    tokens_per_step: int = 1
    flops_per_token: float = 0.0  # unknown: then no FLOPs limit can be set
    params: int = 0  # unknown: then no tokens-per-parameter limit can be set
    warmup_tokens: tuple[int, ...] = ()  # steps 0, 1, ... of a batch-size warmup

    def __post_init__(self) -> None:
        limits = (self.max_steps, self.max_seconds, self.max_tokens, self.max_flops)
        if all(v is None for v in (*limits, self.max_tokens_per_param)):
            raise UserError("set a budget: trainer.max_steps, trainer.max_time, trainer.max_tokens, "
                            "trainer.max_flops or trainer.max_tokens_per_param (with several, the run ends "
                            "at the first)")
        if self.max_flops is not None and not self.flops_per_token > 0:
            raise ValueError("a FLOPs budget needs the model's flops_per_token")
        if self.max_tokens_per_param is not None and not self.params > 0:
            raise ValueError("a tokens-per-parameter budget needs the model's parameter count")

    def flops(self, tokens: int) -> float:
        """Model FLOPs of training on `tokens` tokens."""
        return tokens * self.flops_per_token

    @property
    def token_limit(self) -> float | None:
        """The tokens the token, FLOPs and ratio limits allow (the smallest), or None when none is set."""
        limits = []
        if self.max_tokens is not None:
            limits.append(float(self.max_tokens))
        if self.max_flops is not None:
            limits.append(self.max_flops / self.flops_per_token)
        if self.max_tokens_per_param is not None:
            limits.append(self.max_tokens_per_param * self.params)
        return min(limits) if limits else None

    def progress(self, step: int, seconds: float, tokens: int) -> float:
        """The share of the budget used after `step` steps, `seconds` of training and `tokens` tokens: the
        largest over the limits that are set (1 or more: the budget is used up)."""
        shares = []
        if self.max_steps is not None:
            shares.append(step / self.max_steps)
        if self.max_seconds is not None:
            shares.append(seconds / self.max_seconds)
        if self.token_limit is not None:
            shares.append(tokens / self.token_limit)
        return max(shares)

    def done(self, step: int, seconds: float, tokens: int) -> bool:
        """Whether the run has used its budget after `step` steps, `seconds` of training, `tokens` tokens."""
        return self.progress(step, seconds, tokens) >= 1.0

    def last_step(self, step: int, tokens: int) -> int | None:
        """The step the step, token and FLOPs limits end the run at, from `step` with `tokens` seen (None
        with a time budget alone: how many steps it buys depends on the machine)."""
        ends = [] if self.max_steps is None else [self.max_steps]
        if self.token_limit is not None:
            left, end = self.token_limit - tokens, step
            while left > 0 and end < len(self.warmup_tokens):  # the warmup's short steps, one by one
                left, end = left - self.warmup_tokens[end], end + 1
            ends.append(end + max(math.ceil(left / self.tokens_per_step), 0))
        return min(ends) if ends else None

    def describe(self) -> str:
        """What the log says the run will do: `400 steps`, `3:00 of training time or 400 steps, whichever
        comes first`."""
        parts = []
        if self.max_seconds is not None:
            parts.append(f"{format_duration(self.max_seconds)} of training time")
        if self.max_flops is not None:
            parts.append(f"{format_count(self.max_flops)} FLOPs")
        if self.max_tokens is not None:
            parts.append(f"{self.max_tokens:,} tokens")
        if self.max_tokens_per_param is not None:
            parts.append(f"{self.max_tokens_per_param:g} tokens per parameter "
                         f"({self.max_tokens_per_param * self.params:,.0f} tokens)")
        if self.max_steps is not None:
            parts.append(f"{self.max_steps} steps")
        return " or ".join(parts) + (", whichever comes first" if len(parts) > 1 else "")

    def remaining(self, step: int, seconds: float, tokens: int, step_s: float) -> float:
        """Estimated training seconds left, with `step_s` the recent seconds per step."""
        left = math.inf
        if self.max_seconds is not None:
            left = self.max_seconds - seconds
        last = self.last_step(step, tokens)
        if last is not None:
            left = min(left, (last - step) * step_s)
        return max(left, 0.0)


# -------------------------------------------------------------------------------------------------- the meter


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

    def __init__(self, flops_per_token: float, peak_flops: float, world_size: int,
                 synchronize: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.flops_per_token = flops_per_token
        self.peak_flops, self.world_size = peak_flops, world_size  # peak: of one device
        self.peak_raised = False  # the model beat the given peak once (see the module docstring)
        self.synchronize, self.clock = synchronize, clock
        self.start = clock()  # of the running stretch of training work
        self.window_steps, self.window_tokens, self.window_time = 0, 0, 0.0  # this interval, before the
        # running stretch; tokens: every rank's
        self.total_tokens, self.total_time = 0, 0.0  # every closed interval of the run

    def restart(self) -> None:
        """Start the running stretch now (at the loop's start: setting up the run is not training work)."""
        self.start = self.clock()

    def step_done(self, tokens: int) -> None:
        """One step of `tokens` tokens (every rank's) done."""
        self.window_steps += 1
        self.window_tokens += tokens

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
        steps, tokens = self.window_steps, self.window_tokens
        self.total_tokens, self.total_time = self.total_tokens + tokens, self.total_time + seconds
        self.start, self.window_steps, self.window_tokens, self.window_time = now, 0, 0, 0.0
        tokens_per_s = tokens / max(seconds, 1e-9)
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
        return self.total_tokens / max(self.total_time, 1e-9)

    @property
    def run_mfu(self) -> float:
        """MFU per device over the closed intervals of the whole run."""
        return self.mfu(self.run_tokens_per_s)
