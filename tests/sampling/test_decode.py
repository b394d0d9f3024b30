"""KV-cached generation against independent computations: the full forward, the naive reference,
each prompt alone, and a step-by-step simulation of the sliding window."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_config
from omegaconf import OmegaConf

from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate, prefill
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import window_length

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
VOCAB, BLOCK = 64, 16
GREEDY, SAMPLED = SamplingParams(0.0), SamplingParams(1.0, top_k=20, top_p=0.9)
ATOL = 2e-5  # fp32: cached and full attention sum the same terms in a different order


def _sharpen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Re-draw the matrices with a larger std: GPT-2's init gives near-uniform logits, in which a
    wrong context would hardly show. Sharp random weights make every token depend on its context."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def tiny(seed: int = 0, **overrides) -> torch.nn.Module:
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=BLOCK, vocab_size=VOCAB, dropout=0.0)
    cfg.update(overrides)
    return _sharpen(build_model(tiny_config(**cfg)), seed)


def preset(name: str) -> torch.nn.Module:
    """A model preset shrunk to test size, keeping its architecture (and GQA if it has it)."""
    cfg = OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml"))
    gqa = cfg.get("n_kv_head") not in (None, cfg["n_head"])
    cfg.update(n_layer=2, n_head=4, n_kv_head=2 if gqa else None, n_embd=32, block_size=BLOCK,
               vocab_size=VOCAB, dropout=0.0)  # fmt: skip
    return _sharpen(build_model(tiny_config(**cfg)), 1)


def run(model, prompts, n, params=GREEDY, use_cache=True, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    return generate(model, prompts, max_new_tokens=n, params=params, generator=g, use_cache=use_cache,
                    keep_logits=True, **kw)  # fmt: skip


def assert_same(a, b):
    assert a.tokens == b.tokens
    assert len(a.logits) == len(b.logits)
    for x, y in zip(a.logits, b.logits, strict=True):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=0)


def check_against_full_forward(model, prompt, n):
    """Each step's cached logits == the full uncached forward over prompt + tokens so far."""
    res = run(model, [prompt], n)
    seq = torch.tensor([prompt + res.tokens[0]])
    with torch.no_grad():
        full, _ = model(seq)  # (1, T, V): every position at once, no cache
    assert len(prompt) + n <= BLOCK and len(res.logits) == n
    for i, step_logits in enumerate(res.logits):
        torch.testing.assert_close(step_logits[0], full[0, len(prompt) - 1 + i], atol=ATOL, rtol=0)
        assert res.tokens[0][i] == int(full[0, len(prompt) - 1 + i].argmax())  # greedy


@pytest.mark.parametrize("name", PRESETS)
def test_presets_cached_equals_full_forward_and_naive(name):
    model = preset(name)
    check_against_full_forward(model, [3, 1, 4, 1, 5], BLOCK - 5)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [7]]
    for params in (GREEDY, SAMPLED):  # past block_size, batched, seeded: cached == naive
        assert_same(run(model, prompts, 30, params), run(model, prompts, 30, params, use_cache=False))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_each_position_scheme_and_norm_placement(pos, placement):
    model = tiny(pos_encoding=pos, norm_placement=placement)
    check_against_full_forward(model, [5, 6, 7], BLOCK - 3)
    prompts = [[1, 2], [3, 4, 5, 6, 7, 8]]
    assert_same(run(model, prompts, 28, SAMPLED), run(model, prompts, 28, SAMPLED, use_cache=False))


@pytest.mark.parametrize(
    "overrides",
    [dict(n_kv_head=2, pos_encoding="rope"), dict(n_kv_head=1, norm="rmsnorm", activation="swiglu"),
     dict(attention="math"), dict(attention="online", online_block_size=3, n_kv_head=2)],
)  # fmt: skip
def test_gqa_and_attention_backends(overrides):
    model = tiny(**overrides)
    check_against_full_forward(model, [9, 8, 7, 6], BLOCK - 4)
    prompts = [[1], [2, 3, 4, 5, 6]]
    assert_same(run(model, prompts, 24, SAMPLED), run(model, prompts, 24, SAMPLED, use_cache=False))


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_batched_prompts_of_different_lengths_equal_each_alone(attention):
    model = tiny(attention=attention, pos_encoding="learned")
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [13], [14, 15, 16, 17, 18]]
    batched = run(model, prompts, 24)  # 24 new tokens: every row also overflows, at different steps
    for b, prompt in enumerate(prompts):
        alone = run(model, [prompt], 24)
        assert batched.tokens[b] == alone.tokens[0]
        for x, y in zip(batched.logits, alone.logits, strict=True):
            assert torch.isfinite(x).all()
            torch.testing.assert_close(x[b], y[0], atol=ATOL, rtol=0)


def _simulated_windows(prompt_len: int, n_new: int, keep: int) -> list[int]:
    """The window rule as a process: the context grows by one per token and drops to `keep` when it
    would pass the block size; a long prompt is first cut to where that process would be."""
    lengths, w = [], 0
    for n in range(1, prompt_len + n_new):
        w = w + 1 if w < BLOCK else keep
        if n >= prompt_len:
            lengths.append(w)
    return lengths


