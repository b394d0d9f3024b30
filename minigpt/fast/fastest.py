"""The wing's entry point: the fastest decode step for a model on this machine that gives the eager step's
tokens.

    fastest_step(model, rows=, compile=)    a DecodeStep (step.py) on `model` or on a prepared copy of it

On the way, in this order:
  1. a plan, measured (unless one is given, such as a choice kept from an earlier run): the products' layouts,
     oneDNN flag and freezing for a float model (products.py), the decode attention (attention.py), compiled
     or not as asked;
  2. for a compiled step of a float model on a CPU, that step against its streamed twin, as whole steps
     (whole_steps.py): both are candidates, the faster first;
  3. the candidates held against the eager step by the numbers gate (gate.py), in that order: the first that
     passes is handed back; one that fails is refused with one log line, and the eager step is what is left.
Each candidate is built on a copy of the model, so the eager step is there to the end. What was measured and
decided is kept in the step's `notes` and logged.

Given a StepCache (kept.py), a compiled candidate is packaged ahead of time (packaged.py) and gated as its
package, which is kept; a later run loads the package kept for this machine, model, dtype and weights in place
of all three steps, and still gates it. A plan kept without a package for these weights (another checkpoint of
the shape, or a plan that does not package) replaces step 1 and 2, and is packaged, or compiled from its kept
Inductor artifacts; it still passes step 3, and one the gate refuses is chosen again. A step chosen anew is
kept, with the seconds choosing and compiling took and those of an eager and of its own step.
"""

from __future__ import annotations

import copy
import logging
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from minigpt.device.runtime import compile_problem
from minigpt.fast.attention import AttentionMeasure, choose_attention, time_attention
from minigpt.fast.gate import first_passing, record_probes
from minigpt.fast.int8 import int8_compile_problem
from minigpt.fast.kept import Kept, StepCache, saved_artifacts, weights_digest
from minigpt.fast.packaged import PackagedStep, package_problem, packaged_candidate, packaged_step
from minigpt.fast.products import ProductMeasure, choose_products, time_products
from minigpt.fast.step import DEFAULT, DecodeStep, Plan, build_step
from minigpt.fast.whole_steps import StepMeasure, choose_streamed, streamed_twin, time_steps
from minigpt.model.gpt import GPT
from minigpt.model.int8 import Int8Linear

log = logging.getLogger(__name__)


def choose_plan(model: GPT, rows: int, compile: bool, measure_products: ProductMeasure = time_products,
                measure_attention: AttentionMeasure = time_attention) -> tuple[Plan, list[str]]:
    """The plan for decoding `rows` rows with `model` (`compile`: the step will be compiled), and one line per
    choice saying why. int8 matrices keep their own kernel: nothing is chosen for them, and so an int8 step is
    never frozen (docs/decoding.md says what a frozen int8 step once computed)."""
    plan, notes = DEFAULT, []
    if not any(isinstance(m, Int8Linear) for m in model.modules()):
        blocks = [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m is not model.lm_head]
        plan, why = choose_products(model.lm_head.weight, blocks, rows, compile, measure_products)
        notes.append(f"products {why}")
    table = model.transformer.wte.weight  # float in every weights dtype: the activations' dtype and device
    attention, why = choose_attention(model.config, table.dtype, table.device, rows, plan.onednn, compile,
                                      measure_attention)
    notes.append(f"attention {why}")
    return replace(plan, attention=attention, compiled=compile), notes


def _candidates(model: GPT, plan: Plan, rows: int, twin: bool, notes: list[str],
                measure_steps: StepMeasure) -> Iterator[DecodeStep]:
    """The steps worth trying, fastest first, each on a copy of `model` (made when it is tried): `plan`'s,
    timed against its streamed twin's where `twin`; then, for a compiled plan, the plain compiled step."""
    ranked = [build_step(copy.deepcopy(model), plan, rows)]
    if twin:
        streamed = build_step(copy.deepcopy(model), streamed_twin(plan), rows)
        ranked, why = choose_streamed(ranked[0], streamed, rows, measure_steps)
        notes.append(why)
    yield from ranked
    plain = Plan(compiled=True)
    if plan.compiled and all(step.plan != plain for step in ranked):
        yield build_step(copy.deepcopy(model), plain, rows)


