"""Batch decoding: tokens/s and per-token latency as more prompts decode together (batch 1, 4, 16, 64).

A decode step reads every weight once whatever the batch, so while reading weights dominates, a batch of B
decodes nearly B times the tokens in the same time; throughput stops growing where the step's arithmetic
(or its KV-cache reads) takes over. Each weights dtype is prepared as `generate num_samples=B` prepares it
(the plan measured for B rows, `minigpt/fast/`), and compiled when the bench compiles, except for the
whole-step streamed choice (`fast/whole_steps.py`): the plans are chosen first so that one compiled step
serves every batch size that chose the same plan. The shape is the generation section's (W2); every row
decodes `new_tokens` greedily after its own random prompt.

"saturates at" is the smallest batch whose tokens/s is within 10% of the sweep's best: past it, batching
adds latency per token and little throughput.
"""

from __future__ import annotations

import copy

import torch

from minigpt.fast.fastest import choose_plan, fastest_step
from minigpt.fast.int8 import quantize_for_decoding
from minigpt.fast.timing import interleave
from minigpt.lab.bench.generation import GREEDY, SHAPE, kv_bytes_per_token, mbu, weight_bytes
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate

SATURATION = 0.9  # within 10% of the best tokens/s counts as saturated


def bench_decode_batch(device: torch.device, *, batch_sizes: tuple[int, ...] = (1, 4, 16, 64),
                       prompt_len: int = 16, new_tokens: int = 64, repeats: int = 2, compile: bool = True,
                       read_bytes_per_s: float | None = None) -> dict:
    """tokens/s, seconds per step and MBU for every (weights dtype, batch size); see the module docstring."""
    torch.manual_seed(0)
    trained = build_model(gpt2_like_config(**SHAPE)).to(device).eval()
    models = {"fp32": copy.deepcopy(trained), "bf16": copy.deepcopy(trained).bfloat16(),
              "int8": quantize_for_decoding(copy.deepcopy(trained))[0]}
    gen = torch.Generator().manual_seed(2)
    contenders, decoders, prepared, setups = {}, {}, {}, {}
    for dtype, model in models.items():
        for b in batch_sizes:
            plan, why = choose_plan(model, b, compile=compile)
            # a copy per plan (packed matrices are packed for their batch size); one compiled step serves
            # every batch of a plan
            key = (dtype, plan, b if "packed" in (plan.layout, plan.head_layout) else None)
            if key not in prepared:
                prepared[key] = fastest_step(copy.deepcopy(model), rows=b, compile=compile, plan=plan)
            d = prepared[key]
            setups[(dtype, b)] = "; ".join([*why, d.notes[-1]])
            prompts = torch.randint(0, SHAPE["vocab_size"], (b, prompt_len), generator=gen).tolist()
            decoders[(dtype, b)] = d
            contenders[f"{dtype} batch {b}"] = lambda d=d, p=prompts: generate(
                d.model, p, max_new_tokens=new_tokens, params=GREEDY, generator=torch.Generator(), step=d)
    with torch.no_grad():
        timings = interleave(contenders, repeats=repeats, warmup=1, device=device)
    mean_cached = prompt_len + (new_tokens - 1) / 2
    rows: dict[str, dict] = {}
    for (dtype, b), d in decoders.items():
        t = timings[f"{dtype} batch {b}"]
        step_s = t.median / new_tokens
        read = weight_bytes(d.model) + b * mean_cached * kv_bytes_per_token(d.model)
        rows.setdefault(dtype, {})[str(b)] = {
            "time_s": t.to_dict(), "tokens_per_s": b * new_tokens / t.median, "step_s": step_s,
            "mbu": mbu(read, step_s, read_bytes_per_s), "setup": setups[(dtype, b)]}
    for per_batch in rows.values():
        best = max(r["tokens_per_s"] for r in per_batch.values())
        saturated = (int(b) for b, r in per_batch.items() if r["tokens_per_s"] >= SATURATION * best)
        per_batch["saturates_at"] = next(saturated)
    return {"shape": dict(SHAPE), "prompt_tokens": prompt_len, "new_tokens": new_tokens,
            "batch_sizes": list(batch_sizes), "compile": compile, "rows": rows}
