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
from minigpt.model.attention import CausalSelfAttention
from minigpt.model.residual_scalars import ResidualScalars
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig
from minigpt.training.muon import MuonAdamW

log = logging.getLogger(__name__)


def param_groups(model: nn.Module, weight_decay: float, lr_scales: dict[str, float | None] | None = None,
                 own_groups: tuple[str, ...] = ()) -> list[dict]:
    """Split parameters into a decayed group (matrices) and an undecayed one (everything else), and into
    groups of their own at a multiple of optim.lr where `lr_scales` (`OptimConfig.lr_scales`) gives one:
    `tables` (the embedding tables, undecayed; optim.embed_lr), `head` (the untied output head, decayed;
    optim.head_lr), `scalars` (the residual scalars of model/residual_scalars.py, undecayed; optim.scalar_lr).
    `own_groups` (the names optim.groups sets) carves finer groups out of those: `value_tables` (the
    value-embedding tables, out of `tables`), `resid` and `x0` (the scalars a_i and b_i) and `gates` (the
    smear's gate and strength, the backout). Each group has a `name`, its `lr_scale` (its lr over optim.lr,
    `LRSchedule.apply`) and whether it is `decayed`.

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
    scales = {"tables": None, "head": None, "scalars": None, **(lr_scales or {})}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    named = dict(model.named_parameters())
    scalars = [m for m in model.modules() if isinstance(m, ResidualScalars)]
    ids = {name: {id(p) for key, p in named.items() if test(key)} for name, test in FINE_GROUPS.items()}
    own = {**{name: ids[name] for name in FINE_GROUPS if name in own_groups},
           "tables": embeddings, "head": {id(head.weight)} - embeddings if head is not None else set(),
           "scalars": {id(p) for m in scalars for p in m.parameters()}}
    own = {name: ids for name, ids in own.items() if name in own_groups or scales.get(name) is not None}
    found: dict[str, list[nn.Parameter]] = {name: [] for name in ("matrices", "other", *own)}
    seen: set[int] = set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        name = next((g for g, ids in own.items() if id(p) in ids), None)
        found[name or ("matrices" if p.dim() >= 2 and id(p) not in embeddings else "other")].append(p)
    decayed = {"matrices": True, "head": True}
    return [{"name": name, "params": params, "weight_decay": weight_decay if decayed.get(name) else 0.0,
             "lr_scale": scales.get(name) or 1.0, "decayed": decayed.get(name, False)}
            for name, params in found.items()]


# The finer AdamW groups optim.groups may carve out (`param_groups`), by parameter name.
FINE_GROUPS = {
    "value_tables": lambda name: name.startswith("transformer.ve."),
    "resid": lambda name: name == "transformer.scalars.resid",
    "x0": lambda name: name == "transformer.scalars.x0",
    "gates": lambda name: name in ("transformer.smear.gate.weight", "transformer.smear.lam",
                                   "transformer.scalars.backout"),
}


def adam_settings(group: dict, cfg: OptimConfig) -> dict:
    """AdamW's settings for `group`: optim.beta1, optim.beta2 (the tables: optim.embed_beta2 where set) and
    optim.eps, and whatever optim.groups gives the group (its lr, and a weight decay that stays constant)."""
    own = cfg.groups.get(group["name"], {})
    tables = group["name"] in ("tables", "value_tables") and cfg.embed_beta2 is not None
    beta2 = cfg.embed_beta2 if tables else cfg.beta2
    settings = {"betas": (own.get("beta1", cfg.beta1), own.get("beta2", beta2)),
                "eps": own.get("eps", cfg.eps), "lr": cfg.lr * group["lr_scale"]}
    if "lr" in own:
        settings.update(lr=own["lr"], lr_scale=own["lr"] / cfg.lr)
    if "weight_decay" in own:
        settings.update(weight_decay=own["weight_decay"], decayed=False)
    return settings


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str = "cpu", world_size: int = 1,
                    autocast_dtype: torch.dtype = torch.float32) -> torch.optim.Optimizer:
    """AdamW over `param_groups`, fused on CUDA and CPU: one kernel updates all parameters in one pass
    over their memory, where the default implementation loops over them in Python (docs/performance.md).
    optim.name=muon: `build_muon`, its matmuls in `muon_dtype(cfg, autocast_dtype)`. AdamW's update is
    elementwise, so under DDP or FSDP2 (`world_size` > 1) each rank updates what it holds; Muon's is not,
    and shares its work out over the ranks."""
    if cfg.name == "muon":
        return build_muon(model, cfg, world_size, muon_dtype(cfg, autocast_dtype))
    groups = [{**g, **adam_settings(g, cfg)}
              for g in param_groups(model, cfg.weight_decay, cfg.lr_scales, tuple(cfg.groups))]
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


def muon_dtype(cfg: OptimConfig, autocast_dtype: torch.dtype) -> torch.dtype:
    """The dtype of Muon's orthogonalisation: optim.muon_dtype, where auto is bfloat16 in a run that autocasts
    to it (the runtime chose it where bf16 matmuls measured faster: device/runtime.py) and float32 otherwise
    (float16's range is too narrow for the iteration's intermediate powers)."""
    if cfg.muon_dtype == "auto":
        return torch.bfloat16 if autocast_dtype == torch.bfloat16 else torch.float32
    return getattr(torch, cfg.muon_dtype)


def build_muon(model: nn.Module, cfg: OptimConfig, world_size: int = 1,
               ns_dtype: torch.dtype = torch.float32) -> MuonAdamW:
    """Muon at optim.muon_lr on `muon_matrices`, AdamW at optim.lr on the rest (decayed as in `param_groups`,
    the embedding tables at optim.embed_lr when it is set). With several processes (`world_size`: DDP, or
    FSDP2's shards) each matrix's update is computed by one rank (minigpt/cluster/whole_matrices.py).

    Each group's `lr_scale` is its peak lr over optim.lr, so `LRSchedule` moves both along one curve."""
    matrices = muon_matrices(model)
    muon_ids = {id(p) for p in matrices}
    adam_groups = [{**g, "params": [p for p in g["params"] if id(p) not in muon_ids]}
                   for g in param_groups(model, cfg.weight_decay, cfg.lr_scales, tuple(cfg.groups))]
    n_muon = sum(p.numel() for p in matrices)
    n_adam = sum(p.numel() for g in adam_groups for p in g["params"])
    log.info("Muon: %d parameters in %d matrices; AdamW: %d (embeddings, head, norms, gates)",
             n_muon, len(matrices), n_adam)
    muon = {"muon": True, "lr": cfg.muon_lr, "lr_scale": cfg.muon_lr / cfg.lr,
            "weight_decay": cfg.weight_decay, "decayed": True, "cautious": cfg.cautious_weight_decay,
            "momentum": cfg.muon_momentum, "ns_steps": cfg.muon_ns_steps, "beta2": cfg.muon_beta2,
            "orthogonalize": cfg.muon_orthogonalize}
    splits = qkv_splits(model) if cfg.muon_split_qkv else {}
    fused = [p for p in matrices if id(p) in splits]
    muon_groups = [{**muon, "params": [p for p in matrices if id(p) not in splits]}]
    for rows in {splits[id(p)] for p in fused}:  # one group per split (every layer's is the same)
        same = [p for p in fused if splits[id(p)] == rows]
        muon_groups.append({**muon, "params": same, "splits": list(rows)})
    groups = [g for g in muon_groups if g["params"]] + [{**g, **adam_settings(g, cfg)}
                                                        for g in adam_groups if g["params"]]
    if ns_dtype != torch.float32:
        log.info("Muon: orthogonalising in %s", str(ns_dtype).removeprefix("torch."))
    if world_size == 1 or not matrices:
        return MuonAdamW(groups, ns_dtype=ns_dtype)
    sharded = any(isinstance(p, DTensor) for p in matrices)
    moments = 0 if cfg.muon_beta2 is None else sum(  # NorMuon's: the long side of each block, float32
        max(r, p.shape[1]) for p in matrices for r in splits.get(id(p), (p.shape[0],)))
    sent = communication_bytes([(p.shape[0], p.shape[1]) for p in matrices], world_size, sharded,
                               matrices[0].element_size(), state_bytes=4 * moments)
    route = "its FSDP2 rows gathered there and scattered back" if sharded else "then broadcast"
    log.info("Muon over %d ranks: each matrix orthogonalised by one of them (%s), %s bytes per step",
             world_size, route, f"{sent:,}")
    return MuonAdamW(groups, over_ranks=True, ns_dtype=ns_dtype)


def qkv_splits(model: nn.Module) -> dict[int, tuple[int, int, int]]:
    """id of each attention's fused q/k/v matrix -> its rows of queries, keys and values."""
    return {id(m.c_attn.weight): (m.n_head * m.head_dim, m.n_kv_head * m.head_dim, m.n_kv_head * m.head_dim)
            for m in model.modules() if isinstance(m, CausalSelfAttention)}


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


def muon_momentum(step: int, progress: float, cfg: OptimConfig) -> float:
    """Muon's momentum for optimizer step `step` (0-based) with `progress` of the budget used:

        warmup    start + (peak - start) * step / W            step < W = muon_momentum_warmup_steps
        cooldown  peak + (end - peak) * (p - (1 - c)) / c      p > 1 - c, c = cooldown_ratio
        else      peak = muon_momentum                          (start, end: muon_momentum_start, _end)

    A shorter average at first follows the fast-changing early gradients; at the end it follows the decaying
    lr's small steps more closely. The warmup wins where the two would overlap (runs under W / (1 - c)).
    """
    peak = cfg.muon_momentum
    if cfg.muon_momentum_start is not None and step < cfg.muon_momentum_warmup_steps:
        start = cfg.muon_momentum_start
        return start + (peak - start) * step / cfg.muon_momentum_warmup_steps
    c, p = cfg.cooldown_ratio, min(max(progress, 0.0), 1.0)
    if cfg.muon_momentum_end is not None and c > 0 and p > 1.0 - c:
        return peak + (cfg.muon_momentum_end - peak) * (p - (1.0 - c)) / c
    return peak


def weight_decay_multiplier(progress: float, schedule: str) -> float:
    """The factor on optim.weight_decay with `progress` of the budget used: 1 (constant), or
    (1 + cos(pi p)) / 2 (cosine): the pull towards zero fades as the lr does, so that the last steps are not
    spent shrinking weights."""
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


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
        none; Muon's matrices have their own peak, `build_muon`) multiplies it. Muon's momentum
        (`muon_momentum`) and the decayed groups' weight decay (`weight_decay_multiplier`) follow the same
        progress through the budget."""
        c = self.cfg
        progress = self.progress(step, seconds, tokens)
        lr = self.lr(step, seconds, tokens)
        decay = c.weight_decay * weight_decay_multiplier(progress, c.weight_decay_schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
            if group.get("muon"):
                group["momentum"] = muon_momentum(step, progress, c)
            if group.get("decayed"):
                group["weight_decay"] = decay
        return lr
