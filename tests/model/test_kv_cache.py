"""The KV-cached forward gives the same logits as the plain forward over the whole sequence."""

from __future__ import annotations

import pytest
import torch
from model_helpers import PRESETS, VOCAB, shrunk_model

BACKENDS = ("math", "sdpa", "online")
CASES = [(p, b) for p in PRESETS for b in BACKENDS] + [("modern", "sdpa-mha"), ("seed", "sdpa-rope")]
TOL = {"atol": 2e-5, "rtol": 1e-5}


def _model(preset: str, backend: str):
    overrides = {"online_block_size": 3}
    if backend == "sdpa-mha":  # the modern block without GQA
        backend, overrides["n_kv_head"] = "sdpa", None
    if backend == "sdpa-rope":  # post-norm with rotary positions
        backend, overrides["pos_encoding"] = "sdpa", "rope"
    return shrunk_model(preset, attention=backend, **overrides)


def _seq(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("preset,backend", CASES)
def test_prefill_then_decode_matches_the_uncached_forward(preset, backend):
    model = _model(preset, backend)
    idx = _seq(2, 12)
    full, _ = model(idx)
    cache = model.new_kv_cache(2)
    got = [model(idx[:, :5], kv_cache=cache)[0]]  # prefill
    got.append(model(idx[:, 5:8], kv_cache=cache)[0])  # a chunk on top of a filled cache
    for t in range(8, 12):  # one-token decode steps
        got.append(model(idx[:, t : t + 1], kv_cache=cache)[0])
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(got, dim=1), full, **TOL)


@pytest.mark.parametrize("preset,backend", CASES)
def test_left_padded_rows_match_each_row_run_alone(preset, backend):
    model = _model(preset, backend)
    long, short = _seq(1, 9, seed=1), _seq(1, 5, seed=2)
    pad = 4
    prompt = torch.cat((long, torch.cat((torch.zeros(1, pad, dtype=torch.long), short), dim=1)))  # (2, 9)
    new_tokens = _seq(2, 3, seed=3)
    cache = model.new_kv_cache(2)
    cache.set_padding(torch.tensor([0, pad]))
    logits = [model(prompt, kv_cache=cache)[0]]
    for t in range(3):
        logits.append(model(new_tokens[:, t : t + 1], kv_cache=cache)[0])
    got = torch.cat(logits, dim=1)  # (2, 12, V)
    alone_long, _ = model(torch.cat((long, new_tokens[:1]), dim=1))  # (1, 12, V)
    alone_short, _ = model(torch.cat((short, new_tokens[1:]), dim=1))  # (1, 8, V)
    torch.testing.assert_close(got[:1], alone_long, **TOL)
    torch.testing.assert_close(got[1:, pad:], alone_short, **TOL)
    assert torch.isfinite(got).all()  # padding slots produce garbage, but never NaN


def test_last_only_with_cache_and_cache_defaults():
    model = shrunk_model("modern")
    cfg = model.config
    cache = model.new_kv_cache(3)
    assert len(cache.k) == len(cache.v) == cfg.n_layer
    spare = 1  # one slot more than the cache fills (kv_cache.py says why)
    assert all(t.shape == (3, cfg.kv_heads, cfg.block_size + spare, cfg.head_dim) for t in cache.k + cache.v)
    assert len({t.data_ptr() for t in cache.k + cache.v}) == 2 * cfg.n_layer  # a buffer of its own each
    assert cache.dtype == cache.k[0].dtype == torch.float32
    idx = _seq(3, 6)
    full, _ = model(idx)
    last, _ = model(idx, kv_cache=cache, last_only=True)
    assert last.shape == (3, 1, VOCAB)
    torch.testing.assert_close(last, full[:, -1:], **TOL)
    assert model.new_kv_cache(1, max_len=8, dtype=torch.float64).max_len == 8
    with pytest.raises(ValueError, match="block_size"):
        model.new_kv_cache(1, max_len=cfg.block_size + 1)


@pytest.mark.parametrize("max_len", [4, None])  # None: block_size, where positions would run out too
def test_cache_overflow_is_an_error(max_len):
    model = shrunk_model("tiny")
    cache = model.new_kv_cache(1, max_len=max_len)
    model(_seq(1, cache.max_len), kv_cache=cache)
    with pytest.raises(RuntimeError, match="overflow"):
        model(_seq(1, 1), kv_cache=cache)
