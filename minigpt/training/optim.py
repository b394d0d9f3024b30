"""AdamW with two parameter groups (or Muon for the blocks' matrices beside it, muon.py), and the
learning-rate schedule: linear warmup, then a decay (cosine, or warmup-stable-decay) to a floor at the end of
the run's budget (steps, training time, tokens or FLOPs).

This is the only place the schedule is defined: `lr_multiplier` is the formula, `LRSchedule` feeds it a run's
progress through its budget and sets the result on the optimizer.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from minigpt.cluster.whole_matrices import communication_bytes
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig
from minigpt.training.muon import MuonAdamW

log = logging.getLogger(__name__)


def param_groups(model: nn.Module, weight_decay: float, embed_lr_scale: float | None = None) -> list[dict]:
    """Split parameters into a decayed group (matrices) and an undecayed one (everything else), and with
    `embed_lr_scale` the embedding tables into a third, undecayed group of their own at that multiple of
    optim.lr (optim.embed_lr). Each group's `lr_scale` is its lr over optim.lr (`LRSchedule.apply`).

    Weight decay pulls weights towards zero, which regularises the linear maps. It is wrong for norm gains
    (pulling them to zero shrinks the signal, not the model's capacity) and pointless for biases. Embeddings
    are not decayed either, by choice: a token's row only receives gradient when the token occurs, so decay
    would steadily erase rare tokens between their appearances. With tied weights the output head shares the
    embedding's tensor, so it follows the embedding's rule. The split is by name and rank: every 2-D weight
    except the embedding tables is decayed.

    A table's row moves only when its token occurs, a few times in a short run for most tokens, and Adam's
    step is about lr whatever the gradient's size; so the tables may want a far higher lr than the matrices
    that every token trains (record-setting small-GPT runs give them tens of times the head's).
    """
    decay, no_decay, tables = [], [], []
    seen: set[int] = set()
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() >= 2 and id(p) not in embeddings:
            decay.append(p)
        elif id(p) in embeddings and embed_lr_scale is not None:
            tables.append(p)
        else:
            no_decay.append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    if embed_lr_scale is not None:
        groups.append({"params": tables, "weight_decay": 0.0, "lr_scale": embed_lr_scale})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str = "cpu", world_size: int = 1
                    ) -> torch.optim.Optimizer:
    """AdamW over `param_groups`, fused on CUDA and CPU: one kernel updates all parameters in one pass
    over their memory, where the default implementation loops over them in Python (docs/performance.md).
    optim.name=muon: `build_muon`. AdamW's update is elementwise, so under DDP or FSDP2 (`world_size` > 1)
    each rank updates what it holds; Muon's is not, and shares its work out over the ranks."""
    if cfg.name == "muon":
        return build_muon(model, cfg, world_size)
    groups = [{**g, "lr": cfg.lr * g["lr_scale"]}
              for g in param_groups(model, cfg.weight_decay, cfg.embed_lr_scale)]
    n_decay = sum(p.numel() for p in groups[0]["params"])
    n_other = sum(p.numel() for g in groups[1:] for p in g["params"])
    log.info("AdamW: %d decayed parameters, %d not decayed (norms, biases, embeddings)", n_decay, n_other)
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=device_type in ("cuda", "cpu"),
    )


def muon_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The matrices Muon trains: every 2-D weight inside the blocks (`transformer.h`) with more than one row
    and column. The 1-row value-embedding gates are a few scalars' worth of weights, left to AdamW."""
    return [p for name, p in model.named_parameters()
            if name.startswith("transformer.h.") and p.dim() == 2 and min(p.shape) > 1 and p.requires_grad]


def build_muon(model: nn.Module, cfg: OptimConfig, world_size: int = 1) -> MuonAdamW:
    """Muon at optim.muon_lr on `muon_matrices`, AdamW at optim.lr on the rest (decayed as in `param_groups`,
    the embedding tables at optim.embed_lr when it is set). With several processes (`world_size`: DDP, or
    FSDP2's shards) each matrix is orthogonalised by one rank (minigpt/cluster/whole_matrices.py).

    Each group's `lr_scale` is its peak lr over optim.lr, so `LRSchedule` moves both along one curve."""
    matrices = muon_matrices(model)
    muon_ids = {id(p) for p in matrices}
    adam_groups = [{**g, "params": [p for p in g["params"] if id(p) not in muon_ids]}
                   for g in param_groups(model, cfg.weight_decay, cfg.embed_lr_scale)]
    n_muon = sum(p.numel() for p in matrices)
    n_adam = sum(p.numel() for g in adam_groups for p in g["params"])
    log.info("Muon: %d parameters in %d matrices; AdamW: %d (embeddings, head, norms, gates)",
             n_muon, len(matrices), n_adam)
    muon = {"params": matrices, "muon": True, "lr": cfg.muon_lr, "lr_scale": cfg.muon_lr / cfg.lr,
            "weight_decay": cfg.weight_decay, "momentum": cfg.muon_momentum, "ns_steps": cfg.muon_ns_steps}
    adam = [{**g, "lr": cfg.lr * g["lr_scale"], "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps}
            for g in adam_groups if g["params"]]
    if world_size == 1 or not matrices:
        return MuonAdamW([muon, *adam])
    sharded = any(isinstance(p, DTensor) for p in matrices)
    sent = communication_bytes([(p.shape[0], p.shape[1]) for p in matrices], world_size, sharded,
                               matrices[0].element_size())
    route = "its FSDP2 rows gathered there and scattered back" if sharded else "then broadcast"
    log.info("Muon over %d ranks: each matrix orthogonalised by one of them (%s), %s bytes per step",
             world_size, route, f"{sent:,}")
    return MuonAdamW([muon, *adam], over_ranks=True)


def lr_multiplier(step: int, progress: float, *, warmup_steps: int, schedule: str, min_lr_ratio: float,
                  cooldown_ratio: float) -> float:
    """The factor on the peak lr for optimizer step `step` (0-based), with `progress` of the budget used.

        warmup(step) = min(1, (step + 1) / warmup_steps)          (1 without warmup)
        cosine(p)    = floor + (1 - floor) * (1 + cos(pi * p)) / 2
        wsd(p)       = 1 until p = 1 - cooldown_ratio, then floor + (1 - floor) * (1 - p) / cooldown_ratio
        multiplier   = warmup(step) * decay(min(p, 1)),  floor = min_lr_ratio

    Warmup counts steps (the first update is already non-zero, step warmup_steps - 1 reaches the peak): it
    keeps Adam's early, badly estimated second moments from taking huge steps, and those need updates, not
    seconds. The decay follows the share of the budget used, in steps, training time, tokens or FLOPs alike,
    and reaches the floor exactly at its end. Multiplying the two keeps the curve continuous without knowing
    in advance when, in seconds, warmup will end; for cosine the top is thereby a little below the peak (0.97
    of it when warmup takes 50 of 400 steps). wsd (warmup-stable-decay) holds the peak for as long as
    possible and cools down only at the end, so a time budget's unknown step count costs it nothing.
    """
    warm = 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)
    p = min(max(progress, 0.0), 1.0)
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * p))
    elif schedule == "wsd":
        decay = 1.0 if p <= 1.0 - cooldown_ratio else (1.0 - p) / cooldown_ratio
    else:
        raise ValueError(f"unknown schedule {schedule!r}")  # OptimConfig refuses it first
    return warm * (min_lr_ratio + (1.0 - min_lr_ratio) * decay)


