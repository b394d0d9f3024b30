"""Weight-only int8 (model/int8.py) against float arithmetic: the rounding bound of each weight, the product's
error bound, PyTorch's int8 kernel against the formula computed in float64, and a whole model against its
float32 original."""

from __future__ import annotations

import copy

import pytest
import torch
from model_helpers import VOCAB, shrunk_model

from minigpt.model.int8 import (
    INT8_MAX,
    Int8Linear,
    has_packed_kernel,
    int8_linear_reference,
    quantize_int8,
    quantize_per_channel,
)

GEN = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731


def _weight(out: int = 48, inp: int = 40, seed: int = 0) -> torch.Tensor:
    w = torch.randn(out, inp, generator=GEN(seed))
    w[3] *= 50.0  # one loud channel: per-channel scales keep it from costing the others their precision
    w[5] = 0.0  # an all-zero channel must come back as zeros, not NaN
    return w


def test_each_weight_is_within_half_a_step_of_its_channel() -> None:
    w = _weight()
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and q.abs().max() <= INT8_MAX and scale.shape == (w.shape[0],)
    err = (w - q.double() * scale.double().unsqueeze(1)).abs()
    assert (err <= scale.double().unsqueeze(1) / 2 * (1 + 1e-6)).all()
    assert torch.equal(q[5], torch.zeros_like(q[5])) and torch.isfinite(scale).all()
    assert (q.abs().amax(dim=1)[w.abs().amax(dim=1) > 0] == INT8_MAX).all()  # each channel uses its range
    assert scale[3] > 20 * scale[4]  # the loud channel has a scale of its own


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorchs_kernel_computes_the_formula(dtype: torch.dtype) -> None:
    w, x = _weight(inp=48), torch.randn(7, 48, generator=GEN(1))  # 48 inputs: a multiple of 16
    q, scale = quantize_per_channel(w)
    xd, sd = x.to(dtype), scale.to(dtype)
    exact = (xd.double() @ q.double().t()) * sd.double()  # (7, 48): the formula, in float64
    packed = torch.ops.aten._weight_int8pack_mm(xd, q, sd)
    reference = int8_linear_reference(xd, q, sd, None)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # relative to the output's size: accumulation rounding
    for y in (packed, reference):
        assert y.dtype == dtype
        assert ((y.double() - exact).abs() <= tol * exact.abs().max()).all()


def test_the_product_error_is_within_the_rounding_bound() -> None:
    """|x·w - x·(q·s)| <= Σ_i |x_i| · s/2 per output: the bound weight rounding allows, and no more."""
    linear = torch.nn.Linear(40, 48)
    with torch.no_grad():
        linear.weight.copy_(_weight(seed=2))
    x = torch.randn(3, 5, 40, generator=GEN(3))  # (B, T, in): any leading shape
    for packed in (True, False):
        layer = Int8Linear.from_linear(linear, torch.float32, packed_kernel=packed)
        y = layer(x)
        assert y.shape == (3, 5, 48)
        bound = x.abs().sum(-1, keepdim=True).double() * layer.scale.double() / 2  # (B, T, out)
        err = (y.double() - linear(x).double()).abs()
        assert (err <= bound + 1e-4).all() and err.max() > 0  # within the bound, and the bound is not vacuous
        torch.testing.assert_close(layer.weight, layer.q.float() * layer.scale.unsqueeze(1))


def _sharp(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=GEN(seed)) * 0.3)
    return model


@pytest.mark.parametrize("preset", ["gpt2", "demo"])  # tied head with biases; untied, GQA, RoPE, SwiGLU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_model_follows_its_float32_original(preset: str, dtype: torch.dtype) -> None:
    model = _sharp(shrunk_model(preset), seed=4)
    int8 = quantize_int8(copy.deepcopy(model), dtype)
    linears = [m for m in int8.modules() if isinstance(m, Int8Linear)]
    assert linears and not any(isinstance(m, torch.nn.Linear) for m in int8.modules())
    assert int8.transformer.wte.weight.dtype == dtype and all(m.q.dtype == torch.int8 for m in linears)
    idx = torch.randint(0, VOCAB, (2, 12), generator=GEN(5))
    with torch.no_grad():
        want, _ = model(idx)
        got, _ = int8(idx)
        scale = want.abs().max()
        assert got.dtype == dtype and (got.float() - want).abs().max() <= 0.05 * scale
        # the fused loss head (GPT.forward's return_logits=False, as validation scores) reads `weight`
        _, fused = int8(idx[:, :-1], idx[:, 1:], return_logits=False)
        _, plain = model(idx[:, :-1], idx[:, 1:])
        assert abs(fused.item() - plain.item()) <= 0.02 * plain.item()


def test_the_packed_kernel_is_taken_only_where_it_computes_the_formula() -> None:
    cpu, mps, cuda = torch.device("cpu"), torch.device("mps"), torch.device("cuda")
    assert has_packed_kernel(cpu, torch.float32, 40) and has_packed_kernel(cpu, torch.bfloat16, 48)
    assert has_packed_kernel(mps, torch.bfloat16, 32) and not has_packed_kernel(cuda, torch.bfloat16, 32)
    assert not has_packed_kernel(cpu, torch.bfloat16, 40)  # 16-bit kernel: input widths in blocks of 16
    linear = torch.nn.Linear(40, 24)
    layer = Int8Linear.from_linear(linear, torch.bfloat16, has_packed_kernel(cpu, torch.bfloat16, 40))
    x = torch.randn(3, 40, generator=GEN(8)).bfloat16()
    exact = (x.double() @ layer.q.double().t()) * layer.scale.double() + layer.bias.double()
    assert not layer.packed_kernel and ((layer(x).double() - exact).abs() <= 1e-2 * exact.abs().max()).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_path_is_the_reference_product_on_the_gpu() -> None:
    linear = torch.nn.Linear(40, 48).cuda()
    packed = has_packed_kernel(torch.device("cuda"), torch.bfloat16, 40)
    layer = Int8Linear.from_linear(linear, torch.bfloat16, packed)
    x = torch.randn(4, 40, generator=GEN(6)).cuda().bfloat16()
    exact = (x.double() @ layer.q.double().t()) * layer.scale.double() + layer.bias.double()
    y = layer(x)
    assert y.device.type == "cuda" and not layer.packed_kernel
    assert ((y.double() - exact).abs() <= 1e-2 * exact.abs().max()).all()
    model = quantize_int8(shrunk_model("demo").cuda(), torch.bfloat16)
    assert all(not m.packed_kernel for m in model.modules() if isinstance(m, Int8Linear))
    logits, _ = model(torch.randint(0, VOCAB, (1, 8), generator=GEN(7)).cuda())
    assert torch.isfinite(logits).all()
