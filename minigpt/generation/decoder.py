"""Making a loaded model a decoder: its weights' dtype and layout, and the step that runs it.

    load_decoder(checkpoint, ...)   the checkpoint read as the generate command asks (`weights_dtype=`,
                                    int8 included), then `prepare_for_decoding`
    prepare_for_decoding(model)     eval mode, the kernels measured on this machine (the products' layout and
                                    the attention, generation/kernels.py), and the decode step, eager or
                                    compiled (generation/step.py); a compiled step timed against its
                                    streamed twin (`choose_streamed`)

What was chosen, and the measurement it was chosen on, is kept in `Decoder.notes` and logged.
"""

from __future__ import annotations

import copy
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from minigpt.checkpoint.load import load_model
from minigpt.generation.kernels import (
    Kernels,
    choose_int8_activation_dtype,
    choose_kernels,
    interleaved_times,
)
from minigpt.generation.step import DecodeStep
from minigpt.model.gpt import GPT
from minigpt.model.int8 import quantize_int8

log = logging.getLogger(__name__)

# A whole step is taken over another where it is this much faster, by the median of the two's ratio over
# interleaved rounds. Whole steps share most of their work, so they differ by less than single kernels do;
# yet two copies of one step, compiled apart, can measure several percent apart by that median (they differ
# only in where their weights lie in memory; docs/decoding.md gives the spread), and a smaller margin would
# choose by that.
STEP_MIN_SPEEDUP = 1.1


@dataclass
class Decoder:
    """A model ready to decode, the step that runs it, and what was decided on the way (for the log)."""

    model: GPT
    step: DecodeStep
    notes: list[str] = field(default_factory=list)


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
    return interleaved_times(calls, repeats, next(iter(steps.values())).device)


StepMeasure = Callable[[dict[str, DecodeStep], int], dict[str, list[float]]]


def paired_speedup(slower: list[float], faster: list[float]) -> float:
    """How many times faster the second of two steps timed in the same rounds is: the median over rounds of
    each round's ratio, which a drift of the machine from round to round leaves alone."""
    return statistics.median(s / f for s, f in zip(slower, faster, strict=True))


def _on_cpu(model: GPT) -> bool:
    return model.transformer.wte.weight.device.type == "cpu"


def laid_out_step(model: GPT, kernels: Kernels, rows: int, compile: bool) -> DecodeStep:
    """`model` laid out as `kernels` say for `rows` rows (GPT.prepare_for_inference), and its decode step."""
    model.prepare_for_inference(kernels.layout, rows, kernels.attention, kernels.head_layout)
    return DecodeStep(model, compile=compile, kernels=kernels)


def streamed_twin(kernels: Kernels) -> Kernels:
    """The kernels of a step's streamed twin: the blocks' products streamed (model/streamed.py), each fused
    with the norm, activation or residual add around it; the head, which stands alone after the final norm
    and is the largest matrix, frozen, so Inductor times its own kernels for it against the library's; the
    oneDNN flag and the attention as chosen for the step."""
    return replace(kernels, layout="streamed", head_layout="out_in", frozen=True)


def choose_streamed(step: DecodeStep, twin: GPT, rows: int,
                    measure: StepMeasure = time_steps) -> tuple[DecodeStep, str]:
    """`step` (compiled) or its streamed twin (`streamed_twin`) on `twin`, an unprepared copy of its model,
    whichever is STEP_MIN_SPEEDUP faster, and why. Timed as whole steps: a streamed product's gain is that
    Inductor generates it together with the ops around it, which no product timed alone shows. Judged by
    `paired_speedup`."""
    steps = {"chosen": step, "streamed": laid_out_step(twin, streamed_twin(step.kernels), rows, compile=True)}
    rounds = measure(steps, rows)
    speedup = paired_speedup(rounds["chosen"], rounds["streamed"])
    median_ms = {name: statistics.median(seconds) * 1e3 for name, seconds in rounds.items()}
    measured = (f"a step as chosen {median_ms['chosen']:.2f} ms, streamed {median_ms['streamed']:.2f} ms, "
                f"{speedup:.2f}x")
    if speedup < STEP_MIN_SPEEDUP:
        return step, f"step as chosen: {measured} (streamed not {STEP_MIN_SPEEDUP}x faster)"
    return steps["streamed"], f"step streamed: {measured}"


def prepare_for_decoding(model: GPT, *, batch_size: int = 1, compile: bool = False, int8: bool = False,
                         kernels: Kernels | None = None, notes: list[str] | None = None,
                         measure_steps: StepMeasure = time_steps) -> Decoder:
    """Eval mode, weights laid out and kernels chosen for `batch_size` rows (measured unless `kernels` is
    given), and the decode step (`compile`). `int8`: the model's linears are already int8 (`quantize_int8`),
    whose kernel has no layout to choose.

    A compiled step of a float model is then timed against the same step with the blocks' products streamed
    (model/streamed.py) and the clearly faster kept (`choose_streamed`); if that is the streamed one, the
    Decoder's model is a prepared copy of `model`."""
    notes = list(notes or [])
    measured = kernels is None
    if measured:
        kernels, why = choose_kernels(model, batch_size, int8, compile)
        notes.extend(why)
    # the streamed twin, copied before any layout makes the model uncopyable (packed matrices are opaque)
    twin = copy.deepcopy(model) if measured and compile and not int8 and _on_cpu(model) else None
    step = laid_out_step(model, kernels, batch_size, compile)
    if twin is not None and step.compiled:
        step, why = choose_streamed(step, twin, batch_size, measure_steps)
        notes.append(why)
    notes.append(f"decode step {'compiled' if step.compiled else 'eager'}")
    for note in notes:
        log.debug("%s", note)
    return Decoder(step.model, step, notes)


def quantize_for_decoding(model: GPT, batch_size: int = 1) -> tuple[GPT, str]:
    """`model` (float32) with int8 linears, activations in the dtype measured fastest for their kernel."""
    dtype, why = choose_int8_activation_dtype(model.lm_head.weight, batch_size)
    return quantize_int8(model, dtype).eval(), f"int8 weights, {why}"


def load_decoder(checkpoint: str | None, device: str, weights_dtype: str, *, compile: bool = False,
                 batch_size: int = 1) -> tuple[Decoder, Any, dict]:
    """(decoder, tokenizer, meta) of `checkpoint` (None: the newest run under outputs/), with the weights in
    `weights_dtype` (int8: quantised from float32 on load) on `device`."""
    int8 = weights_dtype == "int8"
    model, tokenizer, meta = load_model(checkpoint, device, "float32" if int8 else weights_dtype)
    notes = []
    if int8:
        model, why = quantize_for_decoding(model, batch_size)
        notes.append(why)
    decoder = prepare_for_decoding(model, batch_size=batch_size, compile=compile, int8=int8, notes=notes)
    return decoder, tokenizer, meta

