"""The optimizer, its parameter groups, gradient accumulation, Muon and the learning-rate schedule."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import tiny_config

from minigpt.checkpoint import format as ckpt
from minigpt.device.config import DeviceConfig
from minigpt.device.runtime import resolve_runtime
from minigpt.errors import UserError
from minigpt.model.factory import build_model
from minigpt.runs.train import train
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig
from minigpt.training.muon import MuonAdamW, orthogonalize
from minigpt.training.optim import LRSchedule, build_optimizer, muon_matrices, param_groups
from minigpt.training.step import accumulate_gradients

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0)


def _model(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(tiny_config(**{**TINY, **kw}), vocab_size=64)


def _batch(b: int, t: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 64, (b, t + 1), generator=g)
    return data[:, :-1], data[:, 1:]


def test_one_step_lowers_the_loss():
    model = _model()
    opt = build_optimizer(model, OptimConfig(lr=1e-2, warmup_steps=0))
    x, y = _batch(8)
    _, before = model(x, y)
    before.backward()
    opt.step()
    with torch.no_grad():
        _, after = model(x, y)
    assert after.item() < before.item() - 1e-3


def test_param_groups_decay_only_matrices():
    model = _model(bias=True, tie_weights=True)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "transformer.h.0.attn.c_attn.weight" in decayed and "transformer.h.1.mlp.c_fc.weight" in decayed
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"} <= undecayed
    assert all(n.endswith("bias") or "ln" in n or n.startswith("transformer.w") for n in undecayed)
    # Every parameter exactly once (the tied head shares wte's tensor).
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_grad_accumulation_equals_one_big_batch():
    runtime = resolve_runtime(DeviceConfig(type="cpu", dtype="float32", compile=False))
    scaler = runtime.grad_scaler()
    x, y = _batch(8)
    micro = iter(zip(x.split(2), y.split(2), strict=True))  # 4 micro-batches of 2

    accumulated = _model()
    loss = accumulate_gradients(accumulated, lambda: next(micro), 4, runtime, scaler)
    reference = _model()  # same init, one batch of 8
    _, ref_loss = reference(x, y)
    ref_loss.backward()

    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    for (name, p), q in zip(accumulated.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def _lrs(cfg: OptimConfig, max_steps: int | None, n: int, seconds_per_step: float = 0.0,
         max_seconds: float | None = None) -> list[float]:
    """The lr of each of `n` steps, set as the trainer sets it: before the step, from its number and time."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=cfg.lr)
    schedule = LRSchedule(cfg, Budget(max_steps, max_seconds))
    out = []
    for step in range(n):
        out.append(schedule.apply(opt, step, step * seconds_per_step, 0))
        assert opt.param_groups[0]["lr"] == out[-1]  # what the optimizer really uses
        opt.step()
    return out


def _cosine(step: int, progress: float, peak: float, floor_ratio: float, warmup: int) -> float:
    """The documented formula, written out independently of optim.py."""
    warm = min(1.0, (step + 1) / warmup) if warmup else 1.0
    decay = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return peak * warm * (floor_ratio + (1 - floor_ratio) * decay)


def test_lr_schedule_matches_formula():
    peak, floor = 0.01, 0.001  # min_lr_ratio 0.1
    cfg = OptimConfig(lr=peak, warmup_steps=10, min_lr_ratio=0.1, schedule="cosine")
    lrs = _lrs(cfg, max_steps=110, n=130)
    assert lrs[0] == pytest.approx(peak / 10)  # first warmup step: 1/10 of the peak (the decay is still 1)
    assert lrs[4] == pytest.approx(peak * 5 / 10 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 110))))
    assert lrs[55] == pytest.approx(floor + (peak - floor) * 0.5)  # half way: cos(pi/2) = 0
    assert lrs[110] == pytest.approx(floor) and lrs[129] == pytest.approx(floor)  # stays on the floor
    for step, lr in enumerate(lrs):
        assert lr == pytest.approx(_cosine(step, step / 110, peak, 0.1, 10)), step
    assert all(a >= b for a, b in zip(lrs[9:-1], lrs[10:], strict=True))  # non-increasing after warmup


