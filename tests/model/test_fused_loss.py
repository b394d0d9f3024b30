"""The fused head + chunked loss under autocast (model/chunked_loss.py) against the plain path it replaces.

Tolerance, and why: bfloat16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3), float16 11 (2^-12). Both
paths round the same operands to the 16-bit type once each (x and W before the logits matmul, the logits it
returns, dlogits before the two gradient matmuls) and sum in float32, so both land a few roundoffs from the
exact (float64) gradient. The fused path must be *no less accurate than the plain path* (its relative error
at most 1.25x the plain path's: the two round in different orders, never by more than that here), and within
8 roundoffs absolutely. Shapes are tiny: a CPU without bf16 units emulates bf16 matmuls, about 100x slower.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from model_helpers import tiny_config
from torch.utils._python_dispatch import TorchDispatchMode

from minigpt.model.chunked_loss import LinearCrossEntropy, linear_cross_entropy
from minigpt.model.factory import build_model

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-12}


def _data(n: int = 300, c: int = 32, v: int = 211, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g).requires_grad_()
    w = (torch.randn(v, c, generator=g) * 0.5).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[:7] = -1  # ignored positions
    return x, w, t


def _rel(a: torch.Tensor, exact: torch.Tensor) -> float:
    return ((a.double() - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_loss_under_cpu_autocast_is_as_accurate_as_the_plain_loss(dtype: torch.dtype) -> None:
    x, w, t = _data()
    exact = F.cross_entropy(x.double() @ w.double().t(), t, ignore_index=-1)  # float64 truth
    exact_grads = torch.autograd.grad(exact, (x, w))
    with torch.autocast("cpu", dtype=dtype):
        plain = F.cross_entropy(x @ w.t(), t, ignore_index=-1)  # the (N, V) logits in `dtype`
        fused = linear_cross_entropy(x, w, t, chunk_rows=64)  # uneven chunks: 300 = 4 x 64 + 44
    assert fused.dtype == torch.float32
    plain_grads = torch.autograd.grad(plain, (x, w))
    fused_grads = torch.autograd.grad(fused, (x, w))
    eps = UNIT_ROUNDOFF[dtype]
    assert abs(fused.item() - exact.item()) <= 1.25 * abs(plain.item() - exact.item()) + eps
    for name, f, p, e in zip(("x", "W"), fused_grads, plain_grads, exact_grads, strict=True):
        assert f.dtype == torch.float32, name
        assert _rel(f, e) <= 1.25 * _rel(p, e), name
        assert _rel(f, e) <= 8 * eps, name


def test_fused_float16_gradients_do_not_underflow_at_many_tokens() -> None:
    # (softmax - onehot) / N at N = 16k tokens is ~1e-6, below float16's smallest normal number (6e-5):
    # narrowing after dividing would lose most digits. The fused path narrows first and divides in float32.
    x, w, t = _data(n=16384, c=8, v=64, seed=1)
    exact = F.cross_entropy(x.double() @ w.double().t(), t, ignore_index=-1)
    exact_grads = torch.autograd.grad(exact, (x, w))
    with torch.autocast("cpu", dtype=torch.float16):
        fused = linear_cross_entropy(x, w, t, chunk_rows=4096)
    for name, f, e in zip(("x", "W"), torch.autograd.grad(fused, (x, w)), exact_grads, strict=True):
        assert _rel(f, e) <= 8 * UNIT_ROUNDOFF[torch.float16], name


class _Recorder(TorchDispatchMode):
    """Records every aten op's name, input dtypes and the largest output it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[torch.dtype], int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        size = max((o.numel() for o in outs if isinstance(o, torch.Tensor)), default=0)
        self.ops.append((str(func.overloadpacket.__name__), dtypes, size))
        return out


def test_under_autocast_the_matmuls_run_in_bf16_and_no_full_logits_exist() -> None:
    x, w, t = _data()
    with torch.autocast("cpu", dtype=torch.bfloat16), _Recorder() as rec:
        loss = linear_cross_entropy(x, w, t, chunk_rows=64)
        loss.backward()
    matmuls = [dtypes for name, dtypes, _ in rec.ops if name in ("mm", "addmm")]
    assert len(matmuls) == 3 * 5  # logits, dx, dW per chunk
    assert all(d == [torch.bfloat16, torch.bfloat16] for d in matmuls), matmuls
    n, v = t.numel(), w.shape[0]
    assert max(size for _, _, size in rec.ops) < n * v  # the (N, V) logits never exist, not even in bf16