def fastest_step(model: GPT, *, rows: int = 1, compile: bool = False, plan: Plan | None = None,
                 cache: StepCache | None = None, measure_steps: StepMeasure = time_steps) -> DecodeStep:
    """The fastest decode step for `model` decoding `rows` rows on this machine that gives the eager step's
    tokens, compiled if `compile` and a compiler is found; with the kernels of `plan` instead of measured ones
    where a plan is given, else of the plan kept in `cache` where it holds one (and kept there if not).
    `model` is put in eval mode and otherwise left as it is: the step may run on a copy."""
    model.eval()
    device = next(model.parameters()).device
    if compile and plan is None and cache is not None and int8_compile_problem(model) is None:
        step = _kept_package(model, rows, cache, device)
        if step is not None:
            return step
    problem = (compile_problem(device) or int8_compile_problem(model)) if compile else None
    if problem:
        log.warning("compile=true: decoding eagerly, since %s", problem)
    compile = compile and problem is None
    if plan is not None or cache is None:
        return _gated_step(model, rows, compile, plan, measure_steps)
    key = cache.key(model, rows, compile)
    start = time.perf_counter()
    kept = cache.read(key)
    if kept is not None:
        step = _gated_step(model, rows, compile, kept.plan, measure_steps, [*kept.notes, "kept"])
        if step.plan == kept.plan:
            cache.write(key, replace(kept, warm_s=time.perf_counter() - start))
            return step
        log.warning("the kept %s was refused by the numbers gate: choosing again", kept.plan.name)
    with tempfile.TemporaryDirectory(prefix="minigpt-package-") as folder:
        step = _gated_step(model, rows, compile, None, measure_steps, package_in=Path(folder))
    kept = Kept(step.plan, step.notes[:-1], time.perf_counter() - start)
    if isinstance(step, PackagedStep):
        kept = cache.keep_package(key, kept, step.package, weights_digest(model))
    times = _step_times(model, step, rows, measure_steps) if step.compiled else {}
    artifacts = saved_artifacts() if step.compiled and not isinstance(step, PackagedStep) else None
    cache.write(key, replace(kept, times=times), artifacts)
    return step


def _kept_package(model: GPT, rows: int, cache: StepCache, device: torch.device) -> DecodeStep | None:
    """`model`'s packaged step of the compiled plan `cache` keeps for it, packaged now where its weights have
    none, gated; None where no such plan is kept or its step is not handed back (packaged.py). Looked for
    before anything else: a package loads with no compiler, and without importing one."""
    start = time.perf_counter()
    key = cache.key(model, rows, True)
    kept = cache.peek(key)
    if kept is None or not kept.plan.compiled or package_problem(kept.plan, device) is not None:
        return None
    step, packaged = packaged_step(model, rows, key, kept, cache, weights_digest(model))
    if step is not None:
        warm = packaged.package == kept.package  # loaded, not packaged now: a warm start
        cache.write(key, replace(packaged, warm_s=time.perf_counter() - start) if warm else packaged)
    return step


def _gated_step(model: GPT, rows: int, compile: bool, plan: Plan | None, measure_steps: StepMeasure,
                notes: list[str] | None = None, package_in: Path | None = None) -> DecodeStep:
    """The step of `plan` (measured where None), or the eager step where the gate refuses it; `notes` are a
    kept plan's, which is used as it is (an eager one kept for a compiled step: no compiled step passed).
    With a folder `package_in`, each compiled candidate is packaged there and gated as its package."""
    kept, notes = notes is not None, list(notes or [])
    twin = False
    if plan is None:
        plan, notes = choose_plan(model, rows, compile)
        int8 = any(isinstance(m, Int8Linear) for m in model.modules())
        twin = compile and not int8 and next(model.parameters()).device.type == "cpu"
    if not kept:  # a kept plan is what passed, compiled or not; any other is compiled as asked
        plan = replace(plan, compiled=compile)
    step, checked = DecodeStep(model), []
    if plan != DEFAULT:
        probes = record_probes(model, rows)
        candidates = _candidates(model, plan, rows, twin, notes, measure_steps)
        if package_in is not None:
            example = probes[0].prefilled
            candidates = (packaged_candidate(c, model, example, package_in) for c in candidates)
        step, checked = first_passing(model, probes, candidates)
    step.notes = [*notes, *checked, step.name]
    for note in step.notes:
        log.debug("%s", note)
    return step


def _step_times(model: GPT, step: DecodeStep, rows: int, measure_steps: StepMeasure) -> dict[str, float]:
    """Median seconds of one eager step of `model` and one of `step`, what compile=auto weighs."""
    rounds = measure_steps({"eager": DecodeStep(model), "compiled": step}, rows)
    return {name: statistics.median(seconds) for name, seconds in rounds.items()}
