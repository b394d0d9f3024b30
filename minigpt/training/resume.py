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
from pathlib import Path
from typing import Any

import torch

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.contents import Progress, progress_of
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.training import distributed
from minigpt.training.budget import format_duration
from minigpt.training.config import TrainConfig
from minigpt.training.dist_env import DistEnv
from minigpt.training.seeding import set_rng_state


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


def restore(state: dict[str, Any], model, optimizer, scaler, loader, env: DistEnv) -> Progress:
    """Continue exactly where the checkpoint stopped: optimizer, this rank's RNG, data order, the schedule's
    inputs."""
    distributed.load_optimizer_state_dict(model, optimizer, state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    loader.load_state_dict(state["loader"])  # ranks > 0 replay their own stream to the same point
    rng = state["rng"]  # a list by rank; older checkpoints hold one state, rank 0's
    set_rng_state(rng[env.rank] if isinstance(rng, list) else rng)
    return progress_of(state)
