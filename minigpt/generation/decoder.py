"""A checkpoint loaded as the generate command decodes it: the weights in the dtype asked for (int8 quantised
on load), and the fastest decode step for them on this machine (minigpt/fast/).
"""

from __future__ import annotations

from typing import Any

from minigpt.checkpoint.load import load_model
from minigpt.fast.fastest import fastest_step
from minigpt.fast.int8 import quantize_for_decoding
from minigpt.fast.step import DecodeStep


def load_decoder(checkpoint: str | None, device: str, weights_dtype: str, *, compile: bool = False,
                 batch_size: int = 1) -> tuple[DecodeStep, Any, dict]:
    """(decode step, tokenizer, meta) of `checkpoint` (None: the newest run under outputs/), with the weights
    in `weights_dtype` (int8: quantised from float32 on load) on `device`, for `batch_size` rows; the step's
    `model` is the model it decodes with."""
    int8 = weights_dtype == "int8"
    model, tokenizer, meta = load_model(checkpoint, device, "float32" if int8 else weights_dtype)
    if int8:
        model, _ = quantize_for_decoding(model, batch_size)
    return fastest_step(model, rows=batch_size, compile=compile), tokenizer, meta
