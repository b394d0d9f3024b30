"""TensorBoard logging: fixed, `/`-namespaced metric names; the x-axis is always the optimizer step.

Scalars: train/loss, val/loss, val/best_loss, val/ppl, optim/lr, optim/grad_norm, throughput/tokens_per_s,
throughput/mfu, throughput/step_s, mem/peak_gib, progress/tokens. Text: `config` (the resolved config as YAML)
and `sample` (generated text at each evaluation).

At the end, the HPARAMS tab gets the run's flattened config beside its final metrics. Those metrics are the
run's own series (FINAL_METRICS): the hparams plugin shows the last value of each, which for val/loss is the
final evaluation at the last step. `SummaryWriter.add_hparams` would instead write a copy of every metric as
a new scalar at step 0 (a `final` group of lone points at the wrong step, the first thing TIME SERIES shows)
and, by default, into a new timestamped sub-run; we write only its three hparams summaries, into this run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCALAR_TAGS = (
    "train/loss", "val/loss", "val/best_loss", "val/ppl", "optim/lr", "optim/grad_norm",
    "throughput/tokens_per_s", "throughput/mfu", "throughput/step_s", "mem/peak_gib", "progress/tokens",
)
TEXT_TAGS = ("config", "sample")
# What the HPARAMS table shows for each run: the last point of these series (tokens/s: of the last interval).
FINAL_METRICS = ("val/loss", "val/best_loss", "throughput/tokens_per_s")


class TensorBoardLogger:
    """A thin `SummaryWriter` wrapper; disabled (other ranks, logging.tensorboard=false) it does nothing.

    Use it as a context manager so the event file is flushed and closed even when training fails.
    """

    def __init__(self, log_dir: Path, enabled: bool = True) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: it pulls in tensorboard

            self.writer = SummaryWriter(log_dir=str(log_dir))

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            assert tag in SCALAR_TAGS, f"unknown scalar tag {tag}"  # one fixed vocabulary of metric names
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Text rendered as a preformatted block (TensorBoard's text plugin speaks markdown)."""
        if self.writer is None:
            return
        assert tag in TEXT_TAGS, f"unknown text tag {tag}"
        block = "\n".join("    " + line for line in text.splitlines())
        self.writer.add_text(tag, block, step)

    def final(self, config: dict[str, Any], step: int) -> None:
        """The run's hyperparameters (flattened config) beside FINAL_METRICS, in this run, at `step`."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        values = {k: _hparam_value(v) for k, v in _flatten(config).items()}
        # The metric values given here are not written anywhere: the plugin reads each metric's own series.
        for summary in hparams_summaries(values, dict.fromkeys(FINAL_METRICS, 0.0)):
            self.writer.file_writer.add_summary(summary, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


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
