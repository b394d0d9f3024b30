"""Generation speed: minigpt's KV-cached decoding against its own naive path and Hugging Face `generate`.

Shape: 6 layers x 384 wide x 6 heads, vocab 50304, block 1024, random weights, batch 1,
16 prompt tokens + 256 new ones, greedy. Every contender really generates all 256 tokens (the
reference gets `eos_token_id=None` and `min_new_tokens`, and random weights rarely repeat a stop
token anyway). minigpt's models are prepared as the generator prepares them (`prepare_for_decoding`: the
weight layout measured fastest for one-row products, per dtype).
Measured:

- tokens/s of whole `generate` calls: minigpt cached and HF `generate`, each with fp32 and bf16 weights
  (best with best; HF's bf16 only where bf16 matmuls are native), minigpt uncached (the O(T^2)
  reference in sampling/naive.py); the ratios are the headline numbers
- MBU, memory-bandwidth utilisation: the bytes a decode step must read (every weight once, plus the
  KV cache so far) per second, over the read bandwidth measured in the peak section. Decoding one token
  does ~2 FLOPs per weight byte it reads, so it is bound by memory, and MBU says how close it comes
- per-token latency of one decode step (forward + argmax) with ~64, ~512, ~1000 tokens in the cache, and
  the same step of a model with the same layers and heads but negligible weights (8-wide heads, vocab
  64): its time is what a step costs besides reading weights (Python, op dispatch, small kernels)
- the time to prefill a 512-token prompt (last position projected only, as when sampling)
- the extra memory of one cached generation

The greedy tokens of minigpt and the reference are compared too: they run the same weights, so any
disagreement beyond a late near-tie would point at a broken mapping rather than a fast one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from minigpt.generation.run import prepare_for_decoding
from minigpt.lab.bench.reference import gpt2_like_config, reference_model
from minigpt.lab.bench.timing import Timing, interleave, peak_memory_bytes, time_call
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

SHAPE = {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 50304, "block_size": 1024}
GREEDY = SamplingParams(temperature=0.0)
OVERHEAD = "overhead (same ops, ~no weights)"


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


def weight_bytes(model: GPT) -> int:
    """Bytes of the weights one decode step reads: every matrix once (the tied head and embedding once), the
    position table not at all (one row per token)."""
    return model.num_params(non_embedding=True) * model.lm_head.weight.element_size()


def kv_bytes_per_token(model: GPT) -> int:
    """Bytes of K and V one cached token occupies, over all layers (read again by every later step)."""
    cfg = model.config
    return 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * model.lm_head.weight.element_size()


def mbu(bytes_per_token: float, seconds_per_token: float, bandwidth: float | None) -> float | None:
    """Memory-bandwidth utilisation of a decode step; None without a measured bandwidth."""
    return None if not bandwidth else bytes_per_token / seconds_per_token / bandwidth


def bench_generation(device: torch.device, *, prompt_len: int = 16, new_tokens: int = 256, repeats: int = 3,
                     latency_positions: tuple[int, ...] = (64, 512, 1000), latency_repeats: int = 10,
                     prefill_len: int = 512, uncached: bool = True, bf16: bool = True,
                     reference_bf16: bool = True, read_bytes_per_s: float | None = None) -> dict:
    """See the module docstring. reference_bf16=False leaves out HF with bf16 weights (where bf16 matmuls are
    emulated it is the slowest contender by far, and fp32 is the reference's best)."""
    torch.manual_seed(0)
    trained = build_model(gpt2_like_config(**SHAPE)).to(device).eval()
    models = {"fp32": prepare_for_decoding(copy.deepcopy(trained))}
    refs = {"fp32": reference_model(trained).eval()}
    notes = []
    if bf16:
        models["bf16"] = prepare_for_decoding(copy.deepcopy(trained).to(torch.bfloat16))
        if reference_bf16:
            refs["bf16"] = reference_model(models["bf16"]).eval()
        else:
            notes.append("reference with bf16 weights skipped: bf16 matmuls are emulated here (see the peak)")
    gen = torch.Generator().manual_seed(1)
    prompt_t = torch.randint(0, SHAPE["vocab_size"], (1, prompt_len), generator=gen).to(device)  # (1, P)
    prompt = prompt_t[0].tolist()
    contenders: dict[str, Callable[[], object]] = {}
    for d in models:
        contenders[f"minigpt cached {d}"] = lambda m=models[d]: minigpt_generate(m, prompt, new_tokens)
    for d in refs:
        contenders[f"reference generate {d}"] = lambda r=refs[d]: reference_generate(r, prompt_t, new_tokens)
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
                [time_call(lambda: minigpt_generate(models["fp32"], prompt, new_tokens, use_cache=False),
                           device)])
    mean_cached = prompt_len + (new_tokens - 1) / 2  # tokens in the cache, averaged over the decode steps
    rows = _rows(timings, models, new_tokens, mean_cached, read_bytes_per_s)
    ours = outputs["minigpt cached fp32"]
    same = lambda other: sum(a == b for a, b in zip(ours, outputs[other], strict=True))
    result = {
        "shape": dict(SHAPE), "prompt_tokens": prompt_len, "new_tokens": new_tokens, "contenders": rows,
        "greedy_tokens_equal_reference": same("reference generate fp32"), "peak_mem_bytes": peak_mem,
        "weight_bytes": {d: weight_bytes(m) for d, m in models.items()}, "read_bytes_per_s": read_bytes_per_s,
        "notes": notes,
    }
    if bf16:
        result["bf16_greedy_tokens_equal_fp32"] = same("minigpt cached bf16")
    result["latency"] = _latency(models, refs, latency_positions, latency_repeats, device, gen,
                                 read_bytes_per_s)
    result["prefill"] = _prefill(models["fp32"], refs["fp32"], prefill_len, repeats, device, gen)
    return result