class LRSchedule:
    """`lr_multiplier` for one run's budget; `apply` sets the lr on the optimizer before each step.

    The progress fed to the formula is the budget's own (`Budget.progress`: the largest share used of its
    steps, training time, tokens and FLOPs), with `optim.decay_steps`, when set, in place of the budget's step
    limit: the lr reaches its floor when the run's first budget runs out. Nothing is stored: a step's lr
    depends only on its number, the training time and the tokens used before it, all saved in every
    checkpoint, so a resumed run picks up the same curve.
    """

    def __init__(self, cfg: OptimConfig, budget: Budget) -> None:
        self.cfg = cfg
        self.budget = budget if cfg.decay_steps is None else dataclasses.replace(budget,
                                                                                 max_steps=cfg.decay_steps)

    def progress(self, step: int, seconds: float, tokens: int) -> float:
        """The share of the budget used after `step` steps, `seconds` of training time and `tokens` tokens."""
        return self.budget.progress(step, seconds, tokens)

    def lr(self, step: int, seconds: float, tokens: int) -> float:
        c = self.cfg
        return c.lr * lr_multiplier(step, self.progress(step, seconds, tokens), warmup_steps=c.warmup_steps,
                                    schedule=c.schedule, min_lr_ratio=c.min_lr_ratio,
                                    cooldown_ratio=c.cooldown_ratio)

    def apply(self, optimizer: torch.optim.Optimizer, step: int, seconds: float, tokens: int) -> float:
        """Set step `step`'s lr on every parameter group and return it. A group's `lr_scale` (1 if it has
        none; Muon's matrices have their own peak, `build_muon`) multiplies it."""
        lr = self.lr(step, seconds, tokens)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return lr
