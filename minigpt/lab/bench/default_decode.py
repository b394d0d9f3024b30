"""The Llama-style model's decoding: tokens/s of greedy generation at batch 1, eager and compiled.

The Llama-style model (ModelConfig's defaults: 4 layers x 96 wide, one KV head, RoPE, SwiGLU, untied head over
the 4096-token bpe vocabulary) has 1.2M parameters, 4.7 MB in float32: its weights stay in the CPU's caches,
so a decode step costs what its ops cost to dispatch and run, not what its weights cost to read. Eagerly that
is a few dozen small ops per layer, each through Python; compiled, a handful of generated kernels and the
matrix products. Weights are random (speed does not depend on their values); 16 prompt tokens, `new_tokens`
new ones, greedy, through the generator's whole loop (sampling, stop checks, window rebuilds past the
128-token context), as `generate` runs it. `step` times the decode step alone, with ~64 tokens cached.
"""

from __future__ import annotations

import copy

import torch

from minigpt.fast.fastest import fastest_step
from minigpt.fast.timing import interleave
from minigpt.lab.bench.generation import default_model_config, minigpt_generate, step_timer
from minigpt.model.factory import build_model

TARGET_TOKENS_PER_S = 2000.0


def bench_default_decode(device: torch.device, *, prompt_len: int = 16, new_tokens: int = 256,
                         repeats: int = 5, compile: bool = True) -> dict:
    """tokens/s and seconds per step of the Llama-style model, eager and (compile) compiled."""
    torch.manual_seed(0)
    model = build_model(default_model_config()).to(device).eval()
    decoders = {"eager": fastest_step(copy.deepcopy(model))}
    if compile:
        decoders["compiled"] = fastest_step(model, compile=True)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(4))
    runs = {name: (lambda d=d: minigpt_generate(d.model, prompt.tolist(), new_tokens, step=d))
            for name, d in decoders.items()}
    prefix = torch.randint(0, vocab, (1, 63), generator=torch.Generator().manual_seed(5))
    steps = {f"{name} step": step_timer(d, prefix.to(device)) for name, d in decoders.items()}
    with torch.no_grad():
        timings = interleave(runs, repeats=repeats, warmup=1, device=device)
        step_timings = interleave(steps, repeats=20 * repeats, warmup=3, device=device)
    rows = {name: {"time_s": t.to_dict(), "tokens_per_s": new_tokens / t.median,
                   "step_s": step_timings[f"{name} step"].to_dict()} for name, t in timings.items()}
    best = max(r["tokens_per_s"] for r in rows.values())
    return {"model": {k: getattr(model.config, k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd",
                                                            "vocab_size", "block_size")},
            "params": model.num_params(non_embedding=False), "prompt_tokens": prompt_len,
            "new_tokens": new_tokens, "threads": torch.get_num_threads(), "rows": rows,
            "setup": decoders["eager"].notes,
            "target_tokens_per_s": TARGET_TOKENS_PER_S, "met": best >= TARGET_TOKENS_PER_S}
