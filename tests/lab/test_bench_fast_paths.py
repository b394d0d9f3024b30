"""The speed paths give the answers of the simple paths they sit beside:

- the chunked, head-fused cross-entropy (model/chunked_loss.py) against F.cross_entropy on full logits,
- GPT's training forward with return_logits=False against the plain forward (loss and gradients),
- bfloat16 cached decoding against the uncached path.

(The decoding layouts of minigpt/fast/ are held against the model as trained in tests/fast/test_layouts.py.)
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