def _rows(timings: dict[str, Timing], models: dict[str, GPT], new_tokens: int, mean_cached: float,
          bandwidth: float | None) -> dict:
    """tokens/s, ratios (to the best reference, to minigpt cached fp32) and MBU of each generate contender."""
    rows = {name: {"time_s": t.to_dict(), "tokens_per_s": new_tokens / t.median}
            for name, t in timings.items()}
    best_ref = max(row["tokens_per_s"] for name, row in rows.items() if name.startswith("reference"))
    for name, row in rows.items():
        row["vs_reference"] = row["tokens_per_s"] / best_ref
        row["vs_minigpt_cached_fp32"] = row["tokens_per_s"] / rows["minigpt cached fp32"]["tokens_per_s"]
        if "uncached" not in name:  # the uncached path re-reads the whole context: its MBU means nothing
            m = models[name.split()[-1]]
            row["bytes_per_token"] = weight_bytes(m) + mean_cached * kv_bytes_per_token(m)
            row["mbu"] = mbu(row["bytes_per_token"], 1 / row["tokens_per_s"], bandwidth)
    return rows


def overhead_model(device: torch.device) -> GPT:
    """SHAPE's layers, heads and block with 8-wide heads and a 64-token vocabulary: the same ops on weights
    of ~40 KB, so a decode step's time is all overhead."""
    cfg = gpt2_like_config(**{**SHAPE, "n_embd": 8 * SHAPE["n_head"], "vocab_size": 64})
    torch.manual_seed(0)
    return prepare_for_decoding(build_model(cfg).to(device))


def _latency(models: dict[str, GPT], refs: dict[str, torch.nn.Module], positions: tuple[int, ...],
             repeats: int, device: torch.device, gen: torch.Generator, bandwidth: float | None) -> dict:
    """Seconds per decode step with ~pos tokens cached (and its MBU), per contender; plus the overhead row."""
    out: dict[str, dict] = {}
    tiny = overhead_model(device)
    for pos in positions:
        prefix = torch.randint(0, SHAPE["vocab_size"], (1, pos - 1), generator=gen).to(device)  # (1, pos-1)
        steps = {}
        for d, m in models.items():
            steps[f"minigpt {d}"] = _minigpt_step_fn(m, prefix)
        for d, r in refs.items():
            steps[f"reference {d}"] = _reference_step_fn(r, prefix)
        steps[OVERHEAD] = _minigpt_step_fn(tiny, prefix % 64)
        for name, t in interleave(steps, repeats=repeats, warmup=2, device=device).items():
            row = t.to_dict()
            if name != OVERHEAD:
                m = models[name.split()[-1]]
                row["mbu"] = mbu(weight_bytes(m) + pos * kv_bytes_per_token(m), t.median, bandwidth)
            out.setdefault(name, {})[str(pos)] = row
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
