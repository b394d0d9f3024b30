"""The kernels of a decode step, and which are fastest on this machine, measured.

A decode step multiplies a few rows (one per sequence of the batch) by every weight matrix of the model, and
attends with one query per row over the cached keys. The products stream each matrix from memory once per
token, and how fast a kernel streams it depends on the CPU, the dtype and the matrix's layout in ways no rule
predicts (the kernels tuned for training's large products are not the ones for one row). The attention is
small, and which kernel runs it with the least overhead depends on the dtype and the cache's length. So the
candidates are timed, and the fastest is used when it beats PyTorch's default by a clear margin:

    layout     how the linear layers' matrices are stored (GPT.prepare_for_inference): `out_in`, nn.Linear's
               own; `in_out`, the same matrix transposed in memory; `packed`, oneDNN's blocked layout for the
               batch's rows (model/packed.py), whose calls cost more but stream faster. Chosen apart for the
               head and for the blocks' matrices, each timed on the matrices themselves, read one after the
               other as a step reads them. (A fourth layout, `streamed`, is for compiled steps and is timed
               on whole steps: generation/decoder.py.)
    oneDNN     on (PyTorch's default) or off around the step: with it on, CPU bfloat16 products of plain
               matrices go to oneDNN, otherwise to PyTorch's own kernels, and the two differ most for one row
    attention  the backend of a one-query step (`decode_backend` in model/attention.py): `sdpa`, torch's
               fused kernel, or `math`, the scores, the softmax and the weighted sum as three ops; for a
               compiled step also `streamed`, the same written as reductions Inductor generates as one pass
               over the cache. Timed at cache lengths across the context, in the model's dtype, one layer
               after the other as a step attends, and compiled as the step compiles them where it will be.

    frozen     for a compiled step only (generation/step.py): the matrices stay plain and are frozen into the
               compiled graph as constants, and Inductor chooses each product's kernel itself, timing its own
               generated GEMM against the library's on that matrix (max-autotune). It applies to every plain
               matrix of the step, so it is chosen for the head and the blocks together, or for one set while
               the other is packed (an operator Inductor does not touch).

int8 weights (model/int8.py) have a kernel of their own; what is chosen for them is the dtype of the
activations it multiplies (`choose_int8_activation_dtype`) and the attention as above. Their compiled step is
never frozen: with Inductor's own GEMMs in the running, a frozen 6 x 384 int8 step whose attention was `math`
or `streamed` returned wrong logits (torch 2.13 on a CPU; docs/decoding.md), where its products timed alone
were right, so no product timing could have caught it.

Every measurement is injected in the tests (`measure=`), which check that the choice follows it.
"""

from __future__ import annotations

import contextlib
import functools
import time
import types
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.device.probe import synchronize
from minigpt.device.runtime import compile_problem
from minigpt.model.attention import math_attention, sdpa_attention, streamed_attention
from minigpt.model.config import ModelConfig
from minigpt.model.gpt import GPT
from minigpt.model.int8 import has_packed_kernel, quantize_per_channel
from minigpt.model.packed import can_pack, pack, packed_linear

# A candidate must beat the default by this factor to be chosen: the layouts and kernels that differ at all
# differ by 1.5x and more, so a smaller ratio is timing noise on a shared machine, not a reason to change.
MIN_SPEEDUP = 1.2
ATTENTION_BACKENDS = ("sdpa", "math")  # the backends a one-query step can use (online is for teaching)
COMPILED_ATTENTION_BACKENDS = (*ATTENTION_BACKENDS, "streamed")  # and a compiled one: slow eagerly
# Inductor's settings for a step compiled with its weights frozen into it: each product's kernel timed by
# Inductor among its own generated GEMM and the library's, quietly (its tables would mix into the text).
FROZEN_INDUCTOR = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


