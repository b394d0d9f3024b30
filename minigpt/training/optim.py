"""AdamW with two parameter groups, and the learning-rate schedule: linear warmup, then cosine to a floor.

This is the only place the schedule is defined; `lr_multiplier` is the formula, `build_scheduler` wraps it in
torch's `LambdaLR` so its state (the step count) checkpoints with the rest of the run.
"""

from __future__ import annotations

import logging
import math
from functools import partial

import torch
from torch import nn

from minigpt.training.config import OptimConfig

log = logging.getLogger(__name__)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split parameters into a decayed group (matrices) and an undecayed one (everything else).

    Weight decay pulls weights towards zero, which regularises the linear maps. It is wrong for norm gains
    (pulling them to zero shrinks the signal, not the model's capacity) and pointless for biases. Embeddings
    are not decayed either, by choice: a token's row only receives gradient when the token occurs, so decay
    would steadily erase rare tokens between their appearances. With tied weights the output head shares the
    embedding's tensor, so it follows the embedding's rule. The split is by name and rank: every 2-D weight
    except the embedding tables is decayed.
    """
    decay, no_decay = [], []
    seen: set[int] = set()
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() >= 2 and id(p) not in embeddings:
            decay.append(p)
        else:
            no_decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str = "cpu") -> torch.optim.AdamW:
    """AdamW over `param_groups`, fused on CUDA and CPU: one kernel updates all parameters in one pass
    over their memory (measured on the 2-core CPU for shape M of the bench: 46 ms per step against 315 ms
    for the default for-loop implementation)."""
    groups = param_groups(model, cfg.weight_decay)
    n_decay = sum(p.numel() for p in groups[0]["params"])
    n_other = sum(p.numel() for p in groups[1]["params"])
    log.info("AdamW: %d decayed parameters, %d not decayed (norms, biases, embeddings)", n_decay, n_other)
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=device_type in ("cuda", "cpu"),
    )


def lr_multiplier(step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float) -> float:
    """The factor on the peak lr for optimizer step `step` (0-based).

    Warmup: (step + 1) / warmup_steps, so the first update is already non-zero and step warmup_steps - 1
    reaches the peak. Then cosine from 1 at step warmup_steps down to min_lr_ratio at step decay_steps, and
    flat afterwards. Warmup keeps Adam's early, badly estimated second moments from taking huge steps.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / max(1, decay_steps - warmup_steps)  # 0 -> 1
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """`lr_multiplier` as a torch scheduler; call `.step()` once after each optimizer step."""
    decay_steps = cfg.decay_steps if cfg.decay_steps is not None else max_steps
    fn = partial(
        lr_multiplier,
        warmup_steps=cfg.warmup_steps,
        decay_steps=max(decay_steps, cfg.warmup_steps),
        min_lr_ratio=cfg.min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
