"""The products of a decode step, and which way of computing them is fastest on this machine, measured.

A decode step multiplies a few rows (one per sequence of the batch) by every weight matrix of the model. That
streams each matrix from memory once per token, and how fast a kernel streams it depends on the CPU, the
dtype and the matrix's layout, in ways no rule predicts (the kernels for one row are not the ones tuned for
training's large products). So the candidates are timed on the model's largest matrix, the head, with as many
rows as the batch will decode, and the fastest is used when it beats PyTorch's default by a clear margin:

    layout   `out_in`: nn.Linear's own (out, in) layout; `in_out`: the same matrix stored transposed in memory
             (`GPT.prepare_for_inference`), which some BLAS kernels stream faster for few rows
    oneDNN   on (PyTorch's default) or off around the decode step: with it on, CPU bfloat16 products go to
             oneDNN, otherwise to PyTorch's own kernels, and the two differ most for a single row

int8 weights (`model/int8.py`) have a kernel of their own; what is chosen for them is the dtype of the
activations it multiplies, whose kernels also differ (`choose_int8_activation_dtype`).

Every measurement is injected in the tests (`measure=`), which check that the choice follows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minigpt.device.probe import synchronize
from minigpt.model.int8 import has_packed_kernel, quantize_per_channel

# A candidate must beat the default by this factor to be chosen: the layouts and kernels that differ at all
# differ by 2x and more, so a smaller ratio is timing noise on a shared machine, not a reason to change.
MIN_SPEEDUP = 1.2


@dataclass(frozen=True)
class ProductSetup:
    """How a decode step computes its float products. The default is PyTorch's own behaviour."""

    in_out_layout: bool = False  # weights stored (in, out) in memory (shape and values unchanged)
    onednn: bool = True  # torch.backends.mkldnn.enabled during the step

    @property
    def name(self) -> str:
        return f"{'in_out' if self.in_out_layout else 'out_in'}{'' if self.onednn else ' without oneDNN'}"


DEFAULT = ProductSetup()


def candidates(weight: torch.Tensor) -> list[ProductSetup]:
    """The setups worth timing for `weight`'s dtype and device: none but the default off a CPU; oneDNN only
    matters for 16-bit products (float32 ones go to the BLAS library either way)."""
    if weight.device.type != "cpu":
        return [DEFAULT]
    onednn = (True, False) if weight.dtype != torch.float32 else (True,)
    return [ProductSetup(layout, flag) for layout in (False, True) for flag in onednn]


def _interleaved_best(calls: dict, repeats: int, device: torch.device) -> dict:
    """Best seconds of each zero-argument call, timed in rounds (A B C, A B C, ...) after a warm-up round."""
    best = dict.fromkeys(calls, float("inf"))
    for round_ in range(repeats + 1):
        for key, call in calls.items():
            synchronize(device)
            start = time.perf_counter()
            call()
            synchronize(device)
            if round_:
                best[key] = min(best[key], time.perf_counter() - start)
    return best


def time_products(weight: torch.Tensor, rows: int, setups: list[ProductSetup],
                  repeats: int = 5) -> dict[ProductSetup, float]:
    """Best seconds of `rows` rows times `weight`ᵀ (out, in) under each setup."""
    w = weight.detach()
    layouts = {False: w.contiguous(), True: w.t().contiguous().t()}  # (out, in) both; strides differ
    x = torch.ones(rows, w.shape[1], dtype=w.dtype, device=w.device)  # (rows, in)

    def product(setup: ProductSetup) -> Callable[[], None]:
        def call() -> None:
            saved = torch.backends.mkldnn.enabled
            torch.backends.mkldnn.enabled = setup.onednn
            try:
                F.linear(x, layouts[setup.in_out_layout])  # (rows, out)
            finally:
                torch.backends.mkldnn.enabled = saved
        return call

    return _interleaved_best({s: product(s) for s in setups}, repeats, w.device)


def choose_products(
    weight: torch.Tensor, rows: int,
    measure: Callable[[torch.Tensor, int, list[ProductSetup]], dict[ProductSetup, float]] = time_products,
) -> tuple[ProductSetup, str]:
    """The setup for decoding `rows` rows with matrices like `weight` (the head's), and why."""
    setups = candidates(weight)
    if setups == [DEFAULT]:
        return DEFAULT, f"{DEFAULT.name}: nothing to choose on {weight.device.type}"
    times = measure(weight, rows, setups)
    best = min(times, key=times.get)
    speedup = times[DEFAULT] / times[best]
    measured = ", ".join(f"{s.name} {t * 1e3:.2f} ms" for s, t in times.items())
    if best == DEFAULT or speedup < MIN_SPEEDUP:
        return DEFAULT, f"{DEFAULT.name}: {measured} (nothing {MIN_SPEEDUP}x faster)"
    return best, f"{best.name}: {measured} ({speedup:.2f}x the default)"


def time_int8_activations(weight: torch.Tensor, rows: int, dtypes: list[torch.dtype],
                          repeats: int = 5) -> dict[torch.dtype, float]:
    """Best seconds of `_weight_int8pack_mm` on `weight` quantised, `rows` rows of each activation dtype."""
    q, scale = quantize_per_channel(weight)
    q = q.to(weight.device)

    def product(dtype: torch.dtype) -> Callable[[], None]:
        x = torch.ones(rows, q.shape[1], dtype=dtype, device=q.device)  # (rows, in)
        s = scale.to(device=q.device, dtype=dtype)
        return lambda: torch.ops.aten._weight_int8pack_mm(x, q, s)  # (rows, out)

    return _interleaved_best({d: product(d) for d in dtypes}, repeats, q.device)


Int8Measure = Callable[[torch.Tensor, int, list[torch.dtype]], dict[torch.dtype, float]]


def choose_int8_activation_dtype(
    weight: torch.Tensor, rows: int, measure: Int8Measure = time_int8_activations
) -> tuple[torch.dtype, str]:
    """The activation dtype of an int8 model on a CPU (float32 unless bfloat16's kernel is clearly faster),
    and why. On a GPU: bfloat16 where it has it, else float16, as for 16-bit weights."""
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
