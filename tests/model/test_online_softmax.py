"""Online softmax and the `online` attention backend, against torch.softmax and the math backend."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import PRESETS, VOCAB, shrunk_model

from minigpt.model.attention import math_attention
from minigpt.model.online_softmax import online_attention, online_softmax

INF = float("-inf")


def _adversarial_rows() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rising = torch.arange(37, dtype=torch.float32) * 300  # every block brings a new max: rescaling each time
    one_finite = torch.full((37,), INF)
    one_finite[29] = -5.0  # all -inf but one, the finite one in a late block
    masked_first = torch.randn(37, generator=g)
    masked_first[:20] = INF  # whole leading blocks see nothing but -inf
    return {
        "span_1e4": torch.randn(4, 37, generator=g) * 1e4,
        "rising": rising,
        "falling": rising.flip(0),
        "one_finite": one_finite,
        "masked_first": masked_first,
        "ties": torch.full((3, 37), 7.0),
        "single": torch.tensor([[3.0], [-1e4]]),
        "very_negative": torch.randn(2, 37, generator=g) - 1e4,
        "tiny_spread": 1e-7 * torch.randn(2, 37, generator=g),
    }


@pytest.mark.parametrize("block_size", [1, 8, 36, 37, 100])
@pytest.mark.parametrize("case", list(_adversarial_rows()))
def test_online_softmax_equals_torch_softmax(case, block_size):
    x = _adversarial_rows()[case]
    expected = torch.softmax(x.double(), dim=-1).float()
    got = online_softmax(x, block_size=block_size)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_online_softmax_of_an_all_masked_row_is_nan_like_torch():
    x = torch.full((1, 10), INF)
    assert torch.isnan(online_softmax(x, block_size=3)).all() and torch.isnan(torch.softmax(x, -1)).all()


@pytest.mark.parametrize("block_size", [1, 5, 64])  # 64 > T: a single block
@pytest.mark.parametrize("preset", PRESETS)
def test_online_backend_equals_math_for_every_preset(preset, block_size):
    math_model = shrunk_model(preset, attention="math")
    online_model = shrunk_model(preset, attention="online", online_block_size=block_size)
    online_model.load_state_dict(math_model.state_dict())
    idx = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(0))
    expected, _ = math_model(idx)
    torch.testing.assert_close(online_model(idx)[0], expected, atol=1e-5, rtol=1e-5)
    # and with a cache: prefill 6 tokens, then decode the rest one at a time
    cache = online_model.new_kv_cache(2)
    steps = [online_model(idx[:, :6], kv_cache=cache)[0]]
    steps += [online_model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(6, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_online_attention_with_gqa_and_a_padding_mask_equals_math():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g)  # (B, H, T, D): the last 6 of S = 11 positions
    k, v = torch.randn(2, 2, 11, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g)  # H_kv = 2
    mask = torch.ones(2, 1, 6, 11, dtype=torch.bool).tril(diagonal=5)
    mask[1, :, :, :3] = False  # row 1 is left-padded by 3 slots
    expected, _ = math_attention(q, k, v, mask, is_causal=False)
    for block_size in (1, 4, 11, 50):
        got = online_attention(q, k, v, mask=mask, block_size=block_size)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        causal = online_attention(q, k, v, is_causal=True, block_size=block_size)
        expected_causal, _ = math_attention(q, k, v, None, is_causal=True)
        torch.testing.assert_close(causal, expected_causal, atol=1e-5, rtol=1e-5)


def _op_input_shapes(fn) -> list[tuple[int, ...]]:
    """The shape of every tensor any op reads while fn() runs its forward and backward pass, as torch's
    profiler records them: intermediates that are never saved for backward included."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [tuple(s) for e in prof.events() for s in e.input_shapes if isinstance(s, list) and s]


def test_online_attention_never_holds_the_full_score_matrix():
    """Nothing that the forward or the backward pass computes is as large as the (B, H, T, S) scores; the
    largest is a value-sized (B, H, T, D) accumulator, and the math backend's (T, S) matrix is seen."""
    B, H, T, D, block = 1, 2, 64, 8, 8
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    math_shapes = _op_input_shapes(lambda: math_attention(q, k, v, None, is_causal=True)[0].sum().backward())
    assert (B, H, T, T) in math_shapes  # the check can see a (T, S) matrix ...
    online_shapes = _op_input_shapes(
        lambda: online_attention(q, k, v, is_causal=True, block_size=block).sum().backward())
    assert len(online_shapes) > 100  # (every block's ops, forward and backward)
    assert max(math.prod(s) for s in online_shapes) == B * H * T * D  # ... and online computes none


def test_training_with_online_attention_lowers_the_loss_like_math():
    idx = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(0))
    x, y = idx[:, :-1], idx[:, 1:]
    losses = {}
    state = shrunk_model("modern").state_dict()
    for backend in ("math", "online"):
        model = shrunk_model("modern", attention=backend, online_block_size=5).train()
        model.load_state_dict(state)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[backend] = []
        for _ in range(10):
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[backend].append(loss.item())
    assert losses["online"][-1] < 0.8 * losses["online"][0]
    assert losses["online"] == pytest.approx(losses["math"], abs=1e-3)
