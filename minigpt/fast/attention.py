"""The attention of a decode step's one query, and which backend runs it fastest here, measured.

A decode step attends with one new query per row over the cached keys. That is small, and which kernel runs
it with the least overhead depends on the dtype, the cache's length and whether the step is compiled (the
library's kernels are built for many queries, and under compilation a one-query call can cost more than the
eager one). The candidates, each a function the model's layers can be handed (`hand_attention`):

    sdpa      torch's fused kernel (the model's own backend by default)
    math      the scores, the softmax and the weighted sum as three ops
    streamed  the same written as reductions (streamed.py), which Inductor generates as one pass over the
              cache: for a compiled step only, since eagerly it materialises every product

Each is timed at cache lengths across the context, in the model's dtype, every layer one after the other as a
step attends, under the oneDNN flag the step runs with (16-bit `math` products are oneDNN's when it is on) and
compiled where the step will be. Every backend computes the same attention (tests/model and
tests/fast/test_streamed.py compare them with the formula), so the choice changes speed, not tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from minigpt.device.runtime import compile_problem
from minigpt.fast.compiler import OneDNN, compile_own
from minigpt.fast.streamed import streamed_attention
from minigpt.fast.timing import MIN_SPEEDUP, interleaved_best
from minigpt.model.attention import OneQueryAttention, math_attention, sdpa_attention
from minigpt.model.config import ModelConfig
from minigpt.model.gpt import GPT

EAGER_BACKENDS = ("sdpa", "math")  # the backends an eager step can use (`online` is for teaching)
COMPILED_BACKENDS = (*EAGER_BACKENDS, "streamed")

# Each backend as a one-query attention: q (B, H, 1, D), k/v (B, H_kv, S, D), mask, scale -> (B, H, 1, D)
ONE_QUERY: dict[str, OneQueryAttention] = {
    "sdpa": lambda q, k, v, mask, scale=None: sdpa_attention(q, k, v, mask, False, 0.0, scale),
    "math": lambda q, k, v, mask, scale=None: math_attention(q, k, v, mask, False, None, scale)[0],
    "streamed": streamed_attention,
}


def hand_attention(model: GPT, backend: str | None) -> None:
    """Hand every layer of `model` the one-query attention of `backend` (one of ONE_QUERY) for its decode
    steps, through the hook model/attention.py leaves for it (`decode_attention`); None: each layer's own."""
    attend = None if backend is None else ONE_QUERY[backend]
    for block in model.transformer.h:
        block.attn.decode_attention = attend


def cache_lengths(block_size: int) -> list[int]:
    """The cache lengths a one-query attention is timed at: from a short prompt's to a full context."""
    return sorted({max(1, block_size // 8), max(1, block_size // 2), block_size})


def _attend_layers(attend: OneQueryAttention, qs: list[torch.Tensor], ks: list[torch.Tensor],
                   vs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [attend(q, k, v, None) for q, k, v in zip(qs, ks, vs, strict=True)]  # (B, H, 1, D) each


def attention_layers(backend: str, device: torch.device, compile: bool) -> Callable:
    """(qs, ks, vs) -> every layer's one-query attention by `backend`, eager or compiled as a step compiles
    it (dynamic shapes: one graph for every cache length; a function of its own, so its graphs are too)."""
    attend_layers = compile_own(_attend_layers, device, dynamic=True) if compile else _attend_layers
    return functools.partial(attend_layers, ONE_QUERY[backend])


def time_attention(config: ModelConfig, dtype: torch.dtype, device: torch.device, rows: int,
                   backends: tuple[str, ...], onednn: bool = True, compile: bool = False,
                   repeats: int = 5) -> dict[str, float]:
    """Best seconds of each backend attending with `rows` single queries in every layer, summed over
    `cache_lengths`, with oneDNN on or off as the step will have it and compiled where the step will be (the
    first calls, which compile, untimed)."""
    layers = {backend: attention_layers(backend, device, compile) for backend in backends}
    gen = torch.Generator().manual_seed(0)
    total = dict.fromkeys(layers, 0.0)
    with OneDNN(onednn), torch.no_grad():
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
    """The attention backend for decode steps of `rows` rows (`config`'s shape, activations in `dtype`, oneDNN
    on or off as in the step, compiled or not), and why. The model's own backend unless another is clearly
    faster (`online` is compared as sdpa)."""
    own = config.attention if config.attention in EAGER_BACKENDS else "sdpa"
    compiled = compile and compile_problem(device) is None  # timed as the step will run them
    backends = COMPILED_BACKENDS if compiled else EAGER_BACKENDS
    times = measure(config, dtype, device, rows, backends, onednn, compiled)
    best = min(times, key=times.get)
    measured = ", ".join(f"{backend} {t * 1e3:.2f} ms" for backend, t in times.items())
    if times[own] / times[best] < MIN_SPEEDUP:
        return own, f"{own} attention: {measured} (nothing {MIN_SPEEDUP}x faster)"
    return best, f"{best} attention: {measured} ({times[own] / times[best]:.2f}x {own})"
