"""What a person watching a run sees between evaluations: a tqdm bar in a terminal, plain lines elsewhere.

tqdm redraws its bar with carriage returns. In a terminal each frame overwrites the last one; in a file, a
pipe or a batch job's log (`make train > run.txt`, `| tee`, a SLURM output file) every frame stays, thousands
of them on one line. So the bar is drawn only when its stream (stderr) is a terminal; otherwise the same
numbers come as one plain log line every `logging.log_every` steps, which also reaches the run's train.log:

    step 120/400 | loss 4.1234 | lr 2.95e-03 | 6,213 tok/s | 0:45 trained, ~1:38 left
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TextIO

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from minigpt.training.budget import Budget, format_duration

log = logging.getLogger(__name__)


def is_terminal(stream: TextIO) -> bool:
    """True if `stream` is an interactive terminal (a closed or detached stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class ProgressDisplay:
    """The bar or the lines, per `enabled` (logging.progress_bar, rank 0 only) and whether `stream` is a tty.

    Use it as a context manager around the loop: call `step_done()` after every step and `report(...)` at
    every log interval.
    """

    def __init__(self, enabled: bool, budget: Budget, initial_step: int,
                 stream: TextIO | None = None) -> None:
        stream = sys.stderr if stream is None else stream
        self.budget = budget
        self.bar_mode = enabled and is_terminal(stream)
        self.line_mode = enabled and not self.bar_mode
        self.bar = tqdm(total=budget.max_steps, initial=initial_step, unit="step", dynamic_ncols=True,
                        file=stream, disable=not self.bar_mode)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ProgressDisplay:
        if self.bar_mode:  # log lines are printed above the bar instead of through it
            self._stack.enter_context(logging_redirect_tqdm())
        self._stack.enter_context(self.bar)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def step_done(self) -> None:
        self.bar.update(1)

    def report(self, step: int, loss: float, lr: float, tokens_per_s: float, seconds: float,
               step_s: float) -> None:
        """The numbers of one log interval; `seconds` is the training time used, `step_s` its recent pace."""
        left = self.budget.remaining(step, seconds, step_s)
        if self.bar_mode:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                 left=format_duration(left), refresh=False)
        elif self.line_mode:
            steps = f"{step}" if self.budget.max_steps is None else f"{step}/{self.budget.max_steps}"
            log.info("step %s | loss %.4f | lr %.2e | %s tok/s | %s trained, ~%s left", steps, loss, lr,
                     f"{tokens_per_s:,.0f}", format_duration(seconds), format_duration(left))
