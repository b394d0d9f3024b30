"""The decode step: the forward of the newest token of every row, as the decoding loops call it.

    step(tokens (B, T), cache) -> their logits (B, T, V); T is 1, except where speculative decoding
                                  verifies several drafted tokens at once

Eager, it is `model(tokens, kv_cache=cache, last_only=True)`: a few dozen small ops per layer, each
dispatched from Python, which for a small model costs more than the arithmetic. Compiled (`compile=true`),
the same function goes through torch.compile: Inductor fuses the elementwise ops and norms into a few
generated kernels (C++ on a CPU, Triton on CUDA) and calls the matrix products directly, so a step costs
little beyond reading the weights. Dynamic shapes make one compiled graph serve every cache length (and
the few query lengths speculative decoding verifies), instead of a compilation per length.

The cache is written in place under compilation too (model/kv_cache.py says why its layers have buffers
of their own); tests/generation/test_step.py checks the compiled step's tokens and logits against the
eager one's and counts the bytes its kernels touch.

Compiling needs a C++ compiler on a CPU (Triton on CUDA); without one the step stays eager, and one log
line says why. The first call compiles (tens of seconds on a small CPU; Inductor's disk cache makes
later runs quicker), so compiling pays for long generations, not for a short sample.
"""

from __future__ import annotations

import logging

import torch

from minigpt.device.runtime import compile_problem
from minigpt.generation.products import DEFAULT, ProductSetup
from minigpt.model.kv_cache import KVCache

log = logging.getLogger(__name__)


def _logits(model: torch.nn.Module, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    return model(tokens, kv_cache=cache)[0]  # (B, T, V)


class DecodeStep:
    """tokens (B, T) fed on top of `cache` -> their logits (B, T, V); eager or compiled (a `DecodeFn`).

    `products` is applied around every call (oneDNN on or off, generation/products.py); `compiled` says
    what was asked and could be honoured."""

    def __init__(self, model: torch.nn.Module, *, compile: bool = False, products: ProductSetup = DEFAULT):
        self.model, self.products = model, products
        self.device = device = next(model.parameters()).device
        problem = compile_problem(device) if compile else None
        if problem:
            log.warning("compile=true: decoding eagerly, since %s", problem)
        self.compiled = compile and problem is None
        self._forward = torch.compile(_logits, dynamic=True) if self.compiled else _logits

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        saved = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = self.products.onednn
        try:
            return self._forward(self.model, tokens, cache)
        finally:
            torch.backends.mkldnn.enabled = saved
