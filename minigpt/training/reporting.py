"""What a run reports while it trains: progress on the console, and TensorBoard.

**The console.** A tqdm bar in a terminal, plain lines elsewhere. tqdm redraws its bar with carriage
returns. In a terminal each frame overwrites the last one; in a file, a pipe or a batch job's log (`make
train > run.txt`, `| tee`, a SLURM output file) every frame stays, thousands of them on one line. So the bar
is drawn only when its stream (stderr) is a terminal; otherwise the same numbers come as one plain log line
every `logging.log_every` steps, which also reaches the run's train.log:

    step 120/400 | loss 4.1234 | lr 2.95e-03 | 6,213 tok/s | 122,880 tokens, 6.53e+11 FLOPs | 0:45 trained,
    ~1:38 left                                                                            (one line)

The step count after the slash is where the budget ends the run (its steps, tokens or FLOPs; none for a
time budget alone); FLOPs are the model's count (`GPT.flops_per_token`) times the tokens trained.

**TensorBoard.** Fixed, `/`-namespaced metric names; the x-axis is always the optimizer step. Scalars:
train/loss, val/loss, val/best_loss, val/ppl, val/bpb (bits per byte), optim/lr, optim/grad_norm,
throughput/tokens_per_s (all ranks), throughput/mfu (per device), throughput/step_s, mem/peak_gib,
progress/tokens, progress/flops (model FLOPs trained so far: the unit of equal-compute comparisons). Text:
`config` (the resolved config as YAML) and `sample` (generated text at each evaluation).

At the end, the HPARAMS tab gets the run's flattened config beside its final metrics. Those metrics are the
run's own series (FINAL_METRICS): the hparams plugin shows the last value of each, which for val/loss is the
final evaluation at the last step. `SummaryWriter.add_hparams` would instead write a copy of every metric as
a new scalar at step 0 (a `final` group of lone points at the wrong step, the first thing TIME SERIES shows)
and, by default, into a new timestamped sub-run; we write only its three hparams summaries, into this run.

The event file is created when the logger is entered (by `fit`, once the run has passed its checks), so a
refused run leaves no `tb/` behind. A write that fails (a full disk, a deleted folder, lost permissions)
surfaces from the next call as an OSError naming the event folder. The writer's background thread, where the
write really failed, would print its own traceback first; while the logger is open that report is dropped
for OSErrors (the main thread reports the same error in one line).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from minigpt.training.budget import Budget, format_count, format_duration

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
    every log interval. The run starts at `initial_step` with `initial_tokens` seen (a resumed run: more
    than 0).
    """

    def __init__(self, enabled: bool, budget: Budget, initial_step: int, initial_tokens: int = 0,
                 stream: TextIO | None = None) -> None:
        stream = sys.stderr if stream is None else stream
        self.budget = budget
        self.last_step = budget.last_step(initial_step, initial_tokens)  # None: a time budget alone
        self.bar_mode = enabled and is_terminal(stream)
        self.line_mode = enabled and not self.bar_mode
        self.bar = tqdm(total=self.last_step, initial=initial_step, unit="step", dynamic_ncols=True,
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
               step_s: float, tokens: int) -> None:
        """The numbers of one log interval; `seconds` is the training time used, `step_s` its recent pace,
        `tokens` the tokens trained so far."""
        left = self.budget.remaining(step, seconds, tokens, step_s)
        flops = format_count(self.budget.flops(tokens))
        if self.bar_mode:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                 flops=flops, left=format_duration(left), refresh=False)
        elif self.line_mode:
            steps = f"{step}" if self.last_step is None else f"{step}/{self.last_step}"
            log.info("step %s | loss %.4f | lr %.2e | %s tok/s | %s tokens, %s FLOPs | %s trained, ~%s left",
                     steps, loss, lr, f"{tokens_per_s:,.0f}", f"{tokens:,}", flops, format_duration(seconds),
                     format_duration(left))


# ---------------------------------------------------------------------------------------------- TensorBoard


SCALAR_TAGS = (
    "train/loss", "val/loss", "val/best_loss", "val/ppl", "val/bpb", "optim/lr", "optim/grad_norm",
    "throughput/tokens_per_s", "throughput/mfu", "throughput/step_s", "mem/peak_gib", "progress/tokens",
    "progress/flops",
)
TEXT_TAGS = ("config", "sample")
# What the HPARAMS table shows for each run: the last point of these series (tokens/s: of the last interval).
FINAL_METRICS = ("val/loss", "val/best_loss", "val/bpb", "throughput/tokens_per_s")


class TensorBoardLogger:
    """A thin `SummaryWriter` wrapper; disabled (other ranks, logging.tensorboard=false) it does nothing.

    `with logger:` opens the event file and closes it even when training fails; outside, calls do nothing.
    """

    def __init__(self, log_dir: Path, enabled: bool = True) -> None:
        self.log_dir, self.enabled = Path(log_dir), enabled
        self.writer = None
        self._excepthook = threading.excepthook

    def __enter__(self) -> TensorBoardLogger:
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: it pulls in tensorboard

            self._excepthook = threading.excepthook
            threading.excepthook = self._quiet_writer_thread
            with self.writing():
                self.writer = SummaryWriter(log_dir=str(self.log_dir))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            self.close()
        except OSError:
            if exc_type is None:  # else an error is already on its way out; it is the one to report
                raise

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Turn a failed write into an OSError naming the event folder (the writer's own has no path)."""
        try:
            yield
        except OSError as e:
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror, str(self.log_dir)) from None

    def _quiet_writer_thread(self, args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread"):
            self._excepthook(args)

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        with self.writing():
            for tag, value in values.items():
                assert tag in SCALAR_TAGS, f"unknown scalar tag {tag}"  # one fixed vocabulary of metric names
                self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Text rendered as a preformatted block (TensorBoard's text plugin speaks markdown)."""
        if self.writer is None:
            return
        assert tag in TEXT_TAGS, f"unknown text tag {tag}"
        block = "\n".join("    " + line for line in text.splitlines())
        with self.writing():
            self.writer.add_text(tag, block, step)

    def final(self, config: dict[str, Any], step: int) -> None:
        """The run's hyperparameters (flattened config) beside FINAL_METRICS, in this run, at `step`."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        values = {k: _hparam_value(v) for k, v in _flatten(config).items()}
        # The metric values given here are not written anywhere: the plugin reads each metric's own series.
        with self.writing():
            for summary in hparams_summaries(values, dict.fromkeys(FINAL_METRICS, 0.0)):
                self.writer.file_writer.add_summary(summary, step)

    def close(self) -> None:
        writer, self.writer = self.writer, None
        try:
            if writer is not None:
                with self.writing():
                    writer.close()
        finally:
            threading.excepthook = self._excepthook


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _hparam_value(v: Any) -> int | float | str | bool:
    """add_hparams accepts only numbers, strings and bools; lists and None become their JSON text."""
    return v if isinstance(v, (int, float, str, bool)) else json.dumps(v)