def test_lr_schedule_decay_steps_overrides_max_steps():
    cfg = OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0, decay_steps=40, schedule="cosine")
    lrs = _lrs(cfg, max_steps=10, n=41)
    assert lrs[0] == pytest.approx(1.0)
    assert lrs[20] == pytest.approx(0.5)
    assert lrs[40] == pytest.approx(0.0)


def test_wsd_holds_the_peak_then_cools_down_linearly_to_the_floor():
    cfg = OptimConfig(lr=1.0, warmup_steps=5, min_lr_ratio=0.1, schedule="wsd", cooldown_ratio=0.2)
    lrs = _lrs(cfg, max_steps=100, n=101)
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])  # warmup
    assert lrs[5:81] == pytest.approx([1.0] * 76)  # stable until 1 - cooldown_ratio of the budget
    assert lrs[90] == pytest.approx(0.1 + 0.9 * 0.5)  # half way down the cooldown
    assert lrs[85] == pytest.approx(0.1 + 0.9 * 0.75)
    assert lrs[100] == pytest.approx(0.1)  # the floor at the end of the budget


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_time_budget_decays_with_the_time_used_and_ends_on_the_floor(schedule: str):
    cfg = OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.1, schedule=schedule, cooldown_ratio=0.5)
    # 0.5 s per step against a 60 s budget: progress = step / 120, whatever the step count would say.
    lrs = _lrs(cfg, max_steps=None, n=150, seconds_per_step=0.5, max_seconds=60.0)
    assert lrs[0] == pytest.approx(1.0)
    cosine = schedule == "cosine"
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 if cosine else 1.0)  # half the budget used
    assert lrs[90] == pytest.approx(0.1 + 0.9 * (0.5 * (1 + math.cos(math.pi * 0.75)) if cosine else 0.5))
    assert lrs[120] == pytest.approx(0.1) and lrs[149] == pytest.approx(0.1)  # budget used: on the floor


def test_with_both_budgets_the_one_further_along_drives_the_decay():
    schedule = LRSchedule(OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0), Budget(100, 60.0))
    assert schedule.progress(10, 30.0, 0) == pytest.approx(0.5)  # time is ahead
    assert schedule.progress(80, 30.0, 0) == pytest.approx(0.8)  # steps are ahead
    assert schedule.lr(100, 1.0, 0) == pytest.approx(0.0) and schedule.lr(1, 60.0, 0) == pytest.approx(0.0)



# ------------------------------------------------------------------------------------------------------ Muon


@pytest.mark.parametrize("shape", [(32, 32), (64, 16), (16, 64), (160, 96)])
def test_orthogonalize_keeps_the_singular_vectors_and_pulls_the_values_towards_one(shape):
    """G = U S Vᵀ built from random orthonormal U, V and singular values spread tenfold: Uᵀ O V is diagonal
    (the same singular vectors) with every value near 1, checked against an SVD of G too."""
    gen = torch.Generator().manual_seed(0)
    r = min(shape)
    u, _ = torch.linalg.qr(torch.randn(shape[0], r, generator=gen))  # (m, r) orthonormal columns
    v, _ = torch.linalg.qr(torch.randn(shape[1], r, generator=gen))  # (n, r)
    g = u @ torch.diag(torch.linspace(0.5, 5.0, r)) @ v.T
    d = u.T @ orthogonalize(g) @ v  # (r, r)
    off_diagonal = d - torch.diag(torch.diagonal(d))
    assert off_diagonal.abs().max() < 1e-4
    assert torch.diagonal(d).min() > 0.6 and torch.diagonal(d).max() < 1.2  # not 1: see muon.py
    svd_u, _, svd_vh = torch.linalg.svd(g, full_matrices=False)
    torch.testing.assert_close(orthogonalize(g, steps=5) @ v @ v.T, orthogonalize(g))  # in G's row space
    assert (svd_u @ svd_vh - orthogonalize(g)).norm() < 0.5 * (svd_u @ svd_vh).norm()  # near U Vᵀ