def _tiny(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=61, **kw)
    model = build_model(cfg)
    with torch.no_grad():  # larger weights than GPT-2's init, so that every gradient is far from zero
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("tie_weights", [True, False])
def test_model_training_forward_under_bf16_autocast_matches_the_plain_one(tie_weights: bool) -> None:
    model = _tiny(tie_weights=tie_weights)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 61, (3, 16), generator=g), torch.randint(0, 61, (3, 16), generator=g)
    y[0, :4] = -1
    exact_model = copy.deepcopy(model).double()
    exact_model(x, y)[1].backward()
    runs = {}
    for name, kwargs in (("plain", {}), ("fused", {"return_logits": False})):
        m = copy.deepcopy(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = m(x, y, **kwargs)
        assert (logits is None) == (name == "fused")
        loss.backward()
        runs[name] = (loss.item(), dict(m.named_parameters()))
    eps = UNIT_ROUNDOFF[torch.bfloat16]
    for pname, p in exact_model.named_parameters():
        err = {k: _rel(params[pname].grad, p.grad) for k, (_, params) in runs.items()}
        # the blocks' gradients pass through the fused head's dx: the same bound holds for every weight
        assert err["fused"] <= 1.25 * err["plain"] + eps, (pname, err)


def test_return_logits_false_without_targets_is_refused() -> None:
    model = _tiny()
    with pytest.raises(ValueError, match="pass targets"):
        model(torch.zeros(1, 4, dtype=torch.long), return_logits=False)


def test_the_function_computes_in_the_dtype_it_is_given() -> None:
    x, w, t = _data(n=40)
    with _Recorder() as rec:
        LinearCrossEntropy.apply(x, w, t, 16, False, torch.bfloat16)
    assert all(d == [torch.bfloat16, torch.bfloat16] for name, d, _ in rec.ops if name == "mm")


# ------------------------------------------------------------------------------------------------ CUDA
# Skipped without a GPU; scripts/device_check.sh runs them (`pytest -m cuda`). The truth is computed on the
# CPU in float64 from the same tensors.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fused_loss_under_autocast_is_as_accurate_as_the_plain_loss(dtype: torch.dtype) -> None:
    x, w, t = _data(n=2048, c=64, v=1000)
    exact = F.cross_entropy(x.double() @ w.double().t(), t, ignore_index=-1)
    exact_grads = torch.autograd.grad(exact, (x, w))
    xc, wc = (a.detach().cuda().requires_grad_() for a in (x, w))
    tc = t.cuda()
    with torch.autocast("cuda", dtype=dtype):
        plain = F.cross_entropy(xc @ wc.t(), tc, ignore_index=-1)
        fused = linear_cross_entropy(xc, wc, tc, chunk_rows=500)
    plain_grads = torch.autograd.grad(plain, (xc, wc))
    fused_grads = torch.autograd.grad(fused, (xc, wc))
    eps = UNIT_ROUNDOFF[dtype]
    assert abs(fused.item() - exact.item()) <= 1.25 * abs(plain.item() - exact.item()) + eps
    for name, f, p, e in zip(("x", "W"), fused_grads, plain_grads, exact_grads, strict=True):
        assert _rel(f.cpu(), e) <= 1.25 * _rel(p.cpu(), e) + eps, name
        assert _rel(f.cpu(), e) <= 8 * eps, name


def _cuda_model_step(model, x, y, dtype, fused: bool, scaler: torch.amp.GradScaler) -> torch.Tensor:
    with torch.autocast("cuda", dtype=dtype):
        _, loss = model(x, y, return_logits=False) if fused else model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.0))  # the true gradients, as the trainer clips
    return loss


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_model_fused_training_forward_under_autocast_with_the_trainers_scaler(dtype) -> None:
    # float16 runs with GradScaler (as Runtime.grad_scaler gives it): the fused gradients, computed in the
    # forward pass, are scaled by backward like any other and come back unscaled and finite
    model = _tiny()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 61, (8, 16), generator=g), torch.randint(0, 61, (8, 16), generator=g)
    exact_model = copy.deepcopy(model).double()
    exact_model(x, y)[1].backward()
    errors = {}
    for fused in (False, True):
        m = copy.deepcopy(model).cuda()
        scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
        loss = _cuda_model_step(m, x.cuda(), y.cuda(), dtype, fused, scaler)
        assert torch.isfinite(loss)
        grads = dict(m.named_parameters())
        errors[fused] = {n: _rel(grads[n].grad.cpu(), p.grad) for n, p in exact_model.named_parameters()}
    for name, fused_err in errors[True].items():
        plain_err = errors[False][name]
        assert fused_err <= 1.25 * plain_err + UNIT_ROUNDOFF[dtype], (name, fused_err, plain_err)
