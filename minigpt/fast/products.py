"""The matrix products of a decode step, and which way of computing them is fastest here, measured.

A decode step multiplies a few rows (one per sequence of the batch) by every weight matrix of the model, so
the products stream each matrix from memory once per token, and how fast a kernel streams it depends on the
CPU, the dtype and the matrix's layout in ways no rule predicts (the kernels tuned for training's large
products are not the ones for one row). So each way is timed, on the matrices themselves, read one after the
other as a step reads them, and the fastest combination is used where it beats PyTorch's default by
MIN_SPEEDUP. The head and the blocks' matrices are chosen apart (a large vocabulary makes the head the
largest matrix by far). A way is a layout (layouts.py) and the oneDNN flag (compiler.OneDNN):

    out_in, in_out   plain matrices, under oneDNN on or off (which only matters for 16-bit ones)
    packed           oneDNN's blocked layout (packed.py): its calls cost more, but it streams faster
    frozen           for a compiled step only: the plain matrices frozen into the graph, each product's kernel
                     chosen by Inductor's own timing (compiler.FROZEN_INDUCTOR). Freezing reaches every plain
                     matrix of a step, so it is chosen for the head and the blocks together, or for one set
                     while the other is packed (an operator Inductor does not touch)

int8 matrices (model/int8.py) have a kernel of their own and nothing here to choose (int8.py chooses the
dtype of their activations); a fourth layout, `streamed`, is judged on whole steps (whole_steps.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.device.runtime import compile_problem
from minigpt.fast.compiler import OneDNN, compile_own, frozen_inductor
from minigpt.fast.packed import can_pack, pack, packed_linear
from minigpt.fast.step import DEFAULT, Plan
from minigpt.fast.timing import MIN_SPEEDUP, interleaved_best

# A way to compute products: a layout (or frozen) and the oneDNN flag (a packed matrix is oneDNN's either way)
Products = tuple[str, bool]
DEFAULT_PRODUCTS: Products = ("out_in", True)


def product_candidates(weight: torch.Tensor, compile: bool = False) -> list[Products]:
    """The ways worth timing for matrices of `weight`'s dtype and device: none but the default off a CPU;
    oneDNN on or off only matters for plain 16-bit matrices (float32 ones go to BLAS either way); frozen
    only for a step that will be compiled."""
    if weight.device.type != "cpu":
        return [DEFAULT_PRODUCTS]
    flags = (True, False) if weight.dtype != torch.float32 else (True,)
    plain = [(layout, flag) for layout in ("out_in", "in_out") for flag in flags]
    packed = [("packed", True)] if can_pack(weight) else []
    frozen = [("frozen", True)] if compile and compile_problem(weight.device) is None else []
    return plain + packed + frozen


def _products(layers: nn.ModuleList, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [layer(x) for layer, x in zip(layers, xs, strict=True)]  # (rows, out) each


def compiled_products(layers: list[nn.Module], frozen: bool) -> Callable[[list[torch.Tensor]],
                                                                         list[torch.Tensor]]:
    """`layers` (linear layers of any kind) applied each to its own input, compiled as a CPU step compiles
    them, frozen (Inductor chooses and times the kernels at the first call) or not: xs -> [layer(x)]."""
    modules = nn.ModuleList(layers)
    # Static shapes: a step's matrices are, and so is its input's width (what a dynamic `in` would not be)
    device = [*modules.parameters(), *modules.buffers()][0].device
    compiled = compile_own(_products, device, dynamic=False)
    settings = frozen_inductor() if frozen else contextlib.nullcontext()

    def call(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad(), settings:
            return compiled(modules, xs)
    return call


def _linear(weight: torch.Tensor) -> nn.Linear:
    """An nn.Linear without bias whose matrix is `weight` (out, in) itself."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    return linear


