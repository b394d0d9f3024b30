"""Generation speed: minigpt's KV-cached decoding against its own naive path and Hugging Face `generate`.

Shape (issue 7): 6 layers x 384 wide x 6 heads, vocab 50304, block 1024, random weights, batch 1,
16 prompt tokens + 256 new ones, greedy. Every contender really generates all 256 tokens (the
reference gets `eos_token_id=None` and `min_new_tokens`, and random weights rarely repeat a stop
token anyway). Measured:

- tokens/s of whole `generate` calls: minigpt cached (fp32, and with bf16 weights), minigpt uncached
  (the O(T^2) reference in sampling/naive.py), HF `generate`; the ratios are the headline numbers
- per-token latency of one decode step (forward + argmax) with ~64, ~512, ~1000 tokens in the cache
- the time to prefill a 512-token prompt (last position projected only, as when sampling)
- the extra memory of one cached generation

The greedy tokens of minigpt and the reference are compared too: they run the same weights, so any
disagreement beyond a late near-tie would point at a broken mapping rather than a fast one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from minigpt.bench.reference import gpt2_like_config, reference_model
from minigpt.bench.timing import Timing, interleave, peak_memory_bytes, time_call
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

SHAPE = {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 50304, "block_size": 1024}
GREEDY = SamplingParams(temperature=0.0)


def minigpt_generate(model: GPT, prompt: list[int], new_tokens: int, use_cache: bool = True) -> list[int]:
    gen = torch.Generator(device=model.lm_head.weight.device).manual_seed(0)
    result = generate(model, [prompt], max_new_tokens=new_tokens, params=GREEDY, generator=gen,
                      use_cache=use_cache)
    return result.tokens[0]


def reference_generate(ref: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """HF greedy generation of exactly `new_tokens` tokens (no stop token, no sampling filters)."""
    out = ref.generate(
        input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=False, top_k=0, eos_token_id=None, pad_token_id=0,
        use_cache=True,
    )
    return out[0, prompt.shape[1]:].tolist()


def _minigpt_step_fn(model: GPT, prefix: torch.Tensor) -> Callable[[], None]:
    """A callable decoding one token after `prefix` (1, P): the cache is prefilled once, then each call
    rewinds it to P slots and decodes, so every timed call sees exactly P cached tokens."""
    cache = model.new_kv_cache(1)
    with torch.no_grad():
        logits, _ = model(prefix, kv_cache=cache, last_only=True)
    token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
    filled = cache.length

    @torch.no_grad()
    def step() -> None:
        cache.length = filled
        model(token, kv_cache=cache, last_only=True)[0][:, -1].argmax(dim=-1)

    return step


def _reference_step_fn(ref: torch.nn.Module, prefix: torch.Tensor) -> Callable[[], None]:
    """The same for HF: its cache grows by one per call, so positions drift by the repeat count (a few)."""
    with torch.no_grad():
        out = ref(input_ids=prefix, use_cache=True, logits_to_keep=1)
    cache = out.cache  # a transformers DynamicCache (transformers >= 5 calls it `cache`)
    token = out.logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)

    @torch.no_grad()
    def step() -> None:
        out = ref(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        out.logits[:, -1].argmax(dim=-1)

    return step


def bench_generation(device: torch.device, *, prompt_len: int = 16, new_tokens: int = 256, repeats: int = 3,
                     latency_positions: tuple[int, ...] = (64, 512, 1000), latency_repeats: int = 10,
                     prefill_len: int = 512, uncached: bool = True, bf16: bool = True) -> dict:
    torch.manual_seed(0)
    model = build_model(gpt2_like_config(**SHAPE)).to(device).eval()
    ref = reference_model(model).eval()
    gen = torch.Generator().manual_seed(1)
    prompt_t = torch.randint(0, SHAPE["vocab_size"], (1, prompt_len), generator=gen).to(device)  # (1, P)
    prompt = prompt_t[0].tolist()
    contenders: dict[str, Callable[[], object]] = {
        "minigpt cached fp32": lambda: minigpt_generate(model, prompt, new_tokens),
        "reference generate fp32": lambda: reference_generate(ref, prompt_t, new_tokens),
    }
    model_bf16 = None
    if bf16:
        model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
        contenders["minigpt cached bf16"] = lambda: minigpt_generate(model_bf16, prompt, new_tokens)
    with torch.no_grad():
        # the warm-up round: each contender's tokens are kept, minigpt's first run also measures memory
        outputs: dict[str, list[int]] = {}
        ours_fn = contenders["minigpt cached fp32"]
        peak_mem = peak_memory_bytes(lambda: outputs.__setitem__("minigpt cached fp32", ours_fn()), device)
        for name, fn in contenders.items():
            if name not in outputs:
                outputs[name] = fn()
        timings = interleave(contenders, repeats=repeats, warmup=0, device=device)
        if uncached:  # O(T^2) per token: one timed run is plenty to see the gap
            timings["minigpt uncached fp32"] = Timing.from_samples(
                [time_call(lambda: minigpt_generate(model, prompt, new_tokens, use_cache=False), device)])
    rows = {name: {"time_s": t.to_dict(), "tokens_per_s": new_tokens / t.median}
            for name, t in timings.items()}
    base = rows["minigpt cached fp32"]["tokens_per_s"]
    for row in rows.values():
        row["vs_reference"] = row["tokens_per_s"] / rows["reference generate fp32"]["tokens_per_s"]
        row["vs_minigpt_cached_fp32"] = row["tokens_per_s"] / base
    ours = outputs["minigpt cached fp32"]
    same = lambda other: sum(a == b for a, b in zip(ours, outputs[other], strict=True))
    result = {
        "shape": dict(SHAPE), "prompt_tokens": prompt_len, "new_tokens": new_tokens, "contenders": rows,
        "greedy_tokens_equal_reference": same("reference generate fp32"), "peak_mem_bytes": peak_mem,
    }
    if model_bf16 is not None:
        result["bf16_greedy_tokens_equal_fp32"] = same("minigpt cached bf16")
    result["latency"] = _latency(model, ref, model_bf16, latency_positions, latency_repeats, device, gen)
    result["prefill"] = _prefill(model, ref, prefill_len, repeats, device, gen)
    return result


def _latency(model: GPT, ref: torch.nn.Module, model_bf16: GPT | None, positions: tuple[int, ...],
             repeats: int, device: torch.device, gen: torch.Generator) -> dict:
    """Seconds per decode step with ~pos tokens cached, per contender."""
    out: dict[str, dict] = {}
    for pos in positions:
        prefix = torch.randint(0, SHAPE["vocab_size"], (1, pos - 1), generator=gen).to(device)  # (1, pos-1)
        steps = {"minigpt fp32": _minigpt_step_fn(model, prefix),
                 "reference fp32": _reference_step_fn(ref, prefix)}
        if model_bf16 is not None:
            steps["minigpt bf16"] = _minigpt_step_fn(model_bf16, prefix)
        for name, t in interleave(steps, repeats=repeats, warmup=2, device=device).items():
            out.setdefault(name, {})[str(pos)] = t.to_dict()
    for per_pos in out.values():
        first, last = str(positions[0]), str(positions[-1])
        per_pos[f"ratio_{last}_over_{first}"] = per_pos[last]["median"] / per_pos[first]["median"]
    return out


def _prefill(model: GPT, ref: torch.nn.Module, length: int, repeats: int, device: torch.device,
             gen: torch.Generator) -> dict:
    """Seconds to prefill a `length`-token prompt into a fresh cache (last position's logits only)."""
    idx = torch.randint(0, SHAPE["vocab_size"], (1, length), generator=gen).to(device)  # (1, T)

    @torch.no_grad()
    def ours() -> None:
        model(idx, kv_cache=model.new_kv_cache(1), last_only=True)

    @torch.no_grad()
    def theirs() -> None:
        ref(input_ids=idx, use_cache=True, logits_to_keep=1)

    contenders = {"minigpt fp32": ours, "reference fp32": theirs}
    timings = interleave(contenders, repeats=repeats, warmup=1, device=device)
    return {"tokens": length, **{name: t.to_dict() for name, t in timings.items()}}
