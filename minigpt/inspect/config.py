"""Configuration of the look-inside tools (no torch here: Hydra's schemas import this module).

    EvaluateConfig       scripts/evaluate.py        configs/evaluate.yaml        inspect/perplexity.py
                                                                                 interop/harness.py
    AttentionMapsConfig  scripts/attention_maps.py  configs/attention_maps.yaml  inspect/attention_maps.py
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minigpt.data.config import DataConfig
from minigpt.device.config import InferenceDeviceConfig, check_weights_dtype
from minigpt.errors import UserError

SPLITS = ("train", "val")


@dataclass
class EvaluateConfig:
    """Root of `configs/evaluate.yaml` (`scripts/evaluate.py`)."""

    checkpoint: str | None = None  # a checkpoint or run folder; None: the newest run under outputs/train
    data: DataConfig | None = None  # a corpus (data=<option>); None: the checkpoint's own training corpus
    split: str = "val"  # train | val: which split of the corpus
    text_file: str | None = None  # score this file instead of a corpus split
    stride: int | None = None  # targets scored per window after the first; None: block_size // 2
    batch_size: int = 8  # windows per forward pass
    max_tokens: int | None = None  # score only the first max_tokens tokens (a quick estimate); None: all
    device: InferenceDeviceConfig = field(default_factory=InferenceDeviceConfig)  # `device=cpu|cuda|mps`
    # float32 by default: an exact number should not carry 16-bit rounding (bfloat16 is an explicit choice)
    weights_dtype: str = "float32"
    # lm-evaluation-harness tasks to score instead of the loss, e.g. [stdlib_next_line] (shipped, offline)
    harness_tasks: list[str] | None = None

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise UserError(f"split={self.split!r} is not one of: {', '.join(SPLITS)}")
        if self.stride is not None and self.stride < 1:
            raise UserError(f"stride={self.stride} must be at least 1 (or null: half the model's context)")
        if self.batch_size < 1:
            raise UserError(f"batch_size={self.batch_size} must be at least 1")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise UserError(f"max_tokens={self.max_tokens} must be at least 2 (or null: the whole text)")
        check_weights_dtype(self.weights_dtype)
        if self.harness_tasks is not None:
            self._check_harness()

    def _check_harness(self) -> None:
        """The harness scores its own task data: the keys that choose the text to score do not apply."""
        if not self.harness_tasks:
            raise UserError("harness_tasks=[] names no task; e.g. harness_tasks=[stdlib_next_line], or null")
        chosen = {"data": self.data is not None, "text_file": self.text_file is not None,
                  "stride": self.stride is not None, "max_tokens": self.max_tokens is not None,
                  "split": self.split != "val"}
        for key, given in chosen.items():
            if given:
                raise UserError(f"{key}= does not apply with harness_tasks= (the tasks bring their own "
                                "text); drop one of them")


@dataclass
class AttentionMapsConfig:
    """Root of `configs/attention_maps.yaml` (`scripts/attention_maps.py`)."""

    checkpoint: str | None = None  # a checkpoint or run folder; None: the newest run under outputs/train
    prompt: str = "def add(a, b):\n    return a + b\n"  # <|endoftext|> is put in front, as in training
    max_tokens: int = 24  # keep the prompt's last max_tokens tokens: more makes unreadable labels
    layers: list[int] | None = None  # which layers to draw; None: all
    heads: list[int] | None = None  # which heads to draw; None: all
    out: str | None = None  # the PNG to write; None: attention.png in the run folder
    device: InferenceDeviceConfig = field(default_factory=InferenceDeviceConfig)  # `device=cpu|cuda|mps`
    weights_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.max_tokens < 2:
            raise UserError(f"max_tokens={self.max_tokens} must be at least 2")
        if not self.prompt:
            raise UserError("prompt is empty; give the text whose attention to draw, e.g. prompt='x = 1'")
        check_weights_dtype(self.weights_dtype)
