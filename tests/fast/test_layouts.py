"""Laying out a model (fast/layouts.py) and handing it a decode attention change how it computes, never what:
the model as trained is the reference, and the uncached naive path decodes the tokens the laid out model's
cached path must give."""

from __future__ import annotations

import copy

import pytest
import torch
from model_helpers import tiny_config

from minigpt.fast import attention as fast_attention
from minigpt.fast.attention import ONE_QUERY
from minigpt.fast.layouts import lay_out
from minigpt.fast.packed import PackedLinear
from minigpt.fast.step import DEFAULT, Plan, build_step
from minigpt.model import attention as attention_module
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

PLANS = [DEFAULT, Plan("in_out", "in_out"), Plan("out_in", "out_in", False), Plan("in_out", "in_out", False),
         Plan("packed", "packed"), Plan("in_out", "packed", False), Plan(attention="math"),
         Plan("packed", "out_in", attention="sdpa"), Plan("streamed", "streamed", attention="math")]


def _tiny(dtype: torch.dtype = torch.float32, block_size: int = 24) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=block_size, vocab_size=61))
    return model.eval().to(dtype)


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_either_plain_layout_on_either_dtype_changes_strides_and_nothing_else(dtype: torch.dtype) -> None:
    model = _tiny(dtype)
    ref = copy.deepcopy(model)
    assert lay_out(model, "in_out") is model
    assert list(model.state_dict()) == list(ref.state_dict())  # same names: checkpoints load as before
    assert len(_linears(model)) == 4 * 2 + 1  # c_attn, c_proj, c_fc, c_proj per block, and lm_head
    for m in _linears(model):
        assert m.weight.stride() == (1, m.weight.shape[0])  # (out, in) with (in, out) memory
    for (name, w), (_, w_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(w, w_ref), name
    idx = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], ref(idx)[0], atol=tol, rtol=tol)
    lay_out(model, "out_in")  # and back: nn.Linear's own layout
    assert all(m.weight.is_contiguous() for m in _linears(model))
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied throughout


def test_gradients_after_the_in_out_layout_are_still_right() -> None:
    model = _tiny().train()
    other = lay_out(copy.deepcopy(model), "in_out")
    x = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(4))
    for m in (model, other):
        m(x, x)[1].backward()
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_the_packed_layout_replaces_every_linear_and_keeps_its_matrix() -> None:
    model = _tiny()
    ref = copy.deepcopy(model)
    lay_out(model, "packed", rows=3)
    assert not _linears(model)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 2 * 4 + 1 and all(m.rows == 3 for m in packed)  # 4 per block and the head
    for name, m in model.named_modules():
        if isinstance(m, PackedLinear):
            assert torch.equal(m.weight, ref.get_submodule(name).weight), name
    assert torch.equal(model.transformer.wte.weight, ref.transformer.wte.weight)  # the lookup's own table
    with pytest.raises(ValueError, match="layout='rows'"):
        lay_out(model, "out_in", head_layout="rows")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_model_computes_what_the_trained_one_does(dtype: torch.dtype) -> None:
    """Logits of a whole window and the fused loss head (which reads the head's matrix, unpacked)."""
    model = _tiny(dtype, block_size=16)
    ref = copy.deepcopy(model)
    lay_out(model, "packed", rows=2)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 61, (2, 9), generator=g), torch.randint(0, 61, (2, 9), generator=g)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], ref(x)[0], atol=tol, rtol=tol)
        fused, plain = model(x, y, return_logits=False)[1], ref(x, y)[1]  # the fused loss is float32
        torch.testing.assert_close(fused, plain.float(), atol=tol, rtol=tol)


def test_the_head_and_the_blocks_take_their_own_layouts() -> None:
    model = lay_out(_tiny(), "in_out", head_layout="packed")
    assert isinstance(model.lm_head, PackedLinear)
    assert all(m.weight.stride() == (1, m.weight.shape[0]) for m in _linears(model))  # the blocks: in_out
    assert len(_linears(model)) == 2 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_cached_decoding_on_every_plan_equals_the_uncached_plain_path(dtype, plan: Plan) -> None:
    plain = _tiny(dtype)  # as trained: never laid out
    step = build_step(copy.deepcopy(plain), plan)
    assert torch.backends.mkldnn.enabled
    runs = [generate(m, [[4, 8, 15, 16]], max_new_tokens=30, params=SamplingParams(temperature=0.0),
                     generator=torch.Generator().manual_seed(0), use_cache=cached, keep_logits=True,
                     step=s)
            for m, cached, s in ((step.model, True, step), (plain, False, None))]
    assert torch.backends.mkldnn.enabled  # the step restores PyTorch's setting after each call
    assert runs[0].tokens == runs[1].tokens  # 30 tokens past the 24-token context: windows rebuilt
    tol = 1e-5 if dtype == torch.float32 else 5e-2  # bf16: 8 significant bits, a few roundings apart
    for a, b in zip(runs[0].logits, runs[1].logits, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def test_a_handed_decode_attention_serves_one_query_steps_only(monkeypatch) -> None:
    """A prefill (many queries) and speculative verification keep the model's own backend; a decode step of
    one query per row on the cache uses the one handed in."""
    calls = []
    math = attention_module.math_attention
    monkeypatch.setattr(fast_attention, "math_attention",  # the name the handed `math` backend calls
                        lambda q, *a, **k: calls.append(q.shape[2]) or math(q, *a, **k))
    model = _tiny()
    fast_attention.hand_attention(model, "math")
    assert model.config.attention == "sdpa"
    cache = model.new_kv_cache(1)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]), kv_cache=cache)  # prefill: sdpa
        model(torch.tensor([[6]]), kv_cache=cache)  # a decode step: math, in both layers
        model(torch.tensor([[7, 8]]), kv_cache=cache)  # two queries at once: sdpa
        model(torch.tensor([[9]]))  # one token without a cache is not a decode step: sdpa
    assert calls == [1, 1]
    fast_attention.hand_attention(model, None)
    with torch.no_grad():
        model(torch.tensor([[10]]), kv_cache=cache)
    assert calls == [1, 1]


@pytest.mark.parametrize("backend", ["sdpa", "math", "streamed"])
def test_every_one_query_attention_is_the_formula(backend: str) -> None:
    """Each candidate the model can be handed, against the attention written out in float64, with a padding
    mask and grouped key/value heads."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 8, generator=gen)  # (B, H, 1, D)
    k, v = torch.randn(2, 2, 5, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen)  # (B, H_kv, S, D)
    mask = torch.tensor([[True] * 5, [False, False, True, True, True]]).view(2, 1, 1, 5)
    kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)  # (B, H, S, D)
    scores = (q.double() @ kk.transpose(-2, -1) * 0.5).masked_fill(~mask, float("-inf"))  # scale 0.5
    expected = torch.softmax(scores, -1) @ vv  # (B, H, 1, D)
    got = ONE_QUERY[backend](q, k, v, mask, 0.5)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