@dataclass(frozen=True)
class Kernels:
    """How a decode step computes. The default is PyTorch's own behaviour and the model's own attention."""

    layout: str = "out_in"  # the blocks' matrices: one of GPT's LAYOUTS (GPT.prepare_for_inference)
    head_layout: str = "out_in"  # the head's, chosen apart: a large vocabulary makes it the largest by far
    onednn: bool = True  # torch.backends.mkldnn.enabled during the step
    attention: str | None = None  # the one-query step's attention backend; None: the model's own
    frozen: bool = False  # a compiled step freezes the weights; Inductor chooses the plain ones' kernels

    @property
    def name(self) -> str:
        layout = lambda name: "frozen" if self.frozen and name == "out_in" else name  # only plain ones freeze
        onednn = "" if self.onednn else ", without oneDNN"
        attention = f", {self.attention} attention" if self.attention else ""
        return f"head {layout(self.head_layout)}, blocks {layout(self.layout)}{onednn}{attention}"


DEFAULT = Kernels()
# A way to compute products: a layout and the oneDNN flag (a packed matrix is oneDNN's under either flag)
Products = tuple[str, bool]
DEFAULT_PRODUCTS: Products = ("out_in", True)


class OneDNN:
    """A block with `torch.backends.mkldnn.enabled` set to `enabled`, and the flag as it was after it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.saved = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = self.enabled

    def __exit__(self, *exc) -> None:
        torch.backends.mkldnn.enabled = self.saved


def interleaved_times(calls: dict, repeats: int, device: torch.device) -> dict[object, list[float]]:
    """Seconds of each zero-argument call in each of `repeats` rounds, after a warm-up round. Every round
    calls each once, the order reversed from one round to the next (A B C, C B A, ...), so no call always
    follows the same other one (a call after another on the same memory finds it in the caches)."""
    times: dict[object, list[float]] = {key: [] for key in calls}
    order = list(calls)
    for round_ in range(repeats + 1):
        for key in order:
            synchronize(device)
            start = time.perf_counter()
            calls[key]()
            synchronize(device)
            if round_:
                times[key].append(time.perf_counter() - start)
        order.reverse()
    return times


def interleaved_best(calls: dict, repeats: int, device: torch.device) -> dict:
    """Best seconds of each zero-argument call over `interleaved_times`' rounds."""
    return {key: min(seconds) for key, seconds in interleaved_times(calls, repeats, device).items()}


# --- the products -------------------------------------------------------------------------------------------


def product_candidates(weight: torch.Tensor, compile: bool = False) -> list[Products]:
    """The ways worth timing for matrices of `weight`'s dtype and device: none but the default off a CPU;
    oneDNN on or off only matters for plain 16-bit matrices (float32 ones go to BLAS either way); frozen
    only for a step that will be compiled (streamed is judged on whole steps: generation/decoder.py)."""
    if weight.device.type != "cpu":
        return [DEFAULT_PRODUCTS]
    flags = (True, False) if weight.dtype != torch.float32 else (True,)
    plain = [(layout, flag) for layout in ("out_in", "in_out") for flag in flags]
    packed = [("packed", True)] if can_pack(weight) else []
    frozen = [("frozen", True)] if compile and compile_problem(weight.device) is None else []
    return plain + packed + frozen


def compile_options(device: torch.device) -> dict:
    """torch.compile's options for a function of its own that runs fixed modules (a decode step, a set of
    products timed as one): the checks of the modules' attributes skipped where this torch can skip them
    (generation/step.py says why that is safe), and on a CPU the kernels called from generated C++."""
    # The graph's own check of every input's size and stride (a hundred per step, the weights included)
    # guards against a caller handing it other tensors, which no caller of such a copy can.
    options: dict = {"size_asserts": False}
    skip = getattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe", None)
    if skip:
        options["guard_filter_fn"] = skip
    if device.type == "cpu":
        options["cpp_wrapper"] = True  # the generated kernels called from C++, not one by one from Python
    return options


def compile_own(fn: Callable, device: torch.device, dynamic: bool) -> Callable:
    """`fn` compiled with `compile_options(device)` through a copy with a code object of its own: Dynamo keeps
    graphs per code object, so no other caller of `fn` shares its graphs (generation/step.py says why that
    matters once the modules' checks are skipped)."""
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
    return torch.compile(own, dynamic=dynamic, options=compile_options(device))


