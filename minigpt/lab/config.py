"""Configuration of the lab's tools (no torch here: Hydra's schemas import this module).

    ShapeWalkConfig      scripts/shape_walk.py      configs/shape_walk.yaml      lab/shape_walk.py
    TemperatureConfig    scripts/temperature.py     configs/temperature.yaml     lab/temperature.py
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minigpt.device.config import InferenceDeviceConfig, check_weights_dtype
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig


@dataclass
class ShapeWalkConfig:
    """Root of `configs/shape_walk.yaml` (`scripts/shape_walk.py`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    vocab_size: int = 4096  # used when model.vocab_size is null (the default bpe tokenizer's size)
    batch_size: int = 2
    seq_len: int | None = None  # tokens per sequence; None: model.block_size
    checkpoint: str | None = None  # walk this trained model instead of model=...

    def __post_init__(self) -> None:
        for name in ("vocab_size", "batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)} must be at least 1")
        if self.seq_len is not None and self.seq_len < 1:
            raise UserError(f"seq_len={self.seq_len} must be at least 1 (or null: model.block_size)")


@dataclass
class TemperatureConfig:
    """Root of `configs/temperature.yaml` (`scripts/temperature.py`)."""

    checkpoint: str | None = None  # a checkpoint or run folder; None: the latest run under outputs/
    prompt: str = ""  # empty: the distribution of a document's first token (after end-of-text)
    temperatures: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0])
    top: int = 20  # tokens shown per temperature
    out: str | None = None  # the PNG; None: temperature.png in the run folder
    # one forward pass: the CPU is plenty
    device: InferenceDeviceConfig = field(default_factory=lambda: InferenceDeviceConfig("cpu"))
    weights_dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise UserError(f"temperatures={self.temperatures} must be a non-empty list of values > 0")
        if self.top < 1:
            raise UserError(f"top={self.top} must be at least 1")
        check_weights_dtype(self.weights_dtype)
