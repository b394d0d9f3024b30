"""How far apart two compiled decode steps measure when they compute the same thing: the noise a choice
between whole steps has to beat (`STEP_MIN_SPEEDUP` in fast/timing.py).

Shape W2 (generation.py's SHAPE, random weights), batch 1, per weights dtype with a streamed twin (float32,
bfloat16): the plan is chosen as `generate compile=true` chooses it, then four compiled steps are made,
each on a copy of its own: the step as chosen twice ("chosen", "chosen again") and its streamed twin
(`streamed_twin`) twice ("streamed", "streamed again"). Three pairs are timed as the choice times a step and
its twin (`time_steps`: interleaved rounds, their order alternating, after an eighth of the context) and
reduced the same way (`paired_speedup`), `runs` times each:

    chosen / chosen again       two equal steps: the spread the margin must stay above
    streamed / streamed again   the same for the streamed step
    chosen / streamed           what streaming gains: the margin must let it through
"""

from __future__ import annotations

import copy

import torch

from minigpt.fast.fastest import choose_plan
from minigpt.fast.step import DecodeStep, Plan, build_step
from minigpt.fast.timing import STEP_MIN_SPEEDUP, paired_speedup
from minigpt.fast.whole_steps import streamed_twin, time_steps
from minigpt.lab.bench.generation import SHAPE
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT

PAIRS = (("chosen", "chosen again"), ("streamed", "streamed again"), ("chosen", "streamed"))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _step(model: GPT, plan: Plan) -> DecodeStep:
    """A step of its own copy of `model`, as `plan` says."""
    return build_step(copy.deepcopy(model), plan)


def bench_step_spread(device: torch.device, *, runs: int = 5, compile: bool = True, shape: dict | None = None,
                      dtypes: tuple[str, ...] = tuple(DTYPES)) -> dict:
    """Per dtype of `dtypes`: the plan chosen, and each pair's paired speed-up in each of `runs` runs, on
    `shape` (None: W2)."""
    if not compile:
        return {"skipped": "compiled steps only (the bench runs without compile)"}
    shape = SHAPE if shape is None else shape
    torch.manual_seed(0)
    base = build_model(gpt2_like_config(**shape)).to(device).eval()
    out = {}
    for name in dtypes:
        dtype = DTYPES[name]
        model = copy.deepcopy(base).to(dtype)
        plan, _ = choose_plan(model, 1, compile=True)
        streamed = streamed_twin(plan)
        steps = {"chosen": _step(model, plan), "chosen again": _step(model, plan),
                 "streamed": _step(model, streamed), "streamed again": _step(model, streamed)}
        ratios: dict[str, list[float]] = {f"{a} / {b}": [] for a, b in PAIRS}
        for _ in range(runs):
            for a, b in PAIRS:
                rounds = time_steps({a: steps[a], b: steps[b]}, 1)
                ratios[f"{a} / {b}"].append(paired_speedup(rounds[a], rounds[b]))
        out[name] = {"kernels": plan.name, "ratios": ratios}
    return {"shape": dict(shape), "runs": runs, "margin": STEP_MIN_SPEEDUP, "dtypes": out}
