"""The typed configuration tree, and the one bridge between Hydra and the library.

Each section's dataclass lives beside the code that consumes it; this module assembles them
into the root configs of the scripts and registers those with Hydra's ConfigStore, so Hydra
type-checks every YAML value and override when it composes. The primary YAMLs name the
schema first in their defaults lists (`- train_schema`, `- generate_schema`, `- prepare_schema`).

Scripts call `to_object(cfg, Schema)` once at start-up; library code only ever sees dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.errors import UserError
from minigpt.generation.config import GenerateConfig
from minigpt.model.config import ModelConfig
from minigpt.training.config import DeviceConfig, LoggingConfig, OptimConfig, TrainerConfig


@dataclass
class PrepareConfig:
    """Root of `configs/prepare.yaml`: text -> tokenizer -> token bins."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)


@dataclass
class TrainConfig:
    """Root of `configs/train.yaml`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run_name: str | None = None  # appended to the run folder's name


def register_configs() -> None:
    """Register the root schemas; idempotent, call before `@hydra.main` or `initialize_config_dir`."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="prepare_schema", node=PrepareConfig)
    cs.store(name="generate_schema", node=GenerateConfig)


T = TypeVar("T")


def to_object(cfg: DictConfig, schema: type[T]) -> T:
    """Resolve a composed config into its dataclass tree; bad values become a `UserError`.

    The dataclasses' `__post_init__` validation runs here, before anything is allocated.
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise UserError(str(e).splitlines()[0]) from None
    assert isinstance(obj, schema)
    return obj


def to_plain_dict(obj: object) -> dict:
    """A dataclass tree as plain, resolved Python data (for JSON metadata and TensorBoard text)."""
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)  # type: ignore[return-value]