def test_orthogonalize_of_a_zero_gradient_is_zero():
    assert (orthogonalize(torch.zeros(8, 4)) == 0).all()


def _muon_pair(lr: float = 0.02, wd: float = 0.1) -> tuple[torch.nn.Parameter, torch.nn.Parameter, list]:
    w = torch.randn(48, 24, generator=torch.Generator().manual_seed(1))
    mine, ref = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    optimizers = [MuonAdamW([{"params": [mine], "muon": True, "lr": lr, "weight_decay": wd, "momentum": 0.95,
                              "ns_steps": 5}]),
                  torch.optim.Muon([ref], lr=lr, weight_decay=wd, momentum=0.95, nesterov=True)]
    return mine, ref, optimizers


def test_muon_steps_like_torchs_muon():
    """torch.optim.Muon (the library's, orthogonalising in bfloat16) against ours (float32): the same
    update up to bfloat16's rounding of the orthogonal factor."""
    mine, ref, optimizers = _muon_pair()
    start = mine.detach().clone()
    g = torch.Generator().manual_seed(2)
    for _ in range(4):
        grad = torch.randn(48, 24, generator=g)
        mine.grad, ref.grad = grad.clone(), grad.clone()
        for opt in optimizers:
            opt.step()
    d_mine, d_ref = (mine - start).detach(), (ref - start).detach()
    assert torch.nn.functional.cosine_similarity(d_mine.flatten(), d_ref.flatten(), dim=0) > 0.9999
    assert (d_mine - d_ref).abs().max() < 0.02 * d_ref.abs().max()
    assert d_ref.abs().max() > 0.01  # the step moved the weights


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_embed_lr_gives_the_embedding_tables_their_own_lr_on_the_schedule(name):
    model = _model(value_embeds=True, pos_encoding="rope", tie_weights=False)
    cfg = OptimConfig(name=name, lr=1e-3, embed_lr=0.2, muon_lr=0.05, warmup_steps=4, schedule="cosine")
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    tables, = [g for g in opt.param_groups if g["lr_scale"] == pytest.approx(200)]
    assert {names[id(p)] for p in tables["params"]} == {
        "transformer.wte.weight", *(f"transformer.ve.{i}.weight" for i in range(2))}
    assert tables["weight_decay"] == 0.0
    schedule = LRSchedule(cfg, Budget(max_steps=20))
    for step in (0, 3, 10, 20):
        lr = schedule.apply(opt, step, 0.0, 0)
        assert tables["lr"] == pytest.approx(0.2 * lr / 1e-3)  # the same curve, from embed_lr
        others = [g for g in opt.param_groups if g is not tables and not g.get("muon")]
        assert all(g["lr"] == pytest.approx(lr) for g in others)


def _assert_same_training(a, opt_a, b, opt_b) -> None:
    """Three steps of each model on the same batches leave bit-identical weights."""
    for seed in range(3):
        for model, opt in ((a, opt_a), (b, opt_b)):
            x, y = _batch(4, seed=seed)
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_an_embed_lr_equal_to_lr_trains_exactly_like_none(name):
    a, b = _model(), _model()
    opts = [build_optimizer(m, OptimConfig(name=name, lr=1e-2, embed_lr=e, warmup_steps=0))
            for m, e in ((a, None), (b, 1e-2))]
    assert len(opts[1].param_groups) == len(opts[0].param_groups) + 1  # a third AdamW group, same lr
    _assert_same_training(a, opts[0], b, opts[1])


