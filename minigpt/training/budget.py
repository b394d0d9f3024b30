"""When a run ends: after `trainer.max_steps` optimizer steps, after `trainer.max_time` of training, or at
whichever of the two comes first when both are set.

Training time is the throughput meter's clock (`meter.py`): the steps themselves, with evaluation, samples
and checkpoints paused out of it. So a `3min` budget buys 3 minutes of optimisation however often the run
evaluates, and `tokens_per_s x max_time` is the number of tokens it trains on; the run's wall time is that
plus its evaluations, checkpoints and data preparation. The time used is saved in every checkpoint, so a
resumed run continues the remaining budget.

The budget is checked after every step: a time-budgeted run stops at the first step that ends at or past the
budget, so its training time overshoots the budget by less than one step. No torch is imported here (the
config validates `max_time` with `parse_duration`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from minigpt.errors import UserError

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


@dataclass(frozen=True)
class Budget:
    """The run's end: `max_steps` steps and/or `max_seconds` of training time (at least one is set)."""

    max_steps: int | None
    max_seconds: float | None

    def __post_init__(self) -> None:
        if self.max_steps is None and self.max_seconds is None:
            raise UserError("set trainer.max_steps or trainer.max_time (or both: the run ends at the first)")

    def done(self, step: int, seconds: float) -> bool:
        """Whether the run has used its budget after `step` steps and `seconds` of training."""
        if self.max_steps is not None and step >= self.max_steps:
            return True
        return self.max_seconds is not None and seconds >= self.max_seconds

    def describe(self) -> str:
        """What the log says the run will do, e.g. `400 steps` or `3:00 of training or 400 steps, ...`."""
        steps = None if self.max_steps is None else f"{self.max_steps} steps"
        time = None if self.max_seconds is None else f"{format_duration(self.max_seconds)} of training time"
        if steps and time:
            return f"{time} or {steps}, whichever comes first"
        return steps or time  # type: ignore[return-value]

    def remaining(self, step: int, seconds: float, step_s: float) -> float:
        """Estimated training seconds left, with `step_s` the recent seconds per step."""
        left = math.inf
        if self.max_seconds is not None:
            left = self.max_seconds - seconds
        if self.max_steps is not None:
            left = min(left, (self.max_steps - step) * step_s)
        return max(left, 0.0)
