"""Attention: probabilities, causality, scaling, heads, backends and grouped-query attention."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import PRESETS, VOCAB, shrunk_config, shrunk_model

from minigpt.model.attention import CausalSelfAttention, math_attention
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model

BACKENDS = ("math", "sdpa", "online")


def _tokens(B: int = 2, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("preset", ["tiny", "modern"])
def test_probabilities_sum_to_one_and_the_future_gets_exactly_zero(preset):
    model = shrunk_model(preset)
    probs = model.attention_probs(_tokens())
    assert len(probs) == model.config.n_layer
    T = 12
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    for p in probs:
        assert p.shape == (2, model.config.n_head, T, T)
        torch.testing.assert_close(p.sum(-1), torch.ones(2, model.config.n_head, T))
        assert (p[..., future] == 0).all()
        assert (p[..., ~future] > 0).all()
    assert all(b.attn.probs is None and not b.attn.record_probs for b in model.transformer.h)


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_later_tokens_leaves_earlier_logits_unchanged(backend):
    model = shrunk_model("tiny", attention=backend)
    idx = _tokens(T=12)
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_at_i_has_exactly_zero_gradient_wrt_inputs_after_i(backend):
    cfg = shrunk_config("modern", attention=backend, online_block_size=5)
    model = build_model(cfg)
    x = torch.randn(1, 10, cfg.n_embd, requires_grad=True)
    y = x
    for block in model.transformer.h:
        y = block(y)
    i = 4
    y[0, i].sum().backward()
    assert (x.grad[0, i + 1 :] == 0).all()
    assert (x.grad[0, : i + 1].abs().sum(-1) > 0).all()


def _score_difference_variance(D: int, attn_scale: str, n: int = 20000) -> float:
    """Var(s_20 - s_21) of the attention module's own scores, for unit-variance q and k of head size D.

    One head, C = D, with q = x and k = x with its channels rotated by one (W_Q = I, W_K a cyclic shift, no
    bias, so no score is a token's squared norm): the third query's scores are x_2·roll(x_j) times the
    module's scale, and its recorded probabilities give them back up to a constant: log p_20 - log p_21 =
    s_20 - s_21, whose variance is 2·D·scale^2 for independent unit-variance x.
    """
    cfg = ModelConfig(n_layer=1, n_head=1, n_kv_head=None, n_embd=D, vocab_size=VOCAB, bias=False,
                      attention="sdpa", attn_scale=attn_scale)
    attn = CausalSelfAttention(cfg, 0)
    with torch.no_grad():
        attn.c_attn.weight.zero_()
        attn.c_attn.weight[:D].copy_(torch.eye(D))  # q = x
        attn.c_attn.weight[D : 2 * D].copy_(torch.eye(D).roll(1, dims=0))  # k = x with channels rotated
    attn.record_probs = True
    attn(torch.randn(n, 3, D, generator=torch.Generator().manual_seed(D)))  # (B=n, T=3, C=D)
    log_p = attn.probs[:, 0, 2].log()  # (n, 3): the third query's row
    return (log_p[:, 0] - log_p[:, 1]).var().item()


@pytest.mark.parametrize("D", [16, 64, 256])
def test_the_modules_scale_keeps_the_score_variance_at_one_whatever_the_head_size(D):
    """Two independent scores of variance 1 differ with variance 2; without the scale, 2·D (checked up to
    D = 64: at 256 some unscaled probabilities underflow float32, log 0). With 20000 rows the estimate's
    relative error is ~2% (products of Gaussians have heavy tails), so ±10% is 5 sigma."""
    assert 1.8 < _score_difference_variance(D, "sqrt") < 2.2
    if D <= 64:
        assert 0.9 * 2 * D < _score_difference_variance(D, "none") < 1.1 * 2 * D


def _single_head(x, wq, wk, wv):
    """One causal attention head written out: (T, C) -> (T, D)."""
    q, k, v = x @ wq.T, x @ wk.T, x @ wv.T
    scores = q @ k.T / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv_head", [None, 2, 1])
def test_multi_head_equals_independent_heads_on_sliced_weights(backend, n_kv_head):
    cfg = shrunk_config("tiny", attention=backend, n_kv_head=n_kv_head, online_block_size=3)
    attn = CausalSelfAttention(cfg, layer_idx=0).eval()
    x = torch.randn(1, 9, cfg.n_embd)
    H, H_kv, D, C = cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.n_embd
    W, b = attn.c_attn.weight, attn.c_attn.bias
    assert b is not None
    heads = []
    for h in range(H):
        g = h // (H // H_kv)  # the key/value head this query head shares
        rows_q = slice(h * D, (h + 1) * D)
        rows_k = slice(C + g * D, C + (g + 1) * D)
        rows_v = slice(C + H_kv * D + g * D, C + H_kv * D + (g + 1) * D)
        xb = torch.cat((x[0], torch.ones(9, 1)), dim=1)  # fold the bias in as a constant input
        wq, wk, wv = (torch.cat((W[r], b[r].unsqueeze(1)), dim=1) for r in (rows_q, rows_k, rows_v))
        heads.append(_single_head(xb, wq, wk, wv))
    expected = attn.c_proj(torch.cat(heads, dim=-1))  # concatenate, then W_O
    torch.testing.assert_close(attn(x)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_math_and_sdpa_agree_for_every_preset(preset):
    math_model = shrunk_model(preset, attention="math")
    sdpa_model = shrunk_model(preset, attention="sdpa")
    sdpa_model.load_state_dict(math_model.state_dict())
    idx = _tokens()
    a, loss_a = math_model(idx, idx)
    b, loss_b = sdpa_model(idx, idx)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_a, loss_b, atol=1e-5, rtol=1e-5)


def test_gqa_with_as_many_kv_heads_as_query_heads_is_plain_multi_head():
    mha = shrunk_model("tiny", n_kv_head=None)
    gqa = shrunk_model("tiny", n_kv_head=4)
    gqa.load_state_dict(mha.state_dict())
    idx = _tokens()
    torch.testing.assert_close(gqa(idx)[0], mha(idx)[0], atol=0, rtol=0)


def test_gqa_equals_multi_head_with_key_value_heads_repeated_per_group():
    gqa = shrunk_model("modern", n_kv_head=2)  # 4 query heads, 2 key/value heads
    mha = shrunk_model("modern", n_kv_head=None)
    C, D = gqa.config.n_embd, gqa.config.head_dim
    state = gqa.state_dict()
    for i in range(gqa.config.n_layer):
        w = state[f"transformer.h.{i}.attn.c_attn.weight"]  # ((4 + 2·2)·D, C)
        q, k, v = w[:C], w[C : C + 2 * D], w[C + 2 * D :]
        # query heads 0,1 share kv head 0 and 2,3 share kv head 1: repeat each kv head twice
        k_full = k.view(2, D, C).repeat_interleave(2, dim=0).reshape(4 * D, C)
        v_full = v.view(2, D, C).repeat_interleave(2, dim=0).reshape(4 * D, C)
        state[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat((q, k_full, v_full))
    mha.load_state_dict(state)
    idx = _tokens()
    torch.testing.assert_close(gqa(idx)[0], mha(idx)[0], atol=1e-5, rtol=1e-5)


def test_huge_scores_and_logits_stay_finite():
    q = torch.full((1, 1, 4, 8), 40.0)  # q·k/√8 = 40·40·8/√8 ≈ 4.5e3 per score
    k = torch.full((1, 1, 4, 8), 40.0)
    k[0, 0, 0] = -40.0
    y, probs = math_attention(q, k, torch.randn(1, 1, 4, 8), mask=None, is_causal=True)
    assert torch.isfinite(y).all() and torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 1, 4))
    model = shrunk_model("tiny")
    with torch.no_grad():
        model.lm_head.weight.mul_(1e6)  # logits ~1e4
    idx = _tokens()
    logits, loss = model(idx, idx)
    assert logits.abs().max() > 1e4 and torch.isfinite(loss)
