"""The optimizer, its parameter groups, gradient accumulation and the learning-rate schedule."""

from __future__ import annotations

import math

import pytest
import torch

from minigpt.device.config import DeviceConfig
from minigpt.device.runtime import resolve_runtime
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.training.config import OptimConfig
from minigpt.training.optim import build_optimizer, build_scheduler, param_groups
from minigpt.training.step import accumulate_gradients

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0)


def _model(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(**{**TINY, **kw}), vocab_size=64)


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


def _lrs(cfg: OptimConfig, max_steps: int, n: int) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=cfg.lr)
    sched = build_scheduler(opt, cfg, max_steps)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])  # the lr this step uses
        opt.step()
        sched.step()
    return out


def test_lr_schedule_matches_formula():
    peak, floor = 0.01, 0.001  # min_lr_ratio 0.1
    lrs = _lrs(OptimConfig(lr=peak, warmup_steps=10, min_lr_ratio=0.1), max_steps=110, n=130)
    assert lrs[0] == pytest.approx(peak / 10)  # first warmup step: 1/10 of the peak
    assert lrs[4] == pytest.approx(peak * 5 / 10)
    assert lrs[9] == pytest.approx(peak)  # warmup done
    assert lrs[10] == pytest.approx(peak)  # the cosine starts at the peak
    assert lrs[60] == pytest.approx(floor + (peak - floor) * 0.5)  # half way: cos(pi/2) = 0
    assert lrs[35] == pytest.approx(floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lrs[110] == pytest.approx(floor) and lrs[129] == pytest.approx(floor)  # stays on the floor
    assert all(a >= b for a, b in zip(lrs[9:-1], lrs[10:], strict=True))  # non-increasing after warmup


def test_lr_schedule_decay_steps_overrides_max_steps():
    lrs = _lrs(OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0, decay_steps=40), max_steps=10, n=41)
    assert lrs[0] == pytest.approx(1.0)
    assert lrs[20] == pytest.approx(0.5)
    assert lrs[40] == pytest.approx(0.0)
