"""The optimizer settings of record-setting recipes, each against its formula written out: Muon's momentum
warmup and cooldown, the cosine weight decay, cautious weight decay, NorMuon, Polar Express, the q/k/v blocks
orthogonalised apart, and the AdamW groups with their own lr, betas, eps and weight decay."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
import torch
from model_helpers import tiny_config

from minigpt.errors import UserError
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig
from minigpt.training.muon import POLAR_EXPRESS, normalize_neurons, orthogonalize, polar_express
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
    shrink = 0.1 * math.sqrt(8 / 6) * 0.5 * before * ((update * before) >= 0)  # at the update's lr
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
    ({"groups": {"heads": {"lr": 0.1}}}, "optim.groups.heads is not a parameter group"),
    ({"groups": {"head": {"momentum": 0.1}}}, "optim.groups.head.momentum is not a group setting"),
    ({"groups": {"x0": {"beta1": 1.0}}}, "optim.groups.x0.beta1=1.0 must be [0, 1)"),
    ({"groups": {"x0": {"lr": 0.0}}}, "optim.groups.x0.lr=0.0 must be > 0"),
    ({"muon_orthogonalize": "svd"}, "optim.muon_orthogonalize='svd' is not one of: newton_schulz,"),
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


def test_polar_express_is_nearer_u_vt_at_its_exact_norm_and_blind_to_row_scales():
    torch.manual_seed(0)
    g = torch.randn(24, 10) @ torch.diag(torch.logspace(-1, 0, 10))  # singular values over a decade
    equal = g * (g.norm() / 24 ** 0.5 / g.norm(dim=1, keepdim=True))  # every row at the mean row norm
    u, _, vh = torch.linalg.svd(equal, full_matrices=False)
    polar = u @ vh  # the exact orthogonal factor of the equalised rows
    out = polar_express(g)
    assert out.norm() == pytest.approx(10 ** 0.5, rel=1e-5)  # sqrt(min(m, n)), an exact U Vᵀ's
    assert (out - polar).norm() < 0.5 * (orthogonalize(equal) - polar).norm()
    rows = torch.rand(24, 1) + 0.5  # the rows are equalised first, so their scales do not matter
    torch.testing.assert_close(polar_express(g * rows), out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(polar_express(g.T.contiguous()), _equalised_columns_polar(g.T), atol=1e-5,
                               rtol=1e-4)


def _equalised_columns_polar(g: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """polar_express of a wide matrix, written out: rows to their mean norm, then the five quintics on
    X / (1.01 ||X||) in `dtype`, then the norm sqrt(min(m, n))."""
    x = g * (g.norm() / g.shape[0] ** 0.5 / g.norm(dim=1, keepdim=True))
    x = (x / (x.norm() * 1.01 + 1e-6)).to(dtype)
    for a, b, c in POLAR_EXPRESS:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    x = x.float()
    return x * (min(x.shape) ** 0.5 / x.norm())


def test_orthogonalising_in_bfloat16_iterates_in_it_and_lands_near_u_vt():
    """The quintics' matmuls in bfloat16 (`optim.muon_dtype`): the iteration written out in bfloat16, near
    the exact U Vᵀ, at its exact norm (the norms stay float32), and not the float32 result."""
    torch.manual_seed(0)
    g = torch.randn(10, 24) @ torch.diag(torch.logspace(-1, 0, 24))
    out = polar_express(g, dtype=torch.bfloat16)
    torch.testing.assert_close(out, _equalised_columns_polar(g, torch.bfloat16), atol=1e-5, rtol=1e-4)
    assert out.dtype == torch.float32 and out.norm() == pytest.approx(10 ** 0.5, rel=1e-5)
    equal = g * (g.norm() / 10 ** 0.5 / g.norm(dim=1, keepdim=True))  # every row at the mean row norm
    u, _, vh = torch.linalg.svd(equal, full_matrices=False)
    exact = u @ vh
    assert (out - exact).norm() < 1.5 * (polar_express(g) - exact).norm()  # bfloat16's 8 bits cost little
    assert not torch.allclose(out, polar_express(g), atol=1e-4)
    newton = orthogonalize(g, dtype=torch.bfloat16)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    exact = u @ vh
    assert newton.dtype == torch.float32 and (newton - exact).norm() < 1.2 * (orthogonalize(g) - exact).norm()


@pytest.mark.parametrize(("setting", "autocast", "want"), [
    ("auto", torch.bfloat16, torch.bfloat16), ("auto", torch.float32, torch.float32),
    ("auto", torch.float16, torch.float32), ("float32", torch.bfloat16, torch.float32),
    ("bfloat16", torch.float32, torch.bfloat16),
])  # fmt: skip
def test_muon_orthogonalises_in_the_autocast_dtype_where_it_is_bfloat16(setting, autocast, want, caplog):
    cfg = OptimConfig(name="muon", muon_orthogonalize="polar_express", muon_dtype=setting)
    with caplog.at_level(logging.INFO, logger="minigpt.training"):
        optimizer = build_optimizer(_model(), cfg, "cpu", autocast_dtype=autocast)
    assert optimizer.ns_dtype == want
    assert ("orthogonalising in bfloat16" in caplog.text) == (want == torch.bfloat16)
    with pytest.raises(UserError, match="optim.muon_dtype='float16' is not one of: auto, float32, bfloat16"):
        OptimConfig(muon_dtype="float16")


def test_split_qkv_steps_each_block_like_a_matrix_of_its_own():
    """Muon over a fused q/k/v matrix with muon_split_qkv against Muon over three separate matrices."""
    cfg = OptimConfig(muon_lr=0.05, muon_momentum=0.9, muon_beta2=0.95, muon_split_qkv=True,
                      muon_orthogonalize="polar_express", weight_decay=0.3, cautious_weight_decay=True)
    model = _model(n_kv_head=1)
    attn = model.transformer.h[0].attn
    rows = [attn.n_head * attn.head_dim, attn.head_dim, attn.head_dim]
    parts = [torch.nn.Parameter(p.detach().clone()) for p in attn.c_attn.weight.split(rows)]
    alone = torch.nn.Module()
    alone.transformer = torch.nn.ModuleDict({"h": torch.nn.ParameterList(parts)})
    opts = [build_optimizer(model, cfg),
            build_optimizer(alone, dataclasses.replace(cfg, muon_split_qkv=False))]
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        for part, grad in zip(parts, attn.c_attn.weight.grad.split(rows), strict=True):
            part.grad = grad.clone()
        for opt in opts:
            opt.step()
    torch.testing.assert_close(attn.c_attn.weight.detach(), torch.cat([p.detach() for p in parts]))


def test_the_groups_get_their_own_lr_betas_eps_and_a_constant_weight_decay():
    model = _model(residual_scalars=True, backout=True, value_embeds=True, smear=True, pos_encoding="rope")
    groups_cfg = {"head": {"lr": 0.02, "beta2": 0.96, "weight_decay": 0.01},
                  "value_tables": {"lr": 0.4, "weight_decay": 0.01}, "resid": {"lr": 0.005},
                  "x0": {"lr": 0.5, "beta1": 0.96}, "gates": {"lr": 0.2, "eps": 1e-10}}
    cfg = OptimConfig(lr=0.01, embed_lr=0.8, weight_decay=0.28, weight_decay_schedule="cosine",
                      groups=groups_cfg)
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g.get("name", "muon"): g for g in opt.param_groups}
    members = {name: {names[id(p)] for p in g["params"]} for name, g in groups.items()}
    assert members["value_tables"] == {"transformer.ve.0.weight", "transformer.ve.1.weight"}
    assert members["tables"] == {"transformer.wte.weight"}
    assert members["resid"] == {"transformer.scalars.resid"} and members["x0"] == {"transformer.scalars.x0"}
    assert members["gates"] == {"transformer.smear.gate.weight", "transformer.smear.lam",
                                "transformer.scalars.backout"}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    LRSchedule(cfg, Budget(max_steps=100)).apply(opt, 50, 0.0, 0)  # mid-run: the lr at its peak, decay halved
    want = {"head": (0.02, (0.9, 0.96), 1e-8, 0.01), "value_tables": (0.4, (0.9, 0.95), 1e-8, 0.01),
            "resid": (0.005, (0.9, 0.95), 1e-8, 0.0), "x0": (0.5, (0.96, 0.95), 1e-8, 0.0),
            "gates": (0.2, (0.9, 0.95), 1e-10, 0.0), "tables": (0.8, (0.9, 0.95), 1e-8, 0.0)}
    for name, (lr, betas, eps, decay) in want.items():
        g = groups[name]
        got = (g["lr"], g["betas"], g["eps"], g["weight_decay"])
        assert got == (pytest.approx(lr), betas, eps, decay), name
    assert groups["muon"]["weight_decay"] == pytest.approx(0.14)  # the scheduled decay: cos² at half way


def test_the_recipe_builds_over_ranks_and_counts_its_second_moments_among_the_bytes(caplog):
    """The recipe's Muon over 2 DDP ranks (whole matrices: building needs no process group) shares its work
    out, and the bytes it logs per step count NorMuon's second moments, the long side of each row block."""
    cfg = OptimConfig(muon_beta2=0.9, muon_split_qkv=True, muon_orthogonalize="polar_express",
                      weight_decay=0.28, cautious_weight_decay=True)
    with caplog.at_level(logging.INFO, logger="minigpt.training.optim"):
        opt = build_optimizer(_model(n_kv_head=1), cfg, world_size=2)
    assert opt.over_ranks
    # a layer (32 wide, q of 2 heads of 16, one k/v head, FFN 128): qkv (64, 32) as (32, 32), (16, 32) and
    # (16, 32), out (32, 32), up (128, 32), down (32, 128); the other rank receives every update once
    updates = 2 * (64 * 32 + 32 * 32 + 128 * 32 + 32 * 128)  # 2 layers
    moments = 2 * (32 + 32 + 32 + 32 + 128 + 128)  # (32, 1), (1, 32), (1, 32), (32, 1), (128, 1), (1, 128)
    assert f"{4 * (updates + moments):,} bytes per step" in caplog.text


def test_one_process_stacks_same_shaped_blocks_and_gets_each_block_s_own_update(monkeypatch):
    """Blocks of one shape are orthogonalised (and normalised) as one stack: against each matrix stepped
    alone, with its row blocks (split or not, tall or wide) and their second moments, for three steps."""
    from minigpt.training.muon import MuonAdamW
    gen = torch.Generator().manual_seed(5)
    shapes = [(12, 8), (8, 12), (12, 8), (24, 8), (8, 8)]
    wholes = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    recipe = dict(muon=True, lr=0.02, cautious=True, beta2=0.9, orthogonalize="polar_express")

    def run(stacked: bool) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(w.clone()) for w in wholes]
        opt = MuonAdamW([{**recipe, "params": params[:3] + params[4:]},
                         {**recipe, "params": params[3:4], "splits": [8, 8, 8]}])  # three (8, 8) blocks
        if not stacked:
            monkeypatch.setattr(opt, "_stacked_updates", lambda ps, group, ns: [
                opt._matrix_update(ps, group, i, n) for i, n in enumerate(ns)])
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in params] + [v for p in params for v in opt.state[p].values()]

    for got, want in zip(run(stacked=True), run(stacked=False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
