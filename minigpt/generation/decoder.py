"""A checkpoint loaded as the generate command decodes it: the weights in the dtype asked for (int8 quantised
on load), and the fastest decode step for them on this machine (minigpt/fast/), compiled as `compile` says:
true, false, or auto (auto.py decides from what the decode-step cache knows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minigpt.checkpoint.load import load_model
from minigpt.fast.fastest import fastest_step
from minigpt.fast.int8 import quantize_for_decoding
from minigpt.fast.kept import FOLDER, StepCache
from minigpt.fast.step import DecodeStep
from minigpt.generation.auto import choose_compile


def load_decoder(checkpoint: str | None, device: str, weights_dtype: str, *, compile: str = "false",
                 batch_size: int = 1, steps: int = 0,
                 cache_dir: str | Path | None = None) -> tuple[DecodeStep, Any, dict, str]:
    """(decode step, tokenizer, meta, why compile=auto chose as it did or '') of `checkpoint` (None: the
    newest run under outputs/), with the weights in `weights_dtype` (int8: quantised from float32 on load)
    on `device`, for `batch_size` rows decoding about `steps` tokens each; the step's `model` is the model it
    decodes with. A compiled step is kept in (and read from) `cache_dir`/decode/ where a folder is given."""
    int8 = weights_dtype == "int8"
    model, tokenizer, meta = load_model(checkpoint, device, "float32" if int8 else weights_dtype)
    if int8:
        model, _ = quantize_for_decoding(model, batch_size)
    cache = StepCache(Path(cache_dir) / FOLDER) if cache_dir is not None else None
    compiled, why = compile == "true", ""
    if compile == "auto":
        compiled, why = choose_compile(model, batch_size, steps, cache)
        why = f"compile=auto: {why}"
    step = fastest_step(model, rows=batch_size, compile=compiled, cache=cache if compiled else None)
    return step, tokenizer, meta, why

