"""The speed paths give the answers of the simple paths they sit beside:

- the chunked, head-fused cross-entropy (model/chunked_loss.py) against F.cross_entropy on full logits,
- GPT's training forward with return_logits=False against the plain forward (loss and gradients),
- `GPT.prepare_for_inference` (weights laid out (in, out) in memory, or packed for oneDNN) against the model
  as trained.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from model_helpers import tiny_config

from minigpt.model.chunked_loss import linear_cross_entropy
from minigpt.model.factory import build_model


def _data(n: int = 37, c: int = 16, v: int = 53, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g) * 2).requires_grad_()
    w = torch.randn(v, c, generator=g).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[[0, 5, 6]] = -1  # ignored positions
    return x, w, t


@pytest.mark.parametrize("chunk_rows", [1, 8, 36, 1000])  # one row, uneven chunks, one chunk larger than N
def test_chunked_loss_equals_cross_entropy_and_its_gradients(chunk_rows: int) -> None:
    x, w, t = _data()
    expected = F.cross_entropy(x.double() @ w.double().t(), t, ignore_index=-1)  # float64 reference
    gx, gw = torch.autograd.grad(expected, (x, w))
    loss = linear_cross_entropy(x, w, t, chunk_rows)
    torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=1e-5)
    got_x, got_w = torch.autograd.grad(loss * 3.0, (x, w))  # the incoming gradient scales both
    torch.testing.assert_close(got_x, 3 * gx, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_w, 3 * gw, atol=1e-5, rtol=1e-4)


def test_chunked_loss_without_autograd_is_just_the_loss() -> None:
    x, w, t = _data()
    with torch.no_grad():
        loss = linear_cross_entropy(x, w, t, 8)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(x @ w.t(), t, ignore_index=-1), atol=1e-5, rtol=1e-5)


def _tiny(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=61, **kw)
    return build_model(cfg)


@pytest.mark.parametrize("tie_weights", [True, False])
def test_training_forward_without_logits_matches_the_plain_one(tie_weights: bool) -> None:
    plain = _tiny(tie_weights=tie_weights)
    fused = copy.deepcopy(plain)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 61, (3, 16), generator=g), torch.randint(0, 61, (3, 16), generator=g)
    y[0, :4] = -1
    _, loss_plain = plain(x, y)
    logits, loss_fused = fused(x, y, return_logits=False)
    assert logits is None
    torch.testing.assert_close(loss_fused, loss_plain, atol=1e-5, rtol=1e-5)
    loss_plain.backward()
    loss_fused.backward()
    for (name, a), b in zip(plain.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_prepare_for_inference_changes_the_layout_and_nothing_else() -> None:
    model = _tiny()
    ref = copy.deepcopy(model).eval()
    idx = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3))
    prepared = model.prepare_for_inference("in_out")
    assert prepared is model and not model.training
    assert list(model.state_dict()) == list(ref.state_dict())  # same names: checkpoints load as before
    for (name, w), (_, w_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert w.shape == w_ref.shape and torch.equal(w, w_ref), name  # same values, exactly
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 * 2 + 1  # c_attn, c_proj, c_fc, c_proj per block, and lm_head
    for m in linears:
        assert m.weight.stride() == (1, m.weight.shape[0])  # (out, in) with (in, out) memory
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], ref(idx)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_model_computes_what_the_trained_one_does(dtype: torch.dtype) -> None:
    """Logits of a whole window and the fused loss head (which reads the head's matrix, unpacked)."""
    model = _tiny().to(dtype)
    ref = copy.deepcopy(model).eval()
    model.prepare_for_inference("packed", rows=2)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 61, (2, 9), generator=g), torch.randint(0, 61, (2, 9), generator=g)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], ref(x)[0], atol=tol, rtol=tol)
        fused, plain = model(x, y, return_logits=False)[1], ref(x, y)[1]  # the fused loss is float32
        torch.testing.assert_close(fused, plain.float(), atol=tol, rtol=tol)


def test_cached_greedy_decoding_after_prepare_equals_the_naive_path_on_the_trained_layout() -> None:
    from minigpt.sampling.decode import generate
    from minigpt.sampling.params import SamplingParams

    model = _tiny().eval()
    fast = copy.deepcopy(model).prepare_for_inference("in_out")
    runs = [generate(m, [[4, 8, 15, 16]], max_new_tokens=12, params=SamplingParams(temperature=0.0),
                     generator=torch.Generator().manual_seed(0), use_cache=c, keep_logits=True)
            for m, c in ((fast, True), (model, False))]
    assert runs[0].tokens == runs[1].tokens
    for a, b in zip(runs[0].logits, runs[1].logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_gradients_after_prepare_for_inference_are_still_right() -> None:
    model = _tiny()
    other = copy.deepcopy(model).prepare_for_inference("in_out").train()
    x = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(4))
    for m in (model, other):
        m(x, x)[1].backward()
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bf16_cached_decoding_matches_uncached_at_bf16_tolerance() -> None:
    from minigpt.sampling.decode import generate
    from minigpt.sampling.params import SamplingParams

    model = _tiny().eval().to(torch.bfloat16)
    runs = [generate(model, [[4, 8, 15, 16]], max_new_tokens=8, params=SamplingParams(temperature=0.0),
                     generator=torch.Generator().manual_seed(0), use_cache=c, keep_logits=True)
            for c in (True, False)]
    cached, uncached = runs
    assert cached.tokens == uncached.tokens
    for a, b in zip(cached.logits, uncached.logits, strict=True):
        # bf16 keeps 8 bits of mantissa: differences of a few 1e-2 on O(1) logits are rounding, not bugs
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)
