"""The thread count re-chosen while a run trains: a process that starts beside it (a browser, a second
training) should not cost it 3x until it ends, and the cores it leaves should come back.

The trainer calls `step_done(clock_s, tokens)` after every step, with its training clock. The governor keeps
the seconds per token of the last few steps, and a CPU sample (cpu_load.py) taken at its last decision, and
chooses again, by the rule of threads.py, from the load measured since that sample:

    soon after a sharp drop   the last SETTLE_STEPS steps' median seconds per token is DROP_RATIO times what
                              it was after the last decision: the load is measured over the next
                              DROP_MEASURE_SECONDS of training (no pause: this process's own time is not
                              counted), then the count chosen again
    every RECHECK_SECONDS     from the load averaged since the last decision: a run slow from its first step
                              has no drop to notice, and cores that come free raise no alarm either

Hysteresis, so that it does not flap: a core is given up once others keep it busy more than half the time
(threads.TAKEN_ABOVE) but taken back only once they use less than a quarter of it (FREE_BELOW); a drop is
judged against SETTLE_STEPS steps at the current count, and decisions are DROP_MEASURE_SECONDS apart at
least. Two governed runs on one machine each see the other's threads as busy cores and settle on sharing
them. Every change is one log line.

It governs only a measured choice (`device.threads` unset) of more than one thread on a CPU: on a GPU the
steps' time is the GPU's.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable

import torch

from minigpt.device.cpu_load import CpuLoad, CpuSample
from minigpt.device.threads import ThreadChoice, threads_for

log = logging.getLogger(__name__)

SETTLE_STEPS = 5  # steps whose median is a speed: one slow step (a page fault, a log write) is not a drop
DROP_RATIO = 1.5  # seconds per token this many times the settled speed's is a drop worth measuring for
DROP_MEASURE_SECONDS = 1.0  # long enough that a burst of a fraction of a second is not a taken core
RECHECK_SECONDS = 10.0
FREE_BELOW = 0.25  # a core given up is taken back once others keep it busy less than this share of the time


class ThreadGovernor:
    """Re-chooses `choice`'s thread count from the step times it is fed and the load it measures."""

    def __init__(self, choice: ThreadChoice, enabled: bool = True, cpu_load: CpuLoad | None = None,
                 set_threads: Callable[[int], None] = torch.set_num_threads) -> None:
        self.threads, self.ceiling = choice.threads, choice.ceiling
        self.cpu_load = cpu_load or CpuLoad()
        self.enabled = enabled and choice.measured and choice.ceiling > 1
        self.set_threads = set_threads
        self.per_token: deque[float] = deque(maxlen=SETTLE_STEPS)  # seconds per token of the last steps
        self.settled: float | None = None  # the median of per_token once it filled after the last decision
        self.last_clock: float | None = None
        self.since: tuple[float, CpuSample | None] = (0.0, None)  # the last decision's clock and CPU sample
        self.drop: float | None = None  # while a drop is measured: its speed relative to the settled one
        self.changes = 0

    def step_done(self, clock_s: float, tokens: int) -> None:
        """A step of `tokens` tokens ended at `clock_s` on the training clock (seconds)."""
        if not self.enabled:
            return
        if self.last_clock is None:  # the first step times allocations and warm-up, not the machine
            self.last_clock = clock_s
            self._start_window(clock_s)
            return
        self.per_token.append((clock_s - self.last_clock) / max(tokens, 1))
        self.last_clock = clock_s
        opened = clock_s - self.since[0]
        if self.drop is not None:
            if opened >= DROP_MEASURE_SECONDS:
                self._decide(clock_s)
            return
        if opened >= RECHECK_SECONDS:
            self._decide(clock_s)
            return
        if len(self.per_token) < SETTLE_STEPS:
            return
        now = statistics.median(self.per_token)
        if self.settled is None:
            self.settled = now
        elif now > DROP_RATIO * self.settled:
            self.drop = self.settled / now
            self._start_window(clock_s)

    def _start_window(self, clock_s: float) -> None:
        self.since = (clock_s, self.cpu_load.sample())

    def _decide(self, clock_s: float) -> None:
        """Choose again from the load since the window opened; set, log and count a change."""
        sample = self.since[1]
        busy = None if sample is None else self.cpu_load.others_busy(sample)
        if busy is None:  # /proc/stat went away: keep the count there is
            self.enabled = False
            return
        give_up = threads_for(busy, self.cpu_load.cores, self.ceiling)
        take_back = threads_for(busy, self.cpu_load.cores, self.ceiling, taken_above=FREE_BELOW)
        threads = give_up if give_up < self.threads else max(take_back, self.threads)
        changed = threads != self.threads
        if changed:
            fell = "" if self.drop is None else f"tokens/s fell to {self.drop:.2f}x; "
            log.info("threads: %d -> %d (%sother processes keep %.2f of %d cores busy)", self.threads,
                     threads, fell, busy, self.cpu_load.cores)
            self.set_threads(threads)
            self.threads, self.changes = threads, self.changes + 1
        if changed or self.drop is not None:
            # a new count has a new speed, and a drop the load does not explain (longer sequences, a slower
            # clock) is the new normal: either way, the speed to compare with is measured again
            self.settled = None
            self.per_token.clear()
        self.drop = None
        self._start_window(clock_s)
