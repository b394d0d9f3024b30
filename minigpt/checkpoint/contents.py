"""What a training checkpoint holds: the keys of state.pt and meta.json, and the counters a run resumes.

    state.pt    every stream a step depends on: step, tokens seen, training time, the optimizer, the loss
                scaler, the loader's position, every rank's RNG state (plain tensors and containers)
    meta.json   enough to rebuild the model, decode its tokens and find its data without Hydra: the
                resolved model config and full config, the tokenizer, the data folder, the latest
                validation numbers with what they were measured on, the model FLOPs trained, the
                non-embedding parameter count (the N of 6N FLOPs per token) and the machine that
                trained them (CPU, cores, threads, device, the dtype the matmuls ran in), so runs from
                different machines can be compared at equal FLOPs

`format.py` writes and reads these files; training (`training/trainer.py`) fills them, `training/start.py`
restores from them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from minigpt.checkpoint.format import TOKENIZER
from minigpt.data.encode import cpu_count
from minigpt.device.probe import cpu_model
from minigpt.device.threads import ThreadChoice


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

    `rng_states[r]` is rank r's `training.seeding.rng_state()`: the ranks draw different dropout masks, so
    each one continues its own stream (the loader's stream is replayed per rank from rank 0's position
    instead).
    """
    return {
        "step": progress.step, "tokens_seen": progress.tokens_seen, "train_seconds": progress.train_seconds,
        "first_val_loss": progress.first_val_loss, "best_val_loss": progress.best_val_loss,
        "optimizer": optimizer_state, "scaler": scaler.state_dict(),
        "loader": loader.state_dict(), "rng": rng_states,
    }


def progress_of(state: dict[str, Any]) -> Progress:
    """The counters saved in a state.pt (checkpoints from before time budgets have no training time: they
    spent none of one)."""
    return Progress(step=state["step"], tokens_seen=state["tokens_seen"],
                    train_seconds=state.get("train_seconds", 0.0),
                    first_val_loss=state["first_val_loss"], best_val_loss=state["best_val_loss"])


def machine_record(device: torch.device, dtype: torch.dtype, threads: ThreadChoice) -> dict[str, Any]:
    """What a run's speed and numerics depend on: CPU model and cores, the threads it started with and why
    (`device.threads` unset: the free cores, measured), the device (and GPU name), the dtype the matmuls run
    in (`device.dtype=auto` resolved), torch."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"cpu": cpu_model(), "cores": cpu_count(), "threads": threads.threads,
            "threads_reason": threads.reason, "device": device.type, "gpu": gpu,
            "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__}


def training_meta(progress: Progress, cfg: Any, model, tokenizer, data, world_size: int,
                  evaluation: dict, machine: dict[str, Any]) -> dict:
    """meta.json's content: enough to rebuild the model, decode its tokens and find its data (no Hydra),
    the latest validation numbers with what they were measured on (`evaluation`: windows, targets), and the
    compute spent, with the `machine` (`machine_record`) it was spent on."""
    p = progress
    return {
        "step": p.step, "tokens_seen": p.tokens_seen, "train_seconds": p.train_seconds,
        "flops": p.tokens_seen * model.flops_per_token(), "params": model.num_params(), "machine": machine,
        "val_loss": finite_or_none(p.val_loss), "best_val_loss": finite_or_none(p.best_val_loss),
        "val_ppl": finite_or_none(math.exp(min(p.val_loss, 700.0))), "val_bpb": finite_or_none(p.val_bpb),
        "eval": {**evaluation, "eval_tokens": cfg.trainer.eval_tokens},
        "model_config": dataclasses.asdict(model.config), "config": dataclasses.asdict(cfg),
        "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size, "folder": TOKENIZER},
        "data": {"dir": str(data.dir), "fingerprint": data.meta.get("fingerprint"),
                 "tokens": data.meta.get("tokens")},
        "world_size": world_size, "strategy": cfg.trainer.strategy,
        "versions": {"torch": torch.__version__},
    }
