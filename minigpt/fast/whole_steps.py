"""Whole decode steps timed: a compiled step as chosen against its streamed twin, and the eager step alone.

A streamed product (streamed.py) gains because Inductor generates it together with the norm, activation or
residual add around it, which no product timed alone shows; so this choice is timed on whole steps: each
decoding one token after a prefix of an eighth of the context, in interleaved rounds, judged by the median of
the rounds' ratio (`paired_speedup`) against STEP_MIN_SPEEDUP. `eager_step_s` times the eager step alone, for
compile=auto (generation/auto.py) to weigh against what compiling is known to cost here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

import torch

from minigpt.fast.step import DecodeStep, Plan
from minigpt.fast.timing import STEP_MIN_SPEEDUP, interleaved_times, paired_speedup
from minigpt.model.gpt import GPT


def step_after(step: DecodeStep, prefix: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A call decoding one token per row after `prefix` (rows, P) with `step` (on its own model): the cache is
    prefilled once, then each call rewinds it to P slots and decodes, so every call sees exactly P cached
    tokens. Each call returns the step's logits (rows, 1, V)."""
    model = step.model
    cache = model.new_kv_cache(prefix.shape[0])
    with torch.no_grad():
        logits, _ = model(prefix, kv_cache=cache, last_only=True)
    token = logits[:, -1].argmax(-1, keepdim=True)  # (rows, 1): any token will do; this one is likely
    filled = cache.length

    def call() -> torch.Tensor:
        cache.rewind(filled)
        return step(token, cache)

    return call


def time_steps(steps: dict[str, DecodeStep], rows: int, repeats: int = 15) -> dict[str, list[float]]:
    """Seconds of one call of each step (each on its own model) in each of `repeats` interleaved rounds,
    `rows` rows decoding after a prefix of an eighth of the context; the first calls, which compile, are not
    timed."""
    calls = {}
    for name, step in steps.items():
        length = max(1, step.model.config.block_size // 8)
        calls[name] = step_after(step, torch.zeros(rows, length, dtype=torch.long, device=step.device))
        calls[name]()  # compiles
    return interleaved_times(calls, repeats, device=next(iter(steps.values())).device)


def eager_step_s(model: GPT, rows: int) -> float:
    """Median seconds of one eager decode step of `model` for `rows` rows, over a few rounds."""
    return statistics.median(time_steps({"eager": DecodeStep(model)}, rows, repeats=5)["eager"])


StepMeasure = Callable[[dict[str, DecodeStep], int], dict[str, list[float]]]


def streamed_twin(plan: Plan) -> Plan:
    """The plan of a step's streamed twin: the blocks' products streamed, each fused with the norm, activation
    or residual add around it; the head, which stands alone after the final norm and is the largest matrix,
    frozen, so Inductor times its own kernels for it against the library's; the oneDNN flag, the attention and
    the compiling as in `plan`."""
    return replace(plan, layout="streamed", head_layout="out_in", frozen=True)


def choose_streamed(chosen: DecodeStep, twin: DecodeStep, rows: int,
                    measure: StepMeasure = time_steps) -> tuple[list[DecodeStep], str]:
    """A compiled step as chosen and its streamed twin, the faster first, and why: the twin goes first where
    it is STEP_MIN_SPEEDUP faster by `paired_speedup`."""
    rounds = measure({"chosen": chosen, "streamed": twin}, rows)
    speedup = paired_speedup(rounds["chosen"], rounds["streamed"])
    median_ms = {name: statistics.median(seconds) * 1e3 for name, seconds in rounds.items()}
    measured = (f"a step as chosen {median_ms['chosen']:.2f} ms, streamed {median_ms['streamed']:.2f} ms, "
                f"{speedup:.2f}x")
    if speedup < STEP_MIN_SPEEDUP:
        return [chosen, twin], f"step as chosen: {measured} (streamed not {STEP_MIN_SPEEDUP}x faster)"
    return [twin, chosen], f"step streamed: {measured}"