def test_muon_adamw_trains_its_adamw_groups_exactly_like_torchs_adamw():
    a, b = _model(), _model()
    cfg = OptimConfig(name="adamw", lr=1e-2, warmup_steps=0, weight_decay=0.1, embed_lr=None)
    ours = MuonAdamW([{**g, "lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps}
                      for g in param_groups(a, cfg.weight_decay)])
    torchs = build_optimizer(b, cfg)
    assert isinstance(torchs, torch.optim.AdamW)
    _assert_same_training(a, ours, b, torchs)


def test_muon_takes_the_blocks_matrices_and_adamw_everything_else():
    model = _model(bias=True, tie_weights=False)
    opt = build_optimizer(model, OptimConfig(name="muon", lr=1e-3, muon_lr=0.05, weight_decay=0.1))
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon, *adam = opt.param_groups
    assert muon["muon"] and not any(g["muon"] for g in adam)
    assert {names[id(p)] for p in muon["params"]} == {
        f"transformer.h.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                    "mlp.c_proj")}
    adam_names = {names[id(p)] for g in adam for p in g["params"]}
    assert {"transformer.wte.weight", "lm_head.weight", "transformer.ln_f.weight"} <= adam_names
    assert len(muon["params"]) + len(adam_names) == len(list(model.parameters()))  # each exactly once
    assert [p for p in muon["params"]] == muon_matrices(model)


def test_the_schedule_moves_muon_and_adamw_along_one_curve():
    model = _model()
    cfg = OptimConfig(name="muon", lr=1e-3, muon_lr=0.05, warmup_steps=4, schedule="cosine", embed_lr=None)
    opt = build_optimizer(model, cfg)
    schedule = LRSchedule(cfg, Budget(max_steps=20))
    for step in (0, 3, 10, 20):
        lr = schedule.apply(opt, step, 0.0, 0)
        muon, *adam = opt.param_groups
        assert muon["lr"] == pytest.approx(lr * 50) and all(g["lr"] == pytest.approx(lr) for g in adam)


def test_muon_lowers_the_loss():
    model = _model()
    opt = build_optimizer(model, OptimConfig(name="muon", lr=1e-2, muon_lr=0.02, warmup_steps=0))
    x, y = _batch(8)
    losses = []
    for _ in range(5):
        _, loss = model(x, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize("override, message", [
    ("name", "optim.name='sgd' is not one of: adamw, muon"),
    ("embed_lr", "optim.embed_lr=-1.0 must be positive (or null: optim.lr)"),
    ("muon_lr", "optim.muon_lr=0 must be positive"),
    ("muon_momentum", "optim.muon_momentum=1.0 must be in [0, 1)"),
    ("muon_ns_steps", "optim.muon_ns_steps=0 must be at least 1"),
])
def test_bad_muon_settings_are_user_errors(override, message):
    values = {"name": "sgd", "embed_lr": -1.0, "muon_lr": 0, "muon_momentum": 1.0, "muon_ns_steps": 0}
    value = values[override]
    with pytest.raises(UserError) as err:
        OptimConfig(**{override: value})
    assert message in str(err.value)


@pytest.mark.slow
def test_a_muon_run_resumes_exactly(make_train_cfg, tmp_path):
    common = ("optim.name=muon", "optim.decay_steps=12", "trainer.eval_every=6", "trainer.ckpt_every=6",
              "logging.sample_tokens=0")
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(make_train_cfg(*common, "trainer.max_steps=12"), straight)
    train(make_train_cfg(*common, "trainer.max_steps=6"), split)
    train(make_train_cfg(*common, "trainer.max_steps=12", "trainer.resume=auto"), split)
    a = ckpt.load_state(straight / "checkpoints" / "last")["optimizer"]
    b = ckpt.load_state(split / "checkpoints" / "last")["optimizer"]
    assert a["state"].keys() == b["state"].keys()
    for name in a["state"]:
        for key, value in a["state"][name].items():
            assert torch.equal(value, b["state"][name][key]), (name, key)
    assert any("momentum_buffer" in s for s in a["state"].values())
