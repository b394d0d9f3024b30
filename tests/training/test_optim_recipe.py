"""The optimizer settings of record-setting recipes, each against its formula written out: Muon's momentum
warmup and cooldown, the cosine weight decay, cautious weight decay, and the AdamW groups with their own lr
and betas (the head, the residual scalars, the tables)."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import tiny_config

from minigpt.errors import UserError
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig
from minigpt.training.muon import normalize_neurons, orthogonalize
from minigpt.training.optim import LRSchedule, build_optimizer, muon_momentum, weight_decay_multiplier

MOMENTUM = dict(muon_momentum=0.97, muon_momentum_start=0.85, muon_momentum_warmup_steps=400,
                muon_momentum_end=0.9, cooldown_ratio=0.65)


def _model(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=16, tie_weights=False, bias=False, **kw)
    return build_model(cfg, vocab_size=64)


@pytest.mark.parametrize("step, want", [(0, 0.85), (100, 0.88), (399, 0.85 + 0.12 * 399 / 400), (400, 0.97),
                                        (770, 0.97), (1485, 0.935), (2200, 0.9)])
def test_muon_momentum_warms_up_holds_and_cools_down(step, want):
    # 2,200 steps: the warmup is 0.85 -> 0.97 over 400 steps; the cooldown 0.97 -> 0.90 over steps 770 .. 2200
    assert muon_momentum(step, step / 2200, OptimConfig(**MOMENTUM)) == pytest.approx(want)


def test_muon_momentum_is_constant_without_its_schedule():
    cfg = OptimConfig(muon_momentum=0.95)
    assert {muon_momentum(s, s / 100, cfg) for s in range(101)} == {0.95}


def test_the_warmup_wins_where_it_overlaps_the_cooldown():
    cfg = OptimConfig(**MOMENTUM)  # 500 steps: the cooldown would start at step 175, the warmup lasts 400
    assert muon_momentum(300, 300 / 500, cfg) == pytest.approx(0.85 + 0.12 * 300 / 400)
    assert muon_momentum(450, 450 / 500, cfg) == pytest.approx(0.97 - 0.07 * (0.9 - 0.35) / 0.65)


@pytest.mark.parametrize("progress", [0.0, 0.25, 0.5, 1.0, 1.5])
def test_cosine_weight_decay_falls_from_one_to_zero(progress):
    p = min(progress, 1.0)
    assert weight_decay_multiplier(progress, "cosine") == pytest.approx(math.cos(math.pi * p / 2) ** 2)
    assert weight_decay_multiplier(progress, "constant") == 1.0


def test_the_schedule_sets_momentum_and_weight_decay_on_the_groups():
    cfg = OptimConfig(weight_decay=0.2, weight_decay_schedule="cosine", **MOMENTUM)
    opt = build_optimizer(_model(), cfg)
    LRSchedule(cfg, Budget(max_steps=2200)).apply(opt, 1100, 0.0, 0)
    muon, *adam = opt.param_groups
    assert muon["momentum"] == pytest.approx(0.97 - 0.07 * (0.5 - 0.35) / 0.65)
    assert muon["weight_decay"] == pytest.approx(0.1)  # cos² of pi/4
    assert {g["name"]: g["weight_decay"] for g in adam} == pytest.approx({"matrices": 0.1, "other": 0.0,
                                                                          "tables": 0.0})


def test_cautious_weight_decay_decays_only_where_the_update_points_towards_zero():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 6))
    w.grad = torch.randn(8, 6)
    before = w.detach().clone()
    cfg = OptimConfig(muon_lr=0.1, weight_decay=0.5, cautious_weight_decay=True, muon_momentum=0.9)
    model = torch.nn.Module()
    model.transformer = torch.nn.ModuleDict({"h": torch.nn.ParameterList([w])})  # a block matrix for Muon
    opt = build_optimizer(model, cfg)
    opt.param_groups[0]["lr"] = 0.1
    opt.step()
    nesterov = w.grad + 0.9 * (0.1 * w.grad - w.grad)  # G + mu (M - G), M = (1 - mu) G after one step
    update = orthogonalize(nesterov)
    shrink = 0.1 * 0.5 * before * ((update * before) > 0)
    torch.testing.assert_close(w.detach(), before - shrink - 0.1 * math.sqrt(8 / 6) * update)
    assert 0 < (shrink != 0).sum() < w.numel()  # some entries decayed, some not


def test_the_head_the_scalars_and_the_tables_get_their_own_lr_and_betas():
    model = _model(residual_scalars=True, backout=True, value_embeds=True, pos_encoding="rope")
    cfg = OptimConfig(lr=0.01, embed_lr=0.5, head_lr=0.03, scalar_lr=0.2, beta1=0.8, embed_beta2=0.99)
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g.get("name", "muon"): g for g in opt.param_groups}
    assert {names[id(p)] for p in groups["head"]["params"]} == {"lm_head.weight"}
    assert {names[id(p)] for p in groups["scalars"]["params"]} == {"transformer.scalars.resid",
                                                                  "transformer.scalars.x0",
                                                                  "transformer.scalars.backout"}
    tables = {"transformer.wte.weight", "transformer.ve.0.weight", "transformer.ve.1.weight"}
    assert {names[id(p)] for p in groups["tables"]["params"]} == tables
    lrs = [groups[n]["lr"] for n in ("head", "scalars", "tables", "other")]
    assert lrs == pytest.approx([0.03, 0.2, 0.5, 0.01])
    assert groups["tables"]["betas"] == (0.8, 0.99) and groups["head"]["betas"] == (0.8, 0.95)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    LRSchedule(cfg, Budget(max_steps=100)).apply(opt, 100, 0.0, 0)  # the budget's end: 0.1 of each peak
    assert groups["scalars"]["lr"] == pytest.approx(0.02) and groups["head"]["lr"] == pytest.approx(0.003)


@pytest.mark.parametrize("values, message", [
    ({"muon_momentum_start": 0.85}, "optim.muon_momentum_start and optim.muon_momentum_warmup_steps go"),
    ({"muon_momentum_end": 1.0}, "optim.muon_momentum_end=1.0 must be in [0, 1)"),
    ({"weight_decay_schedule": "linear"}, "optim.weight_decay_schedule='linear' is not one of: constant,"),
    ({"head_lr": 0.0}, "optim.head_lr=0.0 must be positive"),
    ({"embed_beta2": 1.0}, "optim.embed_beta2=1.0 must be in [0, 1)"),
])
def test_bad_values_are_one_line_user_errors(values, message):
    with pytest.raises(UserError) as err:
        OptimConfig(**values)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_normalize_neurons_evens_the_rows_and_keeps_the_norm():
    torch.manual_seed(0)
    update = torch.randn(12, 5) * torch.linspace(0.1, 3.0, 12)[:, None]  # tall: rows of very unequal length
    v = torch.zeros(12, 1)
    out = normalize_neurons(update, v, beta2=0.9)
    rms = (update.square().mean(dim=1, keepdim=True) * 0.1).sqrt()  # V after one step from 0: 0.1 · mean(O²)
    want = update / rms
    want = want * update.norm() / want.norm()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(v, update.square().mean(dim=1, keepdim=True) * 0.1)
    assert out.norm() == pytest.approx(update.norm().item(), rel=1e-5)
    row_norms = out.norm(dim=1)
    assert row_norms.max() / row_norms.min() < 1.0001  # every row the same length after one step
    wide = normalize_neurons(update.T.contiguous(), torch.zeros(1, 12), beta2=0.9)  # wide: per column
    torch.testing.assert_close(wide, out.T)


def test_muon_with_beta2_steps_by_the_normalised_update():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 6))
    w.grad = torch.randn(8, 6)
    before = w.detach().clone()
    model = torch.nn.Module()
    model.transformer = torch.nn.ModuleDict({"h": torch.nn.ParameterList([w])})
    opt = build_optimizer(model, OptimConfig(muon_lr=0.1, muon_momentum=0.9, muon_beta2=0.95))
    opt.param_groups[0]["lr"] = 0.1
    opt.step()
    update = orthogonalize(w.grad + 0.9 * (0.1 * w.grad - w.grad))
    v = 0.05 * update.square().mean(dim=1, keepdim=True)
    normalised = update / v.sqrt()
    normalised = normalised * update.norm() / normalised.norm()
    torch.testing.assert_close(w.detach(), before - 0.1 * math.sqrt(8 / 6) * normalised)
    torch.testing.assert_close(opt.state[w]["second_moment"], v)