def time_products(matrices: list[torch.Tensor], rows: int, ways: list[Products],
                  repeats: int = 5) -> dict[Products, float]:
    """Best seconds of `rows` rows times each of `matrices` (out, in), one after the other, in each way: as a
    decode step reads them, so a set larger than the caches streams from memory as it will then."""
    xs = [torch.ones(rows, w.shape[1], dtype=w.dtype, device=w.device) for w in matrices]  # (rows, in)
    stored = {"out_in": [w.detach().contiguous() for w in matrices],
              "in_out": [w.detach().t().contiguous().t() for w in matrices]}  # (out, in) both; strides differ
    if any(layout == "packed" for layout, _ in ways):
        stored["packed"] = [pack(w, rows) for w in matrices]
    compiled = {"frozen": compiled_products([_linear(w) for w in matrices], frozen=True)} \
        if ("frozen", True) in ways else {}

    def products(layout: str, onednn: bool) -> Callable[[], None]:
        def call() -> None:
            with OneDNN(onednn):
                if layout in compiled:
                    compiled[layout](xs)
                    return
                for x, w, m in zip(xs, matrices, stored[layout], strict=True):
                    if layout == "packed":
                        packed_linear(x, m, None, w.shape[0])  # (rows, out)
                    else:
                        F.linear(x, m)  # (rows, out)
        return call

    return interleaved_best({way: products(*way) for way in ways}, repeats, matrices[0].device)


ProductMeasure = Callable[[list[torch.Tensor], int, list[Products]], dict[Products, float]]


def _combination(head: Products, blocks: Products, flag: bool) -> Plan | None:
    """The plan that computes the head `head`'s way and the blocks `blocks`' way under oneDNN `flag`, or None
    where no step can: a frozen step freezes every plain matrix (a packed one keeps its own kernel), and a
    frozen matrix was timed with oneDNN on."""
    layouts = {head[0], blocks[0]}
    if "frozen" in layouts and (not flag or layouts - {"frozen", "packed"}):
        return None
    if any(way[1] != flag and way[0] not in ("frozen", "packed") for way in (head, blocks)):
        return None
    plain = lambda layout: "out_in" if layout == "frozen" else layout
    return Plan(plain(blocks[0]), plain(head[0]), flag, frozen="frozen" in layouts)


def choose_products(head: torch.Tensor, blocks: list[torch.Tensor], rows: int, compile: bool = False,
                    measure: ProductMeasure = time_products) -> tuple[Plan, str]:
    """The layouts (the head's and the blocks' matrices), oneDNN flag and freezing for decoding `rows` rows
    (with a compiled step: `compile`), and why: each set of matrices timed in every way, the fastest
    combination a step can run kept if it beats the default by MIN_SPEEDUP."""
    ways = product_candidates(head, compile)
    if ways == [DEFAULT_PRODUCTS]:
        return DEFAULT, f"{DEFAULT.name}: nothing to choose on {head.device.type}"
    head_s = measure([head], rows, ways)
    blocks_s = measure(blocks, rows, ways) if blocks else dict.fromkeys(ways, 0.0)
    totals = {}
    for flag in sorted({flag for _, flag in ways}, reverse=True):
        for h in ways:
            for b in ways:
                plan = _combination(h, b, flag)
                if plan is not None and head_s[h] + blocks_s[b] < totals.get(plan, float("inf")):
                    totals[plan] = head_s[h] + blocks_s[b]
    best = min(totals, key=totals.get)
    default_s = head_s[DEFAULT_PRODUCTS] + blocks_s[DEFAULT_PRODUCTS]
    measured = f"head {_ways(head_s)}; {len(blocks)} block matrices {_ways(blocks_s)}"
    if best == DEFAULT or default_s / totals[best] < MIN_SPEEDUP:
        return DEFAULT, f"{DEFAULT.name}: {measured} (nothing {MIN_SPEEDUP}x faster)"
    return best, (f"{best.name}: {measured} ({totals[best] * 1e3:.2f} ms against {default_s * 1e3:.2f}, "
                  f"{default_s / totals[best]:.2f}x)")


def _ways(seconds: dict[Products, float]) -> str:
    return ", ".join(f"{layout}{'' if flag else ' without oneDNN'} {s * 1e3:.2f} ms"
                     for (layout, flag), s in seconds.items())
