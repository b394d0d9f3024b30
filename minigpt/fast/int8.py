"""int8 weights for decoding: a model quantised (model/int8.py) with its activations in the dtype measured
fastest for the int8 kernel here.

`torch.ops.aten._weight_int8pack_mm` multiplies float activations by int8 matrices. On a CPU its float32 path
runs a scalar loop and its bfloat16 path vector instructions, so which is faster depends on the CPU: both are
timed, and bfloat16 is taken where it is MIN_SPEEDUP faster. On a GPU the activations are 16-bit, as for
16-bit weights.

A layer whose input width that kernel cannot take in 16 bits computes the formula instead (model/int8.py), and
compiled on a CPU, Inductor turns that formula back into the same kernel, which then returns garbage or
crashes the process (docs/decoding.md): such a model is not compiled (`int8_compile_problem`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from minigpt.fast.timing import MIN_SPEEDUP, interleaved_best
from minigpt.model.gpt import GPT
from minigpt.model.int8 import Int8Linear, has_packed_kernel, quantize_int8, quantize_per_channel

log = logging.getLogger(__name__)


def time_int8_activations(weight: torch.Tensor, rows: int, dtypes: list[torch.dtype],
                          repeats: int = 5) -> dict[torch.dtype, float]:
    """Best seconds of `_weight_int8pack_mm` on `weight` quantised, `rows` rows of each activation dtype."""
    q, scale = quantize_per_channel(weight)
    q = q.to(weight.device)

    def product(dtype: torch.dtype) -> Callable[[], None]:
        x = torch.ones(rows, q.shape[1], dtype=dtype, device=q.device)  # (rows, in)
        s = scale.to(device=q.device, dtype=dtype)
        return lambda: torch.ops.aten._weight_int8pack_mm(x, q, s)  # (rows, out)

    return interleaved_best({d: product(d) for d in dtypes}, repeats, q.device)


Int8Measure = Callable[[torch.Tensor, int, list[torch.dtype]], dict[torch.dtype, float]]


def choose_int8_activation_dtype(
    weight: torch.Tensor, rows: int, measure: Int8Measure = time_int8_activations
) -> tuple[torch.dtype, str]:
    """The activation dtype of an int8 model on a CPU (float32 unless bfloat16's kernel is clearly faster),
    and why. On a GPU: bfloat16 where it has it, else float16."""
    if weight.device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return dtype, f"{str(dtype).removeprefix('torch.')} activations on CUDA"
    if not has_packed_kernel(weight.device, torch.bfloat16, weight.shape[1]):
        return torch.float32, f"float32 activations: no bfloat16 int8 kernel for {weight.shape[1]} inputs"
    times = measure(weight, rows, [torch.float32, torch.bfloat16])
    speedup = times[torch.float32] / times[torch.bfloat16]
    measured = f"float32 {times[torch.float32] * 1e3:.2f} ms, bfloat16 {times[torch.bfloat16] * 1e3:.2f} ms"
    if speedup >= MIN_SPEEDUP:
        return torch.bfloat16, f"bfloat16 activations: {measured} ({speedup:.2f}x)"
    return torch.float32, f"float32 activations: {measured} (bfloat16 not {MIN_SPEEDUP}x faster)"


def quantize_for_decoding(model: GPT, rows: int = 1) -> tuple[GPT, str]:
    """`model` (float32) with int8 linears, in place, its activations in the dtype measured fastest for their
    kernel with `rows` rows; and why (also logged)."""
    dtype, why = choose_int8_activation_dtype(model.lm_head.weight, rows)
    why = f"int8 weights, {why}"
    log.debug("%s", why)
    return quantize_int8(model, dtype).eval(), why


def int8_compile_problem(model: GPT) -> str | None:
    """Why `model`'s int8 layers cannot be compiled on this device, or None (see the module docstring)."""
    formula = [m for m in model.modules() if isinstance(m, Int8Linear) and not m.packed_kernel]
    if not formula or formula[0].q.device.type != "cpu" or formula[0].scale.dtype != torch.bfloat16:
        return None
    width = formula[0].in_features
    return f"Inductor turns a bfloat16 int8 product of {width} inputs into a kernel needing multiples of 16"
