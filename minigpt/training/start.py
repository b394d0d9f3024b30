"""Where a run starts: from scratch, from a checkpoint it continues, or from a model it fine-tunes.

Which of them is for the run's safety to decide, before any work (minigpt/runs/resume.py: the checkpoint that
`trainer.resume` names, never one the run would overwrite, and only if it is the same run); the Trainer is
handed its answer, a `Start`, and starts from it:

    scratch     `Start()`: fresh weights from the run's seed (seeding.py)
    continue    `Start(checkpoint=...)`: the checkpoint's weights (`load_for_resume`), then everything else a
                step depends on (`restore`)
    fine-tune   `Start(init=...)`: the weights of another model (`InitFrom`, `trainer.init_from`)

**Continuing** restores everything a step depends on (weights, optimizer, loss scaler, every rank's own RNG
state, the data stream's position, and the step, training time and tokens the lr schedule is a function of),
so 10 steps + resume + 10 steps equals 20 straight steps, with dropout and on any number of ranks. A run with
a budget of time, tokens, FLOPs or tokens per parameter (`trainer.max_time`, `max_tokens`, `max_flops`,
`max_tokens_per_param`) continues with the budget it has left; FLOPs and the ratio follow from the tokens
seen and the model, which resuming cannot change (the model config must match). A checkpoint whose weights
are not finite (written by a run that diverged) is refused.

**Fine-tuning** (`trainer.init_from=<checkpoint | run folder | Hugging Face GPT-2 folder>`). The run starts
from the source's weights, with the source's model config and tokenizer (the data is tokenised with that
tokenizer), at step 0, with a fresh optimizer and schedule, in its own run folder. A checkpoint the run
writes is an ordinary one: `trainer.resume=auto` continues it. Model keys of the run:

    dropout, attn_dropout       this run's values (model.dropout=..., default 0): how to train, not weights
    attention, online_block_size  this run's values: the backend computes the same numbers
    block_size                  the source's, or a smaller one you set (learned positions: the first
                                block_size rows of wpe are kept; rope and sinusoidal tables are rebuilt)
    anything else               the source's; setting one to another value is refused, naming the key

"Set" means a value other than both presets a command starts from: the default run's model (`model=recipe`,
`default_run_model()`) and the plain block (`model=demo`, `TrainConfig().model`). The config cannot tell a
default from a value typed equal to it, so `model.block_size=128` (both presets') reads as not set.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.contents import Progress, progress_of
from minigpt.checkpoint.format import META, TOKENIZER, read_meta
from minigpt.checkpoint.load import model_config_of, resolve_checkpoint
from minigpt.cluster import distributed
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from minigpt.errors import UserError
from minigpt.interop.hf_gpt2 import config_from_hf, load_hf_gpt2
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.training.budget import format_duration
from minigpt.training.config import TrainConfig, default_run_model
from minigpt.training.seeding import set_rng_state

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Start:
    """Where the run starts (the module docstring): from scratch unless it continues `checkpoint` or
    fine-tunes `init` (both when it continues a fine-tuning run: the tokenizer is the source's)."""

    checkpoint: Path | None = None  # the checkpoint this run continues
    init: InitFrom | None = None  # the model this run fine-tunes (trainer.init_from)
    corpus: str | None = None  # the fingerprint of the corpus `checkpoint` was trained on (None: any corpus)


SCRATCH = Start()  # fresh weights from the run's seed, at step 0


# ------------------------------------------------------------------------------------------------- continuing


def load_for_resume(path: Path, model: torch.nn.Module, cfg: TrainConfig) -> dict[str, Any]:
    """Check that checkpoint `path` fits this run, load its weights into the (not yet wrapped) model, and
    return the rest of its state for `restore`."""
    meta = ckpt.read_meta(path)
    # keys the checkpoint predates (e.g. the ablation switches) mean their defaults, as they did then; the
    # run's own keys (RUN_KEYS: dropout, the attention backend) are how it trains, not what the weights are
    saved = {**dataclasses.asdict(ModelConfig()), **(meta.get("model_config") or {})}
    mine = dataclasses.asdict(model.config)
    if any(saved[key] != mine[key] for key in mine if key not in RUN_KEYS):
        raise UserError(f"checkpoint {path} was trained with a different model config; resume with the "
                        "same model=... overrides (see its meta.json)")
    tc = cfg.trainer
    if tc.max_steps is not None and meta.get("step", 0) > tc.max_steps:
        raise UserError(f"trainer.max_steps={tc.max_steps} is below the step of checkpoint "
                        f"{path} ({meta['step']}); raise trainer.max_steps to continue training")
    used = meta.get("train_seconds") or 0.0
    if tc.max_seconds is not None and used >= tc.max_seconds:
        raise UserError(f"checkpoint {path} has already trained for {format_duration(used)}, the whole "
                        f"trainer.max_time={tc.max_time}; raise trainer.max_time to continue training")
    tokens = meta.get("tokens_seen", 0)
    if tc.max_tokens is not None and tokens >= tc.max_tokens:
        raise UserError(f"checkpoint {path} has already trained on {tokens:,} tokens, the whole "
                        f"trainer.max_tokens={tc.max_tokens}; raise trainer.max_tokens to continue training")
    flops = tokens * model.flops_per_token()
    if tc.max_flops is not None and flops >= tc.max_flops:
        raise UserError(f"checkpoint {path} has already trained for {flops:.3g} FLOPs, the whole "
                        f"trainer.max_flops={tc.max_flops:g}; raise trainer.max_flops to continue training")
    ratio = tokens / model.num_params()
    if tc.max_tokens_per_param is not None and ratio >= tc.max_tokens_per_param:
        raise UserError(f"checkpoint {path} has already trained on {ratio:.3g} tokens per parameter, the "
                        f"whole trainer.max_tokens_per_param={tc.max_tokens_per_param:g}; raise it to "
                        "continue training")
    ckpt.load_weights(model, path)
    if not all(bool(torch.isfinite(p).all()) for p in model.state_dict().values()):
        best = path.parent / "best"
        other = f"resume from {best} instead" if (best / META).is_file() and best != path else "start again"
        raise UserError(f"checkpoint {path} holds non-finite weights (NaN or inf): it was written after its "
                        f"run diverged, and every step from it would be NaN; {other}, with a lower optim.lr")
    return ckpt.load_state(path)


def restore(state: dict[str, Any], model, optimizer, scaler, loader, env: DistEnv) -> Progress:
    """Continue exactly where the checkpoint stopped: optimizer, this rank's RNG, data order, the schedule's
    inputs."""
    distributed.load_optimizer_state_dict(model, optimizer, state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    loader.load_state_dict(state["loader"])  # ranks > 0 replay their own stream to the same point
    rng = state["rng"]  # a list by rank; older checkpoints hold one state, rank 0's
    set_rng_state(rng[env.rank] if isinstance(rng, list) else rng)
    return progress_of(state)


# ------------------------------------------------------------------------------------------------ fine-tuning


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
        presets = (default_run_model(), TrainConfig().model)
        changes = {name: getattr(run, name) for name in RUN_KEYS}
        for field in dataclasses.fields(ModelConfig):
            name, mine, theirs = field.name, getattr(run, field.name), getattr(self.config, field.name)
            if name in RUN_KEYS or mine == theirs or any(mine == getattr(p, name) for p in presets):
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
                            f"import_hf.py source={self.path} out=CHECKPOINT tokenizer_dir=DIR) and set "
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
