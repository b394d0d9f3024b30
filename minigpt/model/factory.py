"""build_model: the one place a ModelConfig becomes a GPT (handed its weights, where it is given them);
put_weights: a state dict into a model, strictly; unwrap: the plain GPT under any wrapper."""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

from minigpt.errors import UserError
from minigpt.model.config import ModelConfig, ablation_warnings
from minigpt.model.gpt import GPT

log = logging.getLogger(__name__)


def build_model(cfg: ModelConfig, vocab_size: int | None = None, *,
                weights: dict[str, torch.Tensor] | None = None, source: str = "") -> GPT:
    """Validate `cfg` and build the model; `vocab_size` (the tokenizer's) fills a null model.vocab_size.
    Given `weights` (a state dict read from the file `source`), the model is handed them (`put_weights`).

    A larger model.vocab_size than the tokenizer's is allowed (e.g. GPT-2's 50257 padded to 50304
    for faster matmuls: the extra rows are simply never targeted); a smaller one is an error.
    The caller's cfg is not modified; the filled copy is `model.config`.
    A model with ablation switches on (model/config.py) is built, with one warning line saying what it
    lacks: every tool that trains or loads a model passes through here.
    """
    if cfg.vocab_size is None:
        if vocab_size is None:
            raise UserError(
                "model.vocab_size is null and no tokenizer vocab size was given: set model.vocab_size"
            )
        cfg = dataclasses.replace(cfg, vocab_size=vocab_size)  # replace() re-runs validation
    elif vocab_size is not None and cfg.vocab_size < vocab_size:
        raise UserError(
            f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's {vocab_size} tokens "
            f"(set model.vocab_size={vocab_size} or null)"
        )
    else:
        cfg = dataclasses.replace(cfg)
    warnings = ablation_warnings(cfg)
    if warnings:
        log.warning("ablation model: %s", "; ".join(warnings))
    model = GPT(cfg)
    if weights is not None:
        put_weights(model, weights, source)
    return model


def put_weights(model: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """`weights` into `model` (unwrapped), strictly: every name and shape must match; else a UserError naming
    `source`, the file they were read from."""
    try:
        unwrap(model).load_state_dict(weights)
    except RuntimeError as e:
        detail = [line.strip() for line in str(e).splitlines()][1:] or [str(e)]  # after "Error(s) in ..."
        raise UserError(f"{source!r} does not match the model: {detail[0][:200]} "
                        "(was it written with a different model config?)") from None


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile (`_orig_mod`) and DDP/FSDP-style wrappers (`module`)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model
