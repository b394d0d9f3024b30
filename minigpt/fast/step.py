"""A plan of how a decode step computes, and the step built from it.

    Plan                        a plain record (strings and flags): the matrices' layouts, the oneDNN flag,
                                the decode attention, frozen, compiled; what a choice returns and a cache of
                                choices could keep
    build_step(model, plan)     `model` laid out and handed its attention as `plan` says, and its DecodeStep
    DecodeStep                  the step itself: `decode_forward` (sampling/decode.py), eager or compiled

A step is what the decoding loops call: tokens (B, T) fed on top of a KV cache -> their logits (B, T, V); T is
1, except where speculative decoding verifies several drafted tokens at once. Compiled, it is one copy of
`decode_forward` per step (compiler.py says why), with dynamic shapes: one graph serves every cache length
(and the few query lengths speculative decoding verifies). The cache is written in place under compilation
too (model/kv_cache.py says why its layers have buffers of their own; tests/fast/test_step.py counts the bytes
each generated kernel touches).

Compiling needs a C++ compiler on a CPU (Triton on CUDA); without one the step stays eager, and one log line
says why. The first call compiles (seconds to a minute; Inductor's disk cache makes later runs quicker).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace

import torch

from minigpt.device.runtime import compile_problem
from minigpt.fast.attention import hand_attention
from minigpt.fast.compiler import OneDNN, compile_own, frozen_inductor
from minigpt.fast.layouts import lay_out
from minigpt.model.gpt import GPT
from minigpt.model.kv_cache import KVCache
from minigpt.sampling.decode import decode_forward

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """How a decode step computes. The default is the model as it is, eager: PyTorch's own behaviour."""

    layout: str = "out_in"  # the blocks' matrices: one of layouts.LAYOUTS
    head_layout: str = "out_in"  # the head's, chosen apart: a large vocabulary makes it the largest by far
    onednn: bool = True  # torch.backends.mkldnn.enabled during the step (compiler.OneDNN)
    attention: str | None = None  # the decode attention, one of attention.ONE_QUERY; None: the model's own
    frozen: bool = False  # compiled with the weights frozen: Inductor chooses the plain matrices' kernels
    compiled: bool = False  # the step through torch.compile

    @property
    def name(self) -> str:
        layout = lambda name: "frozen" if self.frozen and name == "out_in" else name  # only plain ones freeze
        onednn = "" if self.onednn else ", without oneDNN"
        attention = f", {self.attention} attention" if self.attention else ""
        return f"head {layout(self.head_layout)}, blocks {layout(self.layout)}{onednn}{attention}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> Plan:
        return cls(**fields)


DEFAULT = Plan()


class DecodeStep:
    """tokens (B, T) fed on top of `cache` -> their logits (B, T, V) (a `DecodeFn`): `decode_forward` on
    `model` as `plan` says, under its oneDNN flag, compiled (with Inductor's frozen settings where it freezes)
    or eager. `plan` says what the step does: asked to compile where nothing can, it is eager, and so
    recorded. `notes`: what was measured and decided on the way to this step, for the log."""

    def __init__(self, model: GPT, plan: Plan = DEFAULT) -> None:
        self.device = device = next(model.parameters()).device
        problem = compile_problem(device) if plan.compiled else None
        if problem:
            log.warning("compile=true: decoding eagerly, since %s", problem)
            plan = replace(plan, compiled=False, frozen=False)
        self.model, self.plan = model, plan
        self.notes: list[str] = []
        self._forward = compile_own(decode_forward, device, dynamic=True) if plan.compiled else decode_forward
        self._onednn = OneDNN(plan.onednn)
        self._frozen = frozen_inductor() if plan.compiled and plan.frozen else None

    @property
    def compiled(self) -> bool:
        return self.plan.compiled

    @property
    def name(self) -> str:
        return f"decode step {'compiled' if self.compiled else 'eager'}: {self.plan.name}"

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        with self._onednn:
            if self._frozen is not None:  # any call may compile (a new query length)
                with self._frozen:
                    return self._forward(self.model, tokens, cache)
            return self._forward(self.model, tokens, cache)


def build_step(model: GPT, plan: Plan, rows: int = 1) -> DecodeStep:
    """`model` in eval mode, laid out for `rows` rows and handed its decode attention as `plan` says (in
    place), and the step that runs it."""
    lay_out(model.eval(), plan.layout, rows, plan.head_layout)
    hand_attention(model, plan.attention)
    return DecodeStep(model, plan)
