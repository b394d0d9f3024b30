"""The compiled decode step (fast/step.py) against the eager one: the same tokens and logits, KV-cache
writes that stay in place under compilation, and a one-line fallback where no C++ compiler is found.

Inductor compiles through a C++ compiler it starts as a process, so the compiling tests are in the slow tier.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch._inductor.metrics as inductor_metrics
from torch._inductor.scheduler import ExternKernelSchedulerNode

from minigpt.fast.step import DecodeStep, Plan, build_step
from minigpt.fast.whole_steps import time_steps
from minigpt.generation.speculative import speculative_stream_tokens
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.kv_cache import KVCache
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

SAMPLED = SamplingParams(1.0, top_k=20)


def _model(block: int = 16, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=block, vocab_size=64,
               pos_encoding="rope", norm="rmsnorm", activation="swiglu", bias=False)
    model = build_model(ModelConfig(**{**cfg, **overrides})).eval()
    with torch.no_grad():  # sharp weights: a wrong context shows in every token (as in test_decode.py)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(15.0)
    return model


def _run(model, step, prompts, n, seed=0):
    return generate(model, prompts, max_new_tokens=n, params=SAMPLED,
                    generator=torch.Generator().manual_seed(seed), keep_logits=True, step=step)


def _decodes_as_eager(model, step: DecodeStep, new_tokens: int, verified_tokens: int):
    """`step` gives the eager step's tokens and logits for a batch of two (one row padded), and, verifying
    three drafted tokens at a time (several queries under a mask), the model's greedy tokens. Returns the
    batch's generation."""
    prompts = [[1, 2, 3], [4, 5]]
    eager, fast = _run(model, None, prompts, new_tokens), _run(model, step, prompts, new_tokens)
    assert fast.tokens == eager.tokens
    for a, b in zip(fast.logits, eager.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
    got = [s.emitted[0] for s in speculative_stream_tokens(
        model, _model(n_layer=1), [1, 2, 3], max_new_tokens=verified_tokens, params=SamplingParams(0.0),
        generator=torch.Generator(), num_draft_tokens=3, step=step)]  # fmt: skip
    greedy = generate(model, [[1, 2, 3]], max_new_tokens=verified_tokens, params=SamplingParams(0.0),
                      generator=torch.Generator())
    assert got == greedy.tokens[0]
    return fast


@pytest.mark.slow
def test_the_compiled_step_decodes_what_the_eager_one_does() -> None:
    model = _model()
    compiled = DecodeStep(model, Plan(compiled=True))
    assert compiled.compiled
    # 40 tokens past the 16-token context: the cache is rebuilt on the way
    assert _decodes_as_eager(model, compiled, 40, 30).stats.reprefills > 0


@pytest.mark.slow
def test_a_frozen_step_decodes_what_the_eager_one_does_with_its_own_model_s_weights() -> None:
    """Frozen (Plan.frozen), the weights become constants of the compiled graph and Inductor picks each
    product's kernel: the tokens and logits are still the eager step's, batched and verifying several drafted
    tokens, and a second model of the same shape with other weights gets a graph of its own."""
    first, second = _model(), _model()
    with torch.no_grad():
        for p in second.parameters():
            p.mul_(-1.0)
    for model in (first, second):
        _decodes_as_eager(model, DecodeStep(model, Plan(frozen=True, compiled=True)), 20, 12)


@pytest.mark.slow
@pytest.mark.parametrize("head", ["streamed", "frozen"])
def test_a_streamed_step_decodes_what_the_eager_one_does(head: str) -> None:
    """The products and the one-query attention as loops Inductor generates (fast/streamed.py), the head
    streamed too or frozen (a streamed twin's, fast/whole_steps.py), batched and verifying drafted tokens."""
    model = _model()
    plan = Plan("streamed", "streamed" if head == "streamed" else "out_in", attention="streamed",
                frozen=head == "frozen", compiled=True)
    step = build_step(model, plan)
    _decodes_as_eager(model, step, 20, 12)
    assert all(0 < t < float("inf") for t in time_steps({"streamed": step}, 2, repeats=1)["streamed"])


@pytest.mark.slow
def test_two_compiled_steps_of_models_that_differ_in_an_attribute_alone_each_decode_their_own() -> None:
    """The steps skip Dynamo's checks of the modules' attributes: each must still run its own model's graph,
    not the other's (same shapes and weights; only the blocks' `residual`, a plain attribute, differs)."""
    plain, other = _model(), _model(residual=False)
    prompts = [[1, 2, 3]]
    eager = {}
    for name, model in (("plain", plain), ("other", other)):
        eager[name] = _run(model, None, prompts, 6)
        got = _run(model, DecodeStep(model, Plan(compiled=True)), prompts, 6)
        for a, b in zip(got.logits, eager[name].logits, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
    # the logits differ, so one model running the other's graph would have shown
    assert (eager["plain"].logits[0] - eager["other"].logits[0]).abs().max() > 1.0


class OneBufferCache(KVCache):
    """The layout the cache must not have: one (L, ...) tensor each for K and V, written through views."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.k_all, self.v_all = torch.stack(self.k), torch.stack(self.v)  # (L, B, H_kv, T_max, D)

    def update(self, layer, k_new, v_new):
        end = self.length + k_new.shape[2]
        self.k_all[layer, :, :, self.length : end] = k_new
        self.v_all[layer, :, :, self.length : end] = v_new
        return self.k_all[layer, :, :, :end], self.v_all[layer, :, :, :end]


def _largest_generated_kernel(model: torch.nn.Module, cache: KVCache) -> int:
    """Elements the largest Inductor-generated kernel of a compiled decode step reads and writes (its own
    account, `torch._inductor.metrics`); matrix products and attention (library calls) are not counted."""
    torch._dynamo.reset()
    inductor_metrics.reset()
    with torch.no_grad():
        model(torch.ones(1, 8, dtype=torch.long), kv_cache=cache)  # a prefill, then compiled steps
    step = DecodeStep(model, Plan(compiled=True))
    torch._logging.set_logs(inductor_metrics=True)  # makes Inductor count each kernel's bytes
    try:
        with torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph would not be counted
            for _ in range(3):
                step(torch.ones(1, 1, dtype=torch.long), cache)
    finally:
        torch._logging.set_logs()
    counts = [n for node, n in inductor_metrics.nodes_num_elem
              if not isinstance(node, ExternKernelSchedulerNode)]
    assert counts, "Inductor counted no kernels"
    return max(counts)


@pytest.mark.slow
def test_compiled_steps_write_the_cache_in_place() -> None:
    """No generated kernel of the step touches even one layer's K buffer whole; the layout that is copied
    whole under compilation (one tensor viewed per layer) is caught by the same count."""
    model = _model(block=512)
    shape = (2, 1, 2, 512, 8)  # L, B, H_kv, T_max, D: the buffers dwarf every activation of a step
    layer_buffer = shape[1] * shape[2] * shape[3] * shape[4]
    assert _largest_generated_kernel(model, KVCache.allocate(*shape)) < layer_buffer
    assert _largest_generated_kernel(model, OneBufferCache.allocate(*shape)) > 2 * shape[0] * layer_buffer


def test_without_a_cpp_compiler_the_step_stays_eager_with_one_line(monkeypatch, caplog) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with caplog.at_level(logging.WARNING, logger="minigpt.fast.step"):
        step = DecodeStep(_model(), Plan(compiled=True))
    assert not step.compiled
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "C++ compiler" in lines[0] and "eagerly" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("switches", [{}, {"smear": True, "bigram_embed": 97}],
                         ids=["default", "previous-token"])
def test_one_compiled_graph_serves_every_cache_length(switches) -> None:
    """After the prefill and the first steps, a longer cache compiles nothing new: a graph specialised on the
    cache's length would recompile at every step (and fall back to eager at Dynamo's limit)."""
    model = _model(block=64, **switches)
    step = DecodeStep(model, Plan(compiled=True))
    cache = model.new_kv_cache(1)
    token = torch.ones(1, 1, dtype=torch.long)
    step(torch.ones(1, 8, dtype=torch.long), cache)  # the prefill's graph
    for _ in range(3):
        step(token, cache)  # the decode step's graph (Dynamo makes the length dynamic on its second value)
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(12):
            step(token, cache)  # raises on a recompilation
    assert cache.length == 8 + 15
