"""The decode step: the forward of the newest token of every row, as the decoding loops call it.

    step(tokens (B, T), cache) -> their logits (B, T, V); T is 1, except where speculative decoding
                                  verifies several drafted tokens at once

Eager, it is `model(tokens, kv_cache=cache, last_only=True)`: a few dozen small ops per layer, each
dispatched from Python, which for a small model costs more than the arithmetic. Compiled (`compile=true`),
the same function goes through torch.compile: Inductor fuses the elementwise ops and norms into a few
generated kernels (C++ on a CPU, Triton on CUDA) and calls the matrix products directly, so a step costs
little beyond reading the weights. Dynamic shapes make one compiled graph serve every cache length (and
the few query lengths speculative decoding verifies), instead of a compilation per length. On a CPU the
kernels are called from a generated C++ function (Inductor's `cpp_wrapper`) rather than from Python, one by
one: what is left of a small model's step after fusion is mostly those calls.

Before every call of a compiled function, Dynamo checks that nothing its graph was traced from has changed:
for a model, hundreds of checks of its modules' attributes, which cost more than a small model's whole step.
A decode step's model is fixed once it is prepared (eval mode, its kernels chosen), so those checks are
skipped (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`; the checks of the tensors' shapes and dtypes
stay). What makes that safe is that no other model can reach the step's graphs: Dynamo keeps graphs per code
object, and each step compiles a copy of `_logits` with a code object of its own
(tests/generation/test_step.py decodes two models that differ only in such an attribute, one after the other).

The cache is written in place under compilation too (model/kv_cache.py says why its layers have buffers
of their own); tests/generation/test_step.py checks the compiled step's tokens and logits against the
eager one's and counts the bytes its kernels touch.

Where the kernels chosen for the step say `frozen` (generation/kernels.py), the step compiles under Inductor's
frozen settings: the weights become constants of the graph and Inductor times its own kernels for each
product. The compiled code then holds its own copies of the weights, which is why the step's model must not
change once it is prepared.

Compiling needs a C++ compiler on a CPU (Triton on CUDA); without one the step stays eager, and one log
line says why. The first call compiles (tens of seconds on a small CPU; Inductor's disk cache makes
later runs quicker), so compiling pays for long generations, not for a short sample.
"""

from __future__ import annotations

import logging

import torch

from minigpt.device.runtime import compile_problem
from minigpt.generation.kernels import DEFAULT, Kernels, OneDNN, compile_own, frozen_inductor
from minigpt.model.kv_cache import KVCache

log = logging.getLogger(__name__)


def _logits(model: torch.nn.Module, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    return model(tokens, kv_cache=cache)[0]  # (B, T, V)


class DecodeStep:
    """tokens (B, T) fed on top of `cache` -> their logits (B, T, V); eager or compiled (a `DecodeFn`).

    `kernels.onednn` is applied around every call (generation/kernels.py; the layout and the attention are the
    model's own, set when it was prepared), and so are Inductor's frozen settings where `kernels.frozen` asks
    for them (they take effect when a call compiles); `compiled` says what was asked and could be honoured."""

    def __init__(self, model: torch.nn.Module, *, compile: bool = False, kernels: Kernels = DEFAULT):
        self.model, self.kernels = model, kernels
        self.device = device = next(model.parameters()).device
        problem = compile_problem(device) if compile else None
        if problem:
            log.warning("compile=true: decoding eagerly, since %s", problem)
        self.compiled = compile and problem is None
        # dynamic shapes, the graphs its own and the modules' checks skipped (see the module docstring)
        self._forward = compile_own(_logits, device, dynamic=True) if self.compiled else _logits
        self._onednn = OneDNN(kernels.onednn)
        self._frozen = frozen_inductor() if self.compiled and kernels.frozen else None

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        with self._onednn:
            if self._frozen is not None:  # any call may compile (a new query length)
                with self._frozen:
                    return self._forward(self.model, tokens, cache)
            return self._forward(self.model, tokens, cache)
