"""Speculative decoding: acceptance rate and speed-up of drafts for the generation section's model (W2).

The model decodes greedily in float32, as plain decoding and with a draft proposing k tokens per round
(generation/speculative.py); the tokens are the same by construction (and checked here), so only the time
differs. The weights are random, so a draft trained apart from the model would agree by chance only; the
drafts are the model's own weights in fewer bytes, which agree wherever rounding leaves the argmax alone:

    int8 copy       the model quantised to int8 (model/int8.py): a quarter of float32's bytes per step
    bf16 copy       the model in bfloat16: half of them

GPT-2's initialisation makes a random model of this size repeat one token whatever the context (every draft
would then be right); the matrices are redrawn with std 0.1 instead, so its next token depends on the context.
speed-up = tokens/s with the draft / tokens/s without; tokens per forward = (accepted + rounds) / rounds.
"""

from __future__ import annotations

import copy

import torch

from minigpt.fast.fastest import fastest_step
from minigpt.fast.int8 import quantize_for_decoding
from minigpt.fast.step import DecodeStep
from minigpt.fast.timing import interleave
from minigpt.generation.speculative import speculative_stream_tokens
from minigpt.lab.bench.generation import GREEDY, SHAPE, minigpt_generate
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.sampling.sequences import GenerationStats

SHARP_STD = 0.1


def sharpened(model: GPT, std: float = SHARP_STD) -> GPT:
    """`model` with every matrix but the position table redrawn from N(0, std^2), in place (seeded)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "wpe" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def _speculative(model: DecodeStep, draft: DecodeStep, prompt: list[int], new_tokens: int, k: int,
                 stats: GenerationStats) -> list[int]:
    stream = speculative_stream_tokens(model.model, draft.model, prompt, max_new_tokens=new_tokens,
                                       params=GREEDY, generator=torch.Generator(), num_draft_tokens=k,
                                       stats=stats, step=model, draft_step=draft)
    return [s.emitted[0] for s in stream]


def bench_speculative(device: torch.device, *, prompt_len: int = 16, new_tokens: int = 256,
                      draft_tokens: tuple[int, ...] = (2, 4), repeats: int = 2, compile: bool = True) -> dict:
    """tokens/s, acceptance rate and tokens per forward of each (draft, k); see the module docstring."""
    torch.manual_seed(0)
    trained = sharpened(build_model(gpt2_like_config(**SHAPE))).to(device).eval()
    model = fastest_step(copy.deepcopy(trained), compile=compile)
    int8, _ = quantize_for_decoding(copy.deepcopy(trained))
    drafts = {"int8 copy": fastest_step(int8, compile=compile),
              "bf16 copy": fastest_step(copy.deepcopy(trained).bfloat16(), compile=compile)}
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, SHAPE["vocab_size"], (prompt_len,), generator=gen).tolist()
    stats: dict[str, GenerationStats] = {}
    outputs: dict[str, list[int]] = {}
    plain = lambda: minigpt_generate(model.model, prompt, new_tokens, step=model)
    contenders = {"plain": lambda: outputs.__setitem__("plain", plain())}
    for name, draft in drafts.items():
        for k in draft_tokens:
            key = f"{name}, k={k}"

            def run(key=key, draft=draft, k=k) -> None:
                stats[key] = GenerationStats()
                outputs[key] = _speculative(model, draft, prompt, new_tokens, k, stats[key])

            contenders[key] = run
    with torch.no_grad():
        timings = interleave(contenders, repeats=repeats, warmup=1, device=device)
    plain_s = timings["plain"].median
    rows = {"plain": {"time_s": timings["plain"].to_dict(), "tokens_per_s": new_tokens / plain_s}}
    for key, s in stats.items():
        t = timings[key]
        rows[key] = {"time_s": t.to_dict(), "tokens_per_s": new_tokens / t.median,
                     "speedup": plain_s / t.median, "acceptance_rate": s.acceptance_rate,
                     "tokens_per_forward": (s.accepted + s.rounds) / s.rounds,
                     "same_tokens": outputs[key] == outputs["plain"]}
    return {"shape": dict(SHAPE), "prompt_tokens": prompt_len, "new_tokens": new_tokens, "compile": compile,
            "model_setup": model.notes, "rows": rows}
