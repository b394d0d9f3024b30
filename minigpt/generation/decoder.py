"""Making a loaded model a decoder: its weights' dtype and layout, and the step that runs it.

    load_decoder(checkpoint, ...)   the checkpoint read as the generate command asks (`weights_dtype=`,
                                    int8 included), then `prepare_for_decoding`
    prepare_for_decoding(model)     eval mode, the kernels measured on this machine (the products' layout and
                                    the attention, generation/kernels.py), and the decode step, eager or
                                    compiled (generation/step.py)

What was chosen, and the measurement it was chosen on, is kept in `Decoder.notes` and logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from minigpt.checkpoint.load import load_model
from minigpt.generation.kernels import Kernels, choose_int8_activation_dtype, choose_kernels
from minigpt.generation.step import DecodeStep
from minigpt.model.gpt import GPT
from minigpt.model.int8 import quantize_int8

log = logging.getLogger(__name__)


@dataclass
class Decoder:
    """A model ready to decode, the step that runs it, and what was decided on the way (for the log)."""

    model: GPT
    step: DecodeStep
    notes: list[str] = field(default_factory=list)


def prepare_for_decoding(model: GPT, *, batch_size: int = 1, compile: bool = False, int8: bool = False,
                         kernels: Kernels | None = None, notes: list[str] | None = None) -> Decoder:
    """Eval mode, weights laid out and kernels chosen for `batch_size` rows (measured unless `kernels` is
    given), and the decode step (`compile`). `int8`: the model's linears are already int8 (`quantize_int8`),
    whose kernel has no layout to choose."""
    notes = list(notes or [])
    if kernels is None:
        kernels, why = choose_kernels(model, batch_size, int8, compile)
        notes.extend(why)
    model.prepare_for_inference(kernels.layout, batch_size, kernels.attention, kernels.head_layout)
    step = DecodeStep(model, compile=compile, kernels=kernels)
    notes.append(f"decode step {'compiled' if step.compiled else 'eager'}")
    for note in notes:
        log.debug("%s", note)
    return Decoder(model, step, notes)


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

