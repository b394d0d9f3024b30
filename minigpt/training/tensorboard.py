"""TensorBoard logging: fixed, `/`-namespaced metric names; the x-axis is always the optimizer step.

Scalars: train/loss, val/loss, val/ppl, val/bpb (bits per byte), optim/lr, optim/grad_norm,
throughput/tokens_per_s (all ranks), throughput/mfu (per device), throughput/step_s, mem/peak_gib,
progress/tokens. Text: `config` (the resolved config as YAML) and `sample`
(generated text at each evaluation). The final metrics go into the hparams table *in the run's own folder*
(`run_name="."`), so TensorBoard lists one run per run rather than an extra timestamped sub-run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCALAR_TAGS = (
    "train/loss", "val/loss", "val/ppl", "val/bpb", "optim/lr", "optim/grad_norm", "throughput/tokens_per_s",
    "throughput/mfu", "throughput/step_s", "mem/peak_gib", "progress/tokens",
)
TEXT_TAGS = ("config", "sample")


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

    def final(self, config: dict[str, Any], metrics: dict[str, float]) -> None:
        """The run's hyperparameters (flattened config) beside its final metrics, in the same run folder."""
        if self.writer is None:
            return
        hparams = {k: _hparam_value(v) for k, v in _flatten(config).items()}
        self.writer.add_hparams(hparams, {f"final/{k}": v for k, v in metrics.items()}, run_name=".")

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
