"""A run's checkpoints: which one a run continues from, what it saves, and how it picks up exactly.

`trainer.resume`:
    null          start from scratch; refused if the run folder already holds a checkpoint (never overwrite)
    auto          this run folder's latest checkpoint, if any (`last`, or `.last.old` after a crash mid-swap)
    <path>        a checkpoint folder or run folder, continued in this (new) run folder
                  (a checkpoint without optimizer state, like an imported one, is for trainer.init_from)

Resuming restores everything a step depends on (weights, optimizer, loss scaler, every rank's own RNG state,
the data stream's position, and the step and training time the lr schedule is a function of), so 10 steps +
resume + 10 steps equals 20 straight steps, with dropout and on any number of ranks. A time-budgeted run
(`trainer.max_time`) continues with the budget it has left.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.training import distributed
from minigpt.training.budget import format_duration
from minigpt.training.config import TrainConfig
from minigpt.training.dist_env import DistEnv


def resume_source(cfg: TrainConfig, out_dir: Path) -> Path | None:
    """The checkpoint to resume from, or None; refuses to overwrite an existing run's checkpoint.

    Called before any work, so a bad path fails at once.
    """
    resume = cfg.trainer.resume
    folder = out_dir / "checkpoints"
    if resume == "auto":
        if any((folder / name / ckpt.META).is_file() for name in ("last", ".last.old")):
            return resolve_checkpoint(out_dir)
        return None
    if resume is not None:
        path = resolve_checkpoint(resume)
        # memory-mapped: only the keys are read here, the tensors when the run loads them
        if "optimizer" not in ckpt.load_state(path, mmap=True):  # e.g. scripts/import_gpt2.py's checkpoints
            raise UserError(f"checkpoint {path} holds no optimizer state, so there is no run to resume; "
                            f"fine-tune from it instead: trainer.init_from={path} (and no trainer.resume)")
        return path
    if (folder / "last").exists() or (folder / ".last.old").exists():
        raise UserError(
            f"{out_dir} already holds a checkpoint; continue it with trainer.resume=auto, "
            "or choose another hydra.run.dir"
        )
    return None


def load_for_resume(path: Path, model: torch.nn.Module, cfg: TrainConfig, env: DistEnv) -> dict[str, Any]:
    """Check that checkpoint `path` fits this run, load its weights into the (not yet wrapped) model, and
    return the rest of its state for `restore`."""
    meta = ckpt.read_meta(path)
    # keys the checkpoint predates (e.g. the ablation switches) mean their defaults, as they did then
    saved = {**dataclasses.asdict(ModelConfig()), **(meta.get("model_config") or {})}
    if saved != dataclasses.asdict(model.config):
        raise UserError(f"checkpoint {path} was trained with a different model config; resume with the "
                        "same model=... overrides (see its meta.json)")
    distributed.check_resume_world_size(meta.get("world_size", 1), env, path)
    tc = cfg.trainer
    if tc.max_steps is not None and meta.get("step", 0) > tc.max_steps:
        raise UserError(f"trainer.max_steps={tc.max_steps} is below the step of checkpoint "
                        f"{path} ({meta['step']}); raise trainer.max_steps to continue training")
    used = meta.get("train_seconds") or 0.0
    if tc.max_seconds is not None and used >= tc.max_seconds:
        raise UserError(f"checkpoint {path} has already trained for {format_duration(used)}, the whole "
                        f"trainer.max_time={tc.max_time}; raise trainer.max_time to continue training")
    ckpt.load_weights(model, path)
    return ckpt.load_state(path)


def finite_or_none(x: float) -> float | None:
    """JSON has no infinity: a loss not measured yet is null."""
    return x if math.isfinite(x) else None


@dataclasses.dataclass
class Progress:
    """The run's counters: saved in every checkpoint and restored on resume."""

    step: int = 0  # optimizer steps taken
    tokens_seen: int = 0  # training tokens over all ranks
    train_seconds: float = 0.0  # training time used (rank 0's clock; evaluation and checkpoints not counted)
    first_val_loss: float = math.inf
    val_loss: float = math.inf  # of the latest evaluation
    best_val_loss: float = math.inf
    val_bpb: float = math.nan  # bits per byte, of the latest evaluation


def training_state(progress: Progress, optimizer_state: dict, scaler, loader,
                   rng_states: list[dict[str, Any]]) -> dict[str, Any]:
    """state.pt's content: every stream a step depends on (plain tensors and containers only). The lr schedule
    has no state of its own: it is a function of `step` and `train_seconds` (`optim.LRSchedule`).

    `rng_states[r]` is rank r's `ckpt.rng_state()`: the ranks draw different dropout masks, so each one
    continues its own stream (the loader's stream is replayed per rank from rank 0's position instead).
    """
    return {
        "step": progress.step, "tokens_seen": progress.tokens_seen, "train_seconds": progress.train_seconds,
        "first_val_loss": progress.first_val_loss, "best_val_loss": progress.best_val_loss,
        "optimizer": optimizer_state, "scaler": scaler.state_dict(),
        "loader": loader.state_dict(), "rng": rng_states,
    }


def restore(state: dict[str, Any], model, optimizer, scaler, loader, env: DistEnv) -> Progress:
    """Continue exactly where the checkpoint stopped: optimizer, this rank's RNG, data order, the schedule's
    inputs."""
    distributed.load_optimizer_state_dict(model, optimizer, state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    loader.load_state_dict(state["loader"])  # ranks > 0 replay their own stream to the same point
    rng = state["rng"]  # a list by rank; older checkpoints hold one state, rank 0's
    ckpt.set_rng_state(rng[env.rank] if isinstance(rng, list) else rng)
    # train_seconds: checkpoints written before time budgets existed have none, and spent nothing of one
    return Progress(step=state["step"], tokens_seen=state["tokens_seen"],
                    train_seconds=state.get("train_seconds", 0.0),
                    first_val_loss=state["first_val_loss"], best_val_loss=state["best_val_loss"])


def checkpoint_meta(progress: Progress, cfg: TrainConfig, model, tokenizer, data, env: DistEnv,
                    evaluation: dict) -> dict:
    """meta.json's content: enough to rebuild the model, decode its tokens and find its data (no Hydra),
    and the latest validation numbers with what they were measured on (`evaluation`: windows, targets)."""
    p = progress
    return {
        "step": p.step, "tokens_seen": p.tokens_seen, "train_seconds": p.train_seconds,
        "val_loss": finite_or_none(p.val_loss), "best_val_loss": finite_or_none(p.best_val_loss),
        "val_ppl": finite_or_none(math.exp(min(p.val_loss, 700.0))), "val_bpb": finite_or_none(p.val_bpb),
        "eval": {**evaluation, "eval_tokens": cfg.trainer.eval_tokens},
        "model_config": dataclasses.asdict(model.config), "config": dataclasses.asdict(cfg),
        "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size, "folder": ckpt.TOKENIZER},
        "data": {"dir": str(data.dir), "fingerprint": data.meta.get("fingerprint"),
                 "tokens": data.meta.get("tokens")},
        "world_size": env.world_size, "strategy": cfg.trainer.strategy,
        "versions": {"torch": torch.__version__},
    }
