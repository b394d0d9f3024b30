"""The reference recipe and minigpt's arm compared from the same weights: the logits of one batch, then
the weights after each of a few optimizer steps, parameter by parameter
(`scripts/side_by_side.py parity_steps=N`).

Two implementations of one recipe can differ in a hundred small places (a gate's range, a group's weight
decay, the orthogonalisation's coefficients), and training curves show only that they differ. Here the
reference's model is built and initialised as its training script does (`ReferenceRun`), its weights are
copied into minigpt's arm under minigpt's names (`copy_reference_weights`), and both take the same steps on
the same batches, each with its own optimizer and schedule; after every step minigpt's weights are set to the
reference's again, so each row measures one step's difference and not the drift of the ones before.

The reference rotates queries and keys by -θ where minigpt rotates by +θ: the same model once its weights are
trained, but not the same function of the same weights, so its sine table is negated here (its cosines and
every other piece are used as they are).
"""

from __future__ import annotations

import torch
from torch import nn

from minigpt.data.prepare import PreparedData, prepare_dataset
from minigpt.errors import UserError
from minigpt.lab.config import SideBySideConfig
from minigpt.lab.side_by_side import ReferenceRun, import_reference
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.optim import LRSchedule, build_optimizer

SCALARS = {"resid_lambdas": "transformer.scalars.resid", "x0_lambdas": "transformer.scalars.x0",
           "backout_lambda": "transformer.scalars.backout",
           "smear_gate.weight": "transformer.smear.gate.weight",
           "smear_lambda": "transformer.smear.lam"}  # the reference's name -> minigpt's


def reference_views(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference's tensors (`weights`: its state_dict or its gradients, by name) under minigpt's names, in
    minigpt's shapes: each block's c_q, c_k and c_v stacked into c_attn, the value-embedding tables moved to
    transformer.ve, the scalars renamed (`SCALARS`)."""
    out = {}
    for name, t in weights.items():
        if name.endswith(("attn.c_k.weight", "attn.c_v.weight")):
            continue
        if name.endswith("attn.c_q.weight"):
            block = name.removesuffix("c_q.weight")
            k, v = weights[block + "c_k.weight"], weights[block + "c_v.weight"]
            out[block + "c_attn.weight"] = torch.cat([t, k, v])  # (q + k + v rows, C)
        elif name.startswith("value_embeds."):
            out["transformer.ve." + name.removeprefix("value_embeds.")] = t
        else:
            out[SCALARS.get(name, name)] = t
    return out


def fit(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The reference's tensor `t` in the shape of minigpt's `like`: its vocabulary rows padded to a multiple
    of 64 cut back (the token table, the head, the value-embedding tables), a scalar in minigpt's shape."""
    if t.dim() == 2 and t.shape[0] > like.shape[0] and t.shape[1:] == like.shape[1:]:
        t = t[: like.shape[0]]
    return t.reshape(like.shape) if t.numel() == like.numel() else t


def copy_reference_weights(reference: nn.Module, model: nn.Module) -> None:
    """Set every parameter of minigpt's `model` to the reference's; UserError naming the first one that has
    no counterpart or another shape (the arm is then not the reference's architecture)."""
    theirs = reference_views(dict(reference.state_dict()))
    ours = dict(model.named_parameters())
    for name in sorted(set(ours) ^ set(theirs)):
        side = "minigpt" if name in ours else "the reference"
        raise UserError(f"parity: {name} is in {side}'s model only: the minigpt arm is not the reference's "
                        "architecture (python scripts/train.py experiment=tricks/recipe has it)")
    with torch.no_grad():
        for name, p in ours.items():
            t = fit(theirs[name], p)
            if t.shape != p.shape:
                raise UserError(f"parity: {name} is {tuple(p.shape)} in minigpt, {tuple(t.shape)} in the "
                                "reference")
            p.copy_(t)


def relative_differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict[str, float]:
    """||ours - theirs|| / ||theirs|| for each of minigpt's tensors (0 where both are zero)."""
    out = {}
    for name, t in ours.items():
        ref = fit(theirs[name], t).float()
        out[name] = (t.float() - ref).norm().item() / max(ref.norm().item(), 1e-30)
    return out


def parity(gpt, cfg: SideBySideConfig, data: PreparedData, seed: int, steps: int) -> dict:
    """The reference and minigpt's arm of `cfg` from the reference's initial weights, on the first `steps`
    training batches of `seed`: the logits' largest difference, then each step's relative difference of
    every parameter's update (the schedules run as over the full budget, so these are its first steps)."""
    tc, block = cfg.minigpt.trainer, cfg.minigpt.model.block_size
    horizon = cfg.reference.steps or tc.max_steps
    run = ReferenceRun(gpt, cfg.reference, data, block, tc.batch_size, seed, horizon)
    run.model.sin.neg_()  # its -θ rotation as minigpt's +θ (module docstring)
    model = build_model(cfg.minigpt.model, data.vocab_size)
    copy_reference_weights(run.model, model)
    optimizer = build_optimizer(model, cfg.minigpt.optim)
    schedule = LRSchedule(cfg.minigpt.optim, Budget(max_steps=tc.max_steps))
    report: dict = {"seed": seed, "steps": []}
    for i in range(steps):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        x, y = run.loader.next_batch()  # (B, T) each: the batch of the reference's step i
        if i == 0:
            model.eval(), run.model.eval()
            with torch.no_grad():
                ours, theirs = model(x)[0], run.model(x)
            theirs = theirs[..., : ours.shape[-1]]  # (B, T, V): its padded vocabulary rows cut
            report["logits_max_abs_difference"] = (ours - theirs).abs().max().item()
            report["logits_max_abs"] = theirs.abs().max().item()
            model.train(), run.model.train()
        _, loss = model(x, y)
        loss.backward()
        schedule.apply(optimizer, i, 0.0, i * x.numel())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.step((x, y))
        theirs = reference_views(dict(run.model.state_dict()))
        steps_ours = {n: p.detach() - before[n] for n, p in model.named_parameters()}
        steps_theirs = {n: fit(theirs[n], before[n]) - before[n] for n in before}
        report["steps"].append(relative_differences(steps_ours, steps_theirs))
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(fit(theirs[n], p))
    return report


def parity_report(cfg: SideBySideConfig) -> dict:
    """`parity` for `cfg`'s first seed, on minigpt's prepared bins."""
    gpt = import_reference(cfg.reference_path, cfg.reference.compile_optimizer)
    data = prepare_dataset(cfg.minigpt.data, cfg.minigpt.tokenizer, progress=False)
    return parity(gpt, cfg, data, cfg.seeds[0], cfg.parity_steps)


def render_parity(report: dict, tolerance: float = 1e-3) -> str:
    """The logits' difference, then each step's largest relative difference and the parameters above
    `tolerance`."""
    lines = [f"logits: max |difference| {report['logits_max_abs_difference']:.2e} "
             f"(max |logit| {report['logits_max_abs']:.2e})"]
    for i, diffs in enumerate(report["steps"]):
        worst = max(diffs.values())
        above = ", ".join(f"{n} {d:.2e}" for n, d in sorted(diffs.items()) if d > tolerance) or "none"
        lines.append(f"step {i}: largest relative difference of an update {worst:.2e}; above {tolerance:g}: "
                     f"{above}")
    return "\n".join(lines)