def frozen_inductor() -> AbstractContextManager:
    """Inductor's settings for compiling with the weights frozen (FROZEN_INDUCTOR), to enter around the calls
    that may compile."""
    from torch._inductor import config

    # Its autotuner calls a deprecated storage API, whose warning would land in the middle of generated text.
    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, r"torch\._inductor")
    return config.patch(FROZEN_INDUCTOR)


def _products(layers: nn.ModuleList, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [layer(x) for layer, x in zip(layers, xs, strict=True)]  # (rows, out) each


def compiled_products(layers: list[nn.Module], frozen: bool) -> Callable[[list[torch.Tensor]],
                                                                         list[torch.Tensor]]:
    """`layers` (linear layers of any kind) applied each to its own input, compiled as a CPU step compiles
    them, frozen (FROZEN_INDUCTOR: Inductor chooses and times the kernels at the first call) or not: xs ->
    [layer(x)]. The function is a copy of its own, so no other set of layers shares its graphs."""
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


def _combination(head: Products, blocks: Products, flag: bool) -> Kernels | None:
    """The kernels that compute the head `head`'s way and the blocks `blocks`' way under oneDNN `flag`, or
    None where no step can: a frozen step freezes every plain matrix (a packed one keeps its own kernel), and
    a frozen matrix was timed with oneDNN on."""
    layouts = {head[0], blocks[0]}
    if "frozen" in layouts and (not flag or layouts - {"frozen", "packed"}):
        return None
    if any(way[1] != flag and way[0] not in ("frozen", "packed") for way in (head, blocks)):
        return None
    plain = lambda layout: "out_in" if layout == "frozen" else layout
    return Kernels(plain(blocks[0]), plain(head[0]), flag, frozen="frozen" in layouts)


def choose_products(head: torch.Tensor, blocks: list[torch.Tensor], rows: int, compile: bool = False,
                    measure: ProductMeasure = time_products) -> tuple[Kernels, str]:
    """The layouts (the head's and the blocks' matrices) and oneDNN flag for decoding `rows` rows (with a
    compiled step: `compile`), and why: each set of matrices timed in every way, the fastest combination a
    step can run kept if it beats the default by MIN_SPEEDUP."""
    ways = product_candidates(head, compile)
    if ways == [DEFAULT_PRODUCTS]:
        return DEFAULT, f"{DEFAULT.name}: nothing to choose on {head.device.type}"
    head_s = measure([head], rows, ways)
    blocks_s = measure(blocks, rows, ways) if blocks else dict.fromkeys(ways, 0.0)
    totals = {}
    for flag in sorted({flag for _, flag in ways}, reverse=True):
        for h in ways:
            for b in ways:
                kernels = _combination(h, b, flag)
                if kernels is not None and head_s[h] + blocks_s[b] < totals.get(kernels, float("inf")):
                    totals[kernels] = head_s[h] + blocks_s[b]
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


# --- the attention of a one-query step ----------------------------------------------------------------------


def cache_lengths(block_size: int) -> list[int]:
    """The cache lengths a one-query attention is timed at: from a short prompt's to a full context."""
    return sorted({max(1, block_size // 8), max(1, block_size // 2), block_size})


# each backend attending one query per row and head: q (B, H, 1, D), k/v (B, H_kv, S, D) -> (B, H, 1, D)
_ATTEND = {"sdpa": lambda q, k, v: sdpa_attention(q, k, v, None, False, 0.0),
           "math": lambda q, k, v: math_attention(q, k, v, None, False)[0],
           "streamed": lambda q, k, v: streamed_attention(q, k, v, None)}


def _attend_layers(attend: Callable, qs: list[torch.Tensor], ks: list[torch.Tensor],
                   vs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [attend(q, k, v) for q, k, v in zip(qs, ks, vs, strict=True)]  # (B, H, 1, D) each


def attention_layers(backend: str, device: torch.device, compile: bool) -> Callable:
    """(qs, ks, vs) -> every layer's one-query attention by `backend`, eager or compiled as a step compiles
    it (dynamic shapes: one graph for every cache length; a function of its own, so its graphs are too)."""
    attend_layers = compile_own(_attend_layers, device, dynamic=True) if compile else _attend_layers
    return functools.partial(attend_layers, _ATTEND[backend])


def time_attention(config: ModelConfig, dtype: torch.dtype, device: torch.device, rows: int,
                   backends: tuple[str, ...], onednn: bool = True, compile: bool = False,
                   repeats: int = 5) -> dict[str, float]:
    """Best seconds of each backend attending with `rows` single queries in every layer, summed over
    `cache_lengths`, with oneDNN on or off as the step will have it (the math backend's 16-bit products go
    through it) and compiled where the step will be (`compile`; the first calls, which compile, untimed)."""
    layers = {backend: attention_layers(backend, device, compile) for backend in backends}
    with OneDNN(onednn), torch.no_grad():
        return _attention_times(config, dtype, device, rows, layers, repeats)


def _attention_times(config: ModelConfig, dtype: torch.dtype, device: torch.device, rows: int,
                     layers: dict[str, Callable], repeats: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    total = dict.fromkeys(layers, 0.0)
    for length in cache_lengths(config.block_size):
        qs = [torch.randn(rows, config.n_head, 1, config.head_dim, generator=gen)  # (B, H, 1, D)
              for _ in range(config.n_layer)]
        kv_shape = (rows, config.kv_heads, length, config.head_dim)  # (B, H_kv, S, D)
        ks, vs = ([torch.randn(kv_shape, generator=gen) for _ in range(config.n_layer)] for _ in range(2))
        qs, ks, vs = ([t.to(device=device, dtype=dtype) for t in ts] for ts in (qs, ks, vs))
        calls = {backend: functools.partial(attend, qs, ks, vs) for backend, attend in layers.items()}
        for backend, seconds in interleaved_best(calls, repeats, device).items():
            total[backend] += seconds
    return total


AttentionMeasure = Callable[[ModelConfig, torch.dtype, torch.device, int, tuple[str, ...], bool, bool],
                            dict[str, float]]


def choose_attention(config: ModelConfig, dtype: torch.dtype, device: torch.device, rows: int,
                     onednn: bool = True, compile: bool = False,
                     measure: AttentionMeasure = time_attention) -> tuple[str, str]:
    """The attention backend for one-query steps of `rows` rows (`config`'s shape, activations in `dtype`,
    oneDNN on or off as in the step, compiled or not), and why. The model's own backend unless another is
    clearly faster (`online` is compared as sdpa)."""
    own = config.attention if config.attention in ATTENTION_BACKENDS else "sdpa"
    compiled = compile and compile_problem(device) is None  # timed as the step will run them
    backends = COMPILED_ATTENTION_BACKENDS if compiled else ATTENTION_BACKENDS
    times = measure(config, dtype, device, rows, backends, onednn, compiled)
    best = min(times, key=times.get)
    measured = ", ".join(f"{backend} {t * 1e3:.2f} ms" for backend, t in times.items())
    if times[own] / times[best] < MIN_SPEEDUP:
        return own, f"{own} attention: {measured} (nothing {MIN_SPEEDUP}x faster)"
    return best, f"{best} attention: {measured} ({times[own] / times[best]:.2f}x {own})"


def choose_kernels(model: GPT, rows: int, int8: bool, compile: bool = False,
                   measure_products: ProductMeasure = time_products,
                   measure_attention: AttentionMeasure = time_attention) -> tuple[Kernels, list[str]]:
    """The kernels for decoding `rows` rows with `model` (`int8`: its linears are Int8Linear, whose product
    has no layout to choose; `compile`: the step will be compiled), and one line per choice saying why."""
    products, notes = DEFAULT, []
    if not int8:
        blocks = [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m is not model.lm_head]
        products, why = choose_products(model.lm_head.weight, blocks, rows, compile, measure_products)
        notes.append(f"products {why}")
    table = model.transformer.wte.weight  # float in every weights dtype: the activations' dtype and device
    attention, why = choose_attention(model.config, table.dtype, table.device, rows, products.onednn, compile,
                                      measure_attention)
    notes.append(f"attention {why}")
    return replace(products, attention=attention), notes


# --- int8 ---------------------------------------------------------------------------------------------------


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
