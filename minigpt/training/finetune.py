"""Fine-tuning: `trainer.init_from=<checkpoint | run folder | Hugging Face GPT-2 folder>`.

The run starts from the source's weights, with the source's model config and tokenizer (the data is
tokenised with that tokenizer), at step 0, with a fresh optimizer and schedule, in its own run folder. A
checkpoint the run writes is an ordinary one: `trainer.resume=auto` continues it.

Model keys of the run:
    dropout, attn_dropout       this run's values (model.dropout=..., default 0): how to train, not weights
    attention, online_block_size  this run's values: the backend computes the same numbers
    block_size                  the source's, or a smaller one you set (learned positions: the first
                                block_size rows of wpe are kept; rope and sinusoidal tables are rebuilt)
    anything else               the source's; setting one to another value is refused, naming the key

"Set" means a value other than the default run's model (`TrainConfig().model`, the `demo` preset: what
the composed `model` group holds when you give no model override): the config cannot tell a default from a
value typed equal to it, so `model.block_size=128` (the default) reads as not set.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.format import META, TOKENIZER, read_meta
from minigpt.checkpoint.load import model_config_of, resolve_checkpoint
from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from minigpt.errors import UserError
from minigpt.interop.hf_gpt2 import config_from_hf, load_hf_gpt2
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.training.config import TrainConfig

log = logging.getLogger(__name__)

RUN_KEYS = ("dropout", "attn_dropout", "attention", "online_block_size")  # always this run's values
SHRINKABLE = ("block_size",)


@dataclasses.dataclass
class InitFrom:
    """A fine-tuning source: a minigpt checkpoint folder, or a Hugging Face GPT-2 folder."""

    path: Path
    is_hf: bool
    config: ModelConfig  # the source's own model config

    @classmethod
    def open(cls, init_from: str) -> InitFrom:
        """Find the source and read its model config (not its weights yet); a bad path fails here."""
        path = Path(init_from).expanduser()
        if (path / "config.json").is_file() and not (path / META).is_file():
            try:
                hf = json.loads((path / "config.json").read_text())
            except json.JSONDecodeError as e:
                raise UserError(f"{path / 'config.json'} is not valid JSON ({e})") from None
            return cls(path, True, config_from_hf(hf))
        try:
            ckpt = resolve_checkpoint(path)
        except UserError:
            raise UserError(f"trainer.init_from={init_from} is neither a minigpt checkpoint or run folder "
                            "nor a Hugging Face GPT-2 folder (config.json + weights)") from None
        return cls(ckpt, False, model_config_of(read_meta(ckpt), ckpt))

    def model_config(self, run: ModelConfig) -> ModelConfig:
        """The run's model config: the source's, with the keys a fine-tuning run may change (module doc)."""
        default, changes = TrainConfig().model, {name: getattr(run, name) for name in RUN_KEYS}
        for field in dataclasses.fields(ModelConfig):
            name, mine, theirs = field.name, getattr(run, field.name), getattr(self.config, field.name)
            if name in RUN_KEYS or mine == getattr(default, name) or mine == theirs:
                continue
            if name not in SHRINKABLE:
                raise UserError(
                    f"model.{name}={mine} cannot change when fine-tuning from {self.path} (its {name} is "
                    f"{theirs}); drop the override: the model comes from trainer.init_from, and only "
                    f"{', '.join(RUN_KEYS + SHRINKABLE)} may be set")
            if mine > theirs:
                raise UserError(f"model.{name}={mine} is longer than the context {self.path} was trained "
                                f"with ({theirs}); fine-tuning can keep or shorten it")
            changes[name] = mine
        return dataclasses.replace(self.config, **changes)

    def tokenizer(self, run: TokenizerConfig) -> Tokenizer:
        """The source's tokenizer. A tokenizer=... choice that is not the source's is refused: the weights
        know only the ids of the tokenizer they were trained with."""
        tok = self._load_tokenizer()
        if run != TokenizerConfig() and not (run.kind == tok.kind and (
                run.kind != "bpe" or run.bpe_vocab_size == tok.vocab_size)):
            raise UserError(f"tokenizer={run.kind} cannot be used when fine-tuning from {self.path}, whose "
                            f"tokenizer is {tok.name}: the data is tokenised with it; drop the tokenizer "
                            "override")
        return tok

    def _load_tokenizer(self) -> Tokenizer:
        if not self.is_hf:
            return load_tokenizer(self.path / TOKENIZER)
        try:
            return build_tokenizer(TokenizerConfig(kind="gpt2"))
        except UserError as e:  # offline without tiktoken's cached gpt2 file
            raise UserError(f"{e}; or import the folder with a tokenizer you have first (scripts/"
                            f"import_gpt2.py {self.path} CHECKPOINT --tokenizer DIR) and set "
                            "trainer.init_from=CHECKPOINT") from None

    def load_weights(self, model: GPT) -> None:
        """Copy the source's weights into `model` (built from `model_config`); wpe cut to its block_size."""
        if self.is_hf:
            source = load_hf_gpt2(self.path)
        else:
            source = build_model(self.config)
            ckpt.load_weights(source, self.path)  # checks names and shapes; ties wte and lm_head again
        weights = source.state_dict()  # tied weights appear under both names, as model.load_state_dict wants
        if "transformer.wpe.weight" in weights:  # learned positions: keep the first block_size rows
            weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][: model.config.block_size]
        with torch.no_grad():
            model.load_state_dict(weights, strict=True)
        log.info("fine-tuning from %s: step 0, fresh optimizer and schedule (block_size %d of %d)", self.path,
                 model.config.block_size, self.config.block_size)


def fine_tuning(cfg: TrainConfig, resume_from: Path | None) -> tuple[TrainConfig, InitFrom | None]:
    """The run's config with the source's model config, and the source; (cfg, None) without init_from.

    A fine-tuning run that is resumed (trainer.resume=auto) reads the config and tokenizer from its own
    checkpoint, so it continues even when the source has moved; its weights come from the checkpoint too.
    """
    if cfg.trainer.init_from is None:
        return cfg, None
    init = InitFrom.open(str(resume_from or cfg.trainer.init_from))
    return dataclasses.replace(cfg, model=init.model_config(cfg.model)), init
