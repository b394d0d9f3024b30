"""Generation speed: minigpt's decoding against its own naive path, Hugging Face `generate` and llama.cpp.

Shape W2: 6 layers x 384 wide x 6 heads, vocab 50304, block 1024, random weights, batch 1, 16 prompt tokens +
256 new ones, greedy. Every contender really generates all 256 tokens (the HF reference gets
`eos_token_id=None` and `min_new_tokens`, and random weights rarely repeat a stop token anyway). minigpt's
models are prepared exactly as the generate command prepares them (`minigpt/fast/`: the fastest step measured
for one row and checked against the eager one, int8 quantised with its activation dtype measured), each
eager and compiled (`compile=true`). Measured:

- tokens/s of whole generations, per weights dtype: minigpt (float32, bfloat16, int8), HF `generate`
  (float32, bfloat16 where bf16 matmuls are native), llama.cpp (f32, bf16, q8_0: `llama_cpp.py`, where
  llama-cpp-python is installed), and minigpt uncached (the O(T^2) reference in sampling/naive.py)
- MBU, memory-bandwidth utilisation: the bytes a decode step must read (every matrix once, plus the KV cache
  so far) per second, over the read bandwidth measured in the peak section. Decoding one token does ~2 FLOPs
  per weight it reads, so it is bound by memory, and MBU says how close it comes
- the targets: each minigpt dtype's best setting against llama.cpp's same-size weights
- per-token latency of one decode step with ~64, ~512, ~1000 tokens in the cache, eager and compiled, and the
  same step of a model with the same layers and heads but negligible weights (8-wide heads, vocab 64): its
  time is what a step costs besides reading weights (Python, op dispatch, small kernels)
- the Llama-style model (`model=demo`) decoding greedily at batch 1 (its own shape: `default_model`)
- the time to prefill a 512-token prompt (last position projected only, as when sampling), and the extra
  memory of one cached generation
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minigpt.data.config import BPE_VOCAB_SIZE
from minigpt.fast.fastest import fastest_step
from minigpt.fast.int8 import quantize_for_decoding
from minigpt.fast.packed import PackedLinear
from minigpt.fast.step import DecodeStep
from minigpt.fast.streamed import StreamedLinear
from minigpt.fast.timing import Timing, interleave, time_call
from minigpt.fast.whole_steps import step_after
from minigpt.lab.bench import llama_cpp
from minigpt.lab.bench.reference import gpt2_like_config, reference_model
from minigpt.lab.bench.resources import peak_memory_bytes
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.model.int8 import Int8Linear
from minigpt.sampling.decode import generate
from minigpt.sampling.next_token import greedy
from minigpt.sampling.params import SamplingParams

SHAPE = {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 50304, "block_size": 1024}
GREEDY = SamplingParams(temperature=0.0)
OVERHEAD = "overhead (same ops, ~no weights)"
# minigpt's weights dtypes, each against llama.cpp's weights of the same size; the target ratio
TARGETS = {"fp32": "f32", "bf16": "bf16", "int8": "q8_0"}
TARGET_RATIO = 0.8


def minigpt_generate(model: GPT, prompt: list[int], new_tokens: int, use_cache: bool = True,
                     step=None) -> list[int]:
    gen = torch.Generator(device=model.transformer.wte.weight.device).manual_seed(0)
    result = generate(model, [prompt], max_new_tokens=new_tokens, params=GREEDY, generator=gen,
                      use_cache=use_cache, step=step)
    return result.tokens[0]


def reference_generate(ref: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """HF greedy generation of exactly `new_tokens` tokens (no stop token, no sampling filters)."""
    out = ref.generate(
        input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=False, top_k=0, eos_token_id=None, pad_token_id=0,
        use_cache=True,
    )
    return out[0, prompt.shape[1]:].tolist()


def weight_bytes(model: GPT) -> int:
    """Bytes of the weights one decode step reads: every matrix, norm and bias once (the head's matrix whole,
    tied to the embedding or not), int8 matrices with their scales, packed ones as packed, the lookup tables
    (an untied embedding, the position table) not at all: one row per token."""
    tables = {id(model.transformer.wte.weight)}
    if "wpe" in model.transformer:
        tables.add(id(model.transformer.wpe.weight))
    if isinstance(model.lm_head, torch.nn.Linear | StreamedLinear):
        tables.discard(id(model.lm_head.weight))  # tied: the head reads the table whole
    stored = [b for m in model.modules() if isinstance(m, Int8Linear | PackedLinear)
              for b in m.buffers(recurse=False)]
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *stored] if id(t) not in tables)


def kv_bytes_per_token(model: GPT) -> int:
    """Bytes of K and V one cached token occupies, over all layers (read again by every later step)."""
    cfg = model.config
    return 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * model.transformer.wte.weight.element_size()


def mbu(bytes_per_token: float, seconds_per_token: float, bandwidth: float | None) -> float | None:
    """Memory-bandwidth utilisation of a decode step; None without a measured bandwidth."""
    return None if not bandwidth else bytes_per_token / seconds_per_token / bandwidth


def decoders(trained: GPT, compile: bool) -> tuple[dict[str, DecodeStep], dict[str, float], dict[str, list]]:
    """minigpt's contenders: each weights dtype prepared as `generate` prepares it, eager and (compile)
    compiled, each on a copy of its own with its step measured for itself (a compiled step has more
    candidates, each compiled to be timed); the seconds each compiled one took to prepare; and each one's
    setup (what was measured and chosen)."""
    int8, why = quantize_for_decoding(copy.deepcopy(trained))
    models = {"fp32": copy.deepcopy(trained), "bf16": copy.deepcopy(trained).bfloat16(), "int8": int8}
    quantized = {"fp32": [], "bf16": [], "int8": [why]}
    out, prepare_s, setups = {}, {}, {}
    for dtype, model in models.items():
        if compile:
            start = time.perf_counter()
            compiled = fastest_step(copy.deepcopy(model), compile=True)
            prepare_s[f"minigpt {dtype} compiled"] = time.perf_counter() - start
        out[f"minigpt {dtype}"] = fastest_step(model)
        if compile:
            out[f"minigpt {dtype} compiled"] = compiled
    for name, step in out.items():
        setups[name] = [*quantized[name.split()[1]], *step.notes]
    return out, prepare_s, setups


def bench_generation(device: torch.device, *, prompt_len: int = 16, new_tokens: int = 256, repeats: int = 5,
                     latency_positions: tuple[int, ...] = (64, 512, 1000), latency_repeats: int = 10,
                     prefill_len: int = 512, uncached: bool = True, reference_bf16: bool = True,
                     compile: bool = True, read_bytes_per_s: float | None = None) -> dict:
    """See the module docstring. reference_bf16=False leaves out HF with bf16 weights (where bf16 matmuls are
    emulated it is the slowest contender by far, and fp32 is the reference's best)."""
    torch.manual_seed(0)
    trained = build_model(gpt2_like_config(**SHAPE)).to(device).eval()
    ours, prepare_s, setups = decoders(trained, compile)
    refs = {"fp32": reference_model(trained).eval()}
    notes = []
    if reference_bf16:
        refs["bf16"] = reference_model(copy.deepcopy(trained).bfloat16()).eval()
    else:
        notes.append("reference with bf16 weights skipped: bf16 matmuls are emulated here (see the peak)")
    gen = torch.Generator().manual_seed(1)
    prompt_t = torch.randint(0, SHAPE["vocab_size"], (1, prompt_len), generator=gen).to(device)  # (1, P)
    prompt = prompt_t[0].tolist()
    contenders: dict[str, Callable[[], object]] = {
        name: (lambda d=d: minigpt_generate(d.model, prompt, new_tokens, step=d))
        for name, d in ours.items()}
    for d in refs:
        contenders[f"reference generate {d}"] = lambda r=refs[d]: reference_generate(r, prompt_t, new_tokens)
    with tempfile.TemporaryDirectory() as folder:
        llama_bytes = _add_llama_cpp(contenders, trained, Path(folder), prompt, new_tokens, device, notes)
        with torch.no_grad():
            outputs, compile_s = {}, {}
            first = lambda: outputs.__setitem__("minigpt fp32", contenders["minigpt fp32"]())
            peak_mem = peak_memory_bytes(first, device)
            for name, fn in contenders.items():  # the warm-up round: compiled contenders compile here
                if name not in outputs:
                    start = time.perf_counter()
                    outputs[name] = fn()
                    compile_s[name] = time.perf_counter() - start
            timings = interleave(contenders, repeats=repeats, warmup=0, device=device)
    if uncached:  # O(T^2) per token: one timed run is plenty to see the gap
        naive = lambda: minigpt_generate(ours["minigpt fp32"].model, prompt, new_tokens, use_cache=False)
        timings["minigpt uncached fp32"] = Timing.from_samples([time_call(naive, device)])
    mean_cached = prompt_len + (new_tokens - 1) / 2  # tokens in the cache, averaged over the decode steps
    bytes_per_token = {name: weight_bytes(d.model) + mean_cached * kv_bytes_per_token(d.model)
                       for name, d in ours.items()}
    bytes_per_token |= {name: b + mean_cached * kv_bytes_per_token(trained)
                        for name, b in llama_bytes.items()}
    rows = _rows(timings, new_tokens, bytes_per_token, read_bytes_per_s)
    for name, seconds in compile_s.items():
        if name.endswith("compiled"):
            # choosing its kernels (compiling and timing candidates), then the first call less a steady one
            rows[name]["compile_s"] = prepare_s[name] + seconds - timings[name].median
    same = lambda a, b: sum(x == y for x, y in zip(outputs[a], outputs[b], strict=True))
    result = {
        "shape": dict(SHAPE), "prompt_tokens": prompt_len, "new_tokens": new_tokens, "contenders": rows,
        "greedy_tokens_equal_reference": same("minigpt fp32", "reference generate fp32"),
        "greedy_tokens_equal_fp32": {name: same("minigpt fp32", name) for name in ours},
        "peak_mem_bytes": peak_mem, "read_bytes_per_s": read_bytes_per_s, "notes": notes,
        "weight_bytes": {name.split()[1]: weight_bytes(d.model) for name, d in ours.items()},
        "setups": setups, "targets": _targets(rows),
    }
    result["latency"] = _latency(ours, refs, latency_positions, latency_repeats, device, gen,
                                 read_bytes_per_s, compile)
    result["prefill"] = _prefill(ours["minigpt fp32"].model, refs["fp32"], prefill_len, repeats, device, gen)
    return result


def _add_llama_cpp(contenders: dict, trained: GPT, folder: Path, prompt: list[int], new_tokens: int,
                   device: torch.device, notes: list[str]) -> dict[str, float]:
    """llama.cpp's contenders (f32, bf16, q8_0 GGUF files of `trained` in `folder`), where it is installed;
    returns the bytes each decode step reads."""
    if device.type != "cpu" or not llama_cpp.available():
        notes.append("llama.cpp skipped: " + ("CPU only here" if device.type != "cpu" else
                                              "llama-cpp-python and gguf are not installed"))
        return {}
    read = {}
    for weights in llama_cpp.WEIGHTS:
        path = llama_cpp.write_gguf(trained, folder / f"w2-{weights}.gguf", weights)
        run = llama_cpp.llama_cpp_generate(path, torch.get_num_threads(), len(prompt) + new_tokens)
        contenders[f"llama.cpp {weights}"] = lambda run=run: run(prompt, new_tokens)
        read[f"llama.cpp {weights}"] = llama_cpp.read_bytes_per_token(path)
    return read


def _rows(timings: dict[str, Timing], new_tokens: int, bytes_per_token: dict[str, float],
          bandwidth: float | None) -> dict:
    """tokens/s, ratios (to the best HF reference, to minigpt fp32) and MBU of each generate contender."""
    rows = {name: {"time_s": t.to_dict(), "tokens_per_s": new_tokens / t.median}
            for name, t in timings.items()}
    best_ref = max(row["tokens_per_s"] for name, row in rows.items() if name.startswith("reference"))
    for name, row in rows.items():
        row["vs_reference"] = row["tokens_per_s"] / best_ref
        row["vs_minigpt_fp32"] = row["tokens_per_s"] / rows["minigpt fp32"]["tokens_per_s"]
        if name in bytes_per_token:  # the uncached path re-reads the whole context: its MBU means nothing
            row["bytes_per_token"] = bytes_per_token[name]
            row["mbu"] = mbu(row["bytes_per_token"], 1 / row["tokens_per_s"], bandwidth)
    return rows


def _targets(rows: dict) -> list[dict]:
    """Each minigpt dtype's best setting (eager or compiled) against llama.cpp's same-size weights."""
    out = []
    for ours, theirs in TARGETS.items():
        mine = [n for n in rows if n.startswith(f"minigpt {ours}")]
        if f"llama.cpp {theirs}" not in rows or not mine:
            continue
        best = max(mine, key=lambda n: rows[n]["tokens_per_s"])
        ratio = rows[best]["tokens_per_s"] / rows[f"llama.cpp {theirs}"]["tokens_per_s"]
        out.append({"ours": best, "theirs": f"llama.cpp {theirs}", "ratio": ratio, "target": TARGET_RATIO,
                    "met": ratio >= TARGET_RATIO})
    return out


def step_timer(step: DecodeStep, prefix: torch.Tensor) -> Callable[[], None]:
    """A callable decoding one token after `prefix` (1, P) and picking it greedily, every call with exactly P
    cached tokens (`step_after`)."""
    call = step_after(step, prefix)
    return lambda: greedy(call()[:, -1])


def _reference_step_fn(ref: torch.nn.Module, prefix: torch.Tensor) -> Callable[[], None]:
    """The same for HF: its cache grows by one per call, so positions drift by the repeat count (a few)."""
    with torch.no_grad():
        out = ref(input_ids=prefix, use_cache=True, logits_to_keep=1)
    cache = out.cache  # a transformers DynamicCache (transformers >= 5 calls it `cache`)
    token = greedy(out.logits[:, -1]).unsqueeze(1)  # (1, 1)

    @torch.no_grad()
    def step() -> None:
        out = ref(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        greedy(out.logits[:, -1])

    return step


def overhead_model(device: torch.device, shape: dict | None = None) -> GPT:
    """`shape`'s layers, heads and block with 8-wide heads and a 64-token vocabulary: the same ops on weights
    of ~40 KB, so a decode step's time is all overhead."""
    shape = SHAPE if shape is None else shape
    cfg = gpt2_like_config(**{**shape, "n_embd": 8 * shape["n_head"], "vocab_size": 64})
    torch.manual_seed(0)
    return build_model(cfg).to(device).eval()


def _latency(ours: dict[str, DecodeStep], refs: dict[str, torch.nn.Module], positions: tuple[int, ...],
             repeats: int, device: torch.device, gen: torch.Generator, bandwidth: float | None,
             compile: bool) -> dict:
    """Seconds per decode step with ~pos tokens cached (and its MBU) per contender, and the overhead rows."""
    out: dict[str, dict] = {}
    tiny = overhead_model(device)
    steppers = dict(ours) | {OVERHEAD: fastest_step(tiny)}
    if compile:
        steppers[f"{OVERHEAD} compiled"] = fastest_step(copy.deepcopy(tiny), compile=True)
    for pos in positions:
        prefix = torch.randint(0, SHAPE["vocab_size"], (1, pos - 1), generator=gen).to(device)  # (1, pos-1)
        steps = {name: step_timer(d, prefix % d.model.config.vocab_size) for name, d in steppers.items()}
        for d, r in refs.items():
            steps[f"reference {d}"] = _reference_step_fn(r, prefix)
        with torch.no_grad():
            timed = interleave(steps, repeats=repeats, warmup=2, device=device)
        for name, t in timed.items():
            row = t.to_dict()
            if name in ours:
                m = ours[name].model
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


def default_model_config() -> ModelConfig:
    """The Llama-style model (ModelConfig's defaults, `model=demo`) with the default bpe tokenizer's
    vocabulary."""
    return ModelConfig(vocab_size=BPE_VOCAB_SIZE)