@pytest.mark.parametrize("keep", [1, 5, BLOCK // 2, BLOCK])
def test_window_rule_formula_equals_the_simulated_process(keep):
    for prompt_len in (1, 7, BLOCK, BLOCK + 3, 3 * BLOCK):
        want = _simulated_windows(prompt_len, 40, keep)
        got = [window_length(n, BLOCK, keep) for n in range(prompt_len, prompt_len + 40)]
        assert got == want


@pytest.mark.parametrize("keep", [1, 6, BLOCK])
def test_overflow_continues_and_matches_naive(keep):
    model = tiny(pos_encoding="rope", seed=3)
    prompts = [[1, 2, 3, 4], list(range(1, 40))]  # the second prompt is longer than the context already
    cached = run(model, prompts, 3 * BLOCK, SAMPLED, keep=keep)
    assert len(cached.tokens[0]) == 3 * BLOCK  # well past block_size
    assert_same(cached, run(model, prompts, 3 * BLOCK, SAMPLED, use_cache=False, keep=keep))
    drops = sum(window_length(n + 1, BLOCK, keep) != window_length(n, BLOCK, keep) + 1
                for n in range(4, 4 + 3 * BLOCK - 1))  # fmt: skip
    assert cached.stats.reprefills >= drops > 0


def test_overflow_window_is_what_the_model_sees():
    """After a rebuild the next logits are the full forward of exactly the kept window."""
    model = tiny(pos_encoding="sinusoidal", seed=4)
    prompt = [5, 4, 3]
    res = run(model, [prompt], 2 * BLOCK, keep=BLOCK // 2)
    seq = prompt + res.tokens[0]
    for i, step_logits in enumerate(res.logits):
        n = len(prompt) + i  # tokens before this step's prediction
        window = seq[n - window_length(n, BLOCK, BLOCK // 2) : n]
        with torch.no_grad():
            full, _ = model(torch.tensor([window]))
        torch.testing.assert_close(step_logits[0], full[0, -1], atol=ATOL, rtol=0)


def test_stop_token_ends_each_row_separately():
    model = tiny(seed=5)
    prompts = [[1, 2, 3], [7, 7]]
    free = run(model, prompts, 12)
    stop = free.tokens[0][4]  # a token row 0 produces at step 4
    stopped = run(model, prompts, 12, stop_ids=[stop])
    for b in range(2):
        want = free.tokens[b][: free.tokens[b].index(stop)] if stop in free.tokens[b] else free.tokens[b]
        assert stopped.tokens[b] == want
    assert stopped.stats.new_tokens == sum(len(t) for t in stopped.tokens)


def test_stop_fn_and_zero_new_tokens():
    model = tiny(seed=6)
    res = run(model, [[1, 2]], 10, stop_fn=lambda row, ids: len(ids) == 3)
    assert len(res.tokens[0]) == 3
    assert run(model, [[1, 2]], 0).tokens == [[]]


BF16_ATOL = 0.15  # bf16 keeps 8 bits of mantissa; over 2 layers these logits (|max| ~3-4) move by <= ~0.08


def test_bf16_cached_decoding_follows_the_fp32_model():
    """bf16 weights and cache: at every step the logits are within bf16's error of the fp32 model's full
    forward over the same context, so greedy decoding picks fp32's argmax wherever that is clear."""
    model = tiny(seed=7)
    prompt, n = [1, 2, 3], BLOCK - 3
    got = run(copy.deepcopy(model).to(torch.bfloat16), [prompt], n)
    assert got.logits[0].dtype == torch.bfloat16 and len(got.logits) == n
    with torch.no_grad():
        full, _ = model(torch.tensor([prompt + got.tokens[0]]))  # (1, T, V) fp32, no cache
    clear = 0
    for i, step_logits in enumerate(got.logits):
        want = full[0, len(prompt) - 1 + i]  # (V,)
        torch.testing.assert_close(step_logits[0].float(), want, atol=BF16_ATOL, rtol=0)
        best, second = want.topk(2).values
        if best - second > 2 * BF16_ATOL:  # no bf16 error can swap these two
            assert got.tokens[0][i] == int(want.argmax()), i
            clear += 1
    assert clear >= n // 2  # most steps are decided, so the token check above is not empty


def test_one_cache_allocation_and_only_last_position_logits():
    """Rebuilds reuse the preallocated cache, and every forward projects only its last position."""
    model = tiny(seed=8)
    caches, ptrs, calls = [], [], []
    new_cache, forward = model.new_kv_cache, model.forward

    def spy_cache(*args, **kwargs):
        caches.append(new_cache(*args, **kwargs))
        ptrs.append([t.data_ptr() for t in caches[-1].k + caches[-1].v])
        return caches[-1]

    def spy_forward(idx, *args, **kwargs):
        logits, loss = forward(idx, *args, **kwargs)
        calls.append((idx.shape, logits.shape[1], kwargs.get("kv_cache")))
        return logits, loss

    model.new_kv_cache, model.forward = spy_cache, spy_forward
    res = run(model, [[1, 2], [3, 4, 5]], 2 * BLOCK)
    assert len(caches) == 1 and res.stats.reprefills > 0
    assert [t.data_ptr() for t in caches[0].k + caches[0].v] == ptrs[0] and caches[0].max_len == BLOCK
    assert all(positions == 1 and cache is caches[0] for _, positions, cache in calls)  # (B, 1, V) each
    decode_calls = len(calls) - 1 - res.stats.reprefills  # all but the prefill and the rebuilds
    assert sum(shape[1] == 1 for shape, _, _ in calls) == decode_calls


def test_prefill_gives_each_row_the_last_logits_of_its_prompt_alone():
    model = tiny(seed=3)
    windows = [[5, 6, 7, 8, 9], [10, 11]]  # the second row left-padded
    with torch.no_grad():
        cache, last = prefill(model, windows)
        alone = [model(torch.tensor([w]))[0][0, -1] for w in windows]  # uncached, (V,) each
    assert cache.length == 5 and cache.max_len == BLOCK
    torch.testing.assert_close(last, torch.stack(alone), atol=ATOL, rtol=0)
