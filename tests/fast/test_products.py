"""Decoding's kernels: chosen by measurement (generation/kernels.py), and whichever is chosen, the cached path
gives the tokens and logits of the plain, uncached one."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
from model_helpers import tiny_config

from minigpt.generation import decoder, kernels
from minigpt.generation.kernels import DEFAULT, Kernels
from minigpt.generation.step import DecodeStep
from minigpt.model import attention as attention_module
from minigpt.model.factory import build_model
from minigpt.model.int8 import quantize_int8
from minigpt.model.packed import PackedLinear
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

OI, OI_OFF, IO, IO_OFF = ("out_in", True), ("out_in", False), ("in_out", True), ("in_out", False)
PK = ("packed", True)  # a packed matrix is oneDNN's under either flag
FZ = ("frozen", True)  # the plain matrices frozen into a compiled step, Inductor choosing their kernels
SETUPS = [DEFAULT, Kernels("in_out", "in_out"), Kernels("out_in", "out_in", False),
          Kernels("in_out", "in_out", False), Kernels("packed", "packed"), Kernels("in_out", "packed", False),
          Kernels(attention="math"), Kernels("packed", "out_in", attention="sdpa")]


def _tiny(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=61)).eval()
    return model.to(dtype)


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_either_plain_layout_on_either_dtype_changes_strides_and_nothing_else(dtype: torch.dtype) -> None:
    model = _tiny(dtype)
    ref = copy.deepcopy(model)
    model.prepare_for_inference("in_out")
    for m in _linears(model):
        assert m.weight.stride() == (1, m.weight.shape[0])  # (out, in) with (in, out) memory
    for (name, w), (_, w_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(w, w_ref), name
    model.prepare_for_inference("out_in")  # and back: nn.Linear's own layout
    assert all(m.weight.is_contiguous() for m in _linears(model))
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied throughout


def test_the_packed_layout_replaces_every_linear_and_keeps_its_matrix() -> None:
    model = _tiny()
    ref = copy.deepcopy(model)
    model.prepare_for_inference("packed", rows=3)
    assert not _linears(model)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 2 * 4 + 1 and all(m.rows == 3 for m in packed)  # 4 per block and the head
    for name, m in model.named_modules():
        if isinstance(m, PackedLinear):
            assert torch.equal(m.weight, ref.get_submodule(name).weight), name
    assert torch.equal(model.transformer.wte.weight, ref.transformer.wte.weight)  # the lookup's own table
    with pytest.raises(ValueError, match="layout='rows'"):
        model.prepare_for_inference("out_in", head_layout="rows")


def test_the_head_and_the_blocks_take_their_own_layouts() -> None:
    model = _tiny().prepare_for_inference("in_out", head_layout="packed")
    assert isinstance(model.lm_head, PackedLinear)
    assert all(m.weight.stride() == (1, m.weight.shape[0]) for m in _linears(model))  # the blocks: in_out
    assert len(_linears(model)) == 2 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.name)
def test_cached_decoding_on_every_setup_equals_the_uncached_plain_path(dtype, setup: Kernels) -> None:
    plain = _tiny(dtype)  # as trained: never prepared
    fast = decoder.prepare_for_decoding(copy.deepcopy(plain), kernels=setup)
    assert torch.backends.mkldnn.enabled
    runs = [generate(m, [[4, 8, 15, 16]], max_new_tokens=30, params=SamplingParams(temperature=0.0),
                     generator=torch.Generator().manual_seed(0), use_cache=cached, keep_logits=True,
                     step=step)
            for m, cached, step in ((fast.model, True, fast.step), (plain, False, None))]
    assert torch.backends.mkldnn.enabled  # the step restores PyTorch's setting after each call
    assert runs[0].tokens == runs[1].tokens  # 30 tokens past the 24-token context: windows rebuilt
    tol = 1e-5 if dtype == torch.float32 else 5e-2  # bf16: 8 significant bits, a few roundings apart
    for a, b in zip(runs[0].logits, runs[1].logits, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def test_the_decode_attention_serves_one_query_steps_only(monkeypatch) -> None:
    """A prefill (many queries) and speculative verification keep the model's own backend; a decode step of
    one query per row on the cache uses the chosen one."""
    calls = []
    math = attention_module.math_attention
    monkeypatch.setattr(attention_module, "math_attention",
                        lambda q, *a, **k: calls.append(q.shape[2]) or math(q, *a, **k))
    model = _tiny().prepare_for_inference(decode_attention="math")
    assert model.config.attention == "sdpa"
    cache = model.new_kv_cache(1)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]), kv_cache=cache)  # prefill: sdpa
        model(torch.tensor([[6]]), kv_cache=cache)  # a decode step: math, in both layers
        model(torch.tensor([[7, 8]]), kv_cache=cache)  # two queries at once: sdpa
        model(torch.tensor([[9]]))  # one token without a cache is not a decode step: sdpa
    assert calls == [1, 1]


def test_the_candidates_are_what_can_differ() -> None:
    # float32: oneDNN's flag changes nothing for plain matrices (BLAS), and a packed one is oneDNN's anyway
    assert kernels.product_candidates(torch.zeros(4, 4)) == [OI, IO, PK]
    bf16 = torch.zeros(4, 4, dtype=torch.bfloat16)
    assert kernels.product_candidates(bf16) == [OI, OI_OFF, IO, IO_OFF, PK]
    assert kernels.product_candidates(torch.zeros(4, 4, device="meta")) == [OI]  # not a CPU


def test_frozen_is_a_candidate_for_a_step_that_will_be_compiled(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "compile_problem", lambda device: None)
    assert kernels.product_candidates(torch.zeros(4, 4), compile=True) == [OI, IO, PK, FZ]
    monkeypatch.setattr(kernels, "compile_problem", lambda device: "no C++ compiler")
    assert kernels.product_candidates(torch.zeros(4, 4), compile=True) == [OI, IO, PK]


def test_without_onednn_nothing_is_packed(monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert kernels.product_candidates(torch.zeros(4, 4)) == [OI, IO]


@pytest.mark.parametrize(("head", "blocks", "chosen"), [
    ({OI: 3.0, OI_OFF: 2.0, IO: 4.0, IO_OFF: 4.0, PK: 1.0},
     {OI: 1.0, OI_OFF: 0.5, IO: 1.0, IO_OFF: 1.0, PK: 2.0}, Kernels("out_in", "packed", False)),  # any flag
    ({OI: 3.0, OI_OFF: 2.0, IO: 4.0, IO_OFF: 4.0, PK: 1.0},
     {OI: 1.0, OI_OFF: 2.5, IO: 1.0, IO_OFF: 1.0, PK: 2.0}, Kernels("out_in", "packed", True)),
    ({OI: 3.0, OI_OFF: 3.0, IO: 1.0, IO_OFF: 4.0, PK: 2.0},
     {OI: 3.0, OI_OFF: 3.0, IO: 3.0, IO_OFF: 3.0, PK: 1.0}, Kernels("packed", "in_out", True)),
    ({OI: 1.1, OI_OFF: 1.2, IO: 1.0, IO_OFF: 1.3, PK: 1.0},
     {OI: 1.0, OI_OFF: 1.0, IO: 1.0, IO_OFF: 1.0, PK: 1.0}, DEFAULT),  # within the noise margin
])  # fmt: skip
def test_the_product_choice_follows_the_measurement(head: dict, blocks: dict, chosen: Kernels) -> None:
    seen = []

    def measure(matrices, rows, ways):
        seen.append(([m.shape for m in matrices], rows, ways))
        return {w: (head if len(matrices) == 1 else blocks)[w] for w in ways}

    head_w = torch.zeros(61, 32, dtype=torch.bfloat16)
    blocks_w = [torch.zeros(96, 32, dtype=torch.bfloat16), torch.zeros(32, 32, dtype=torch.bfloat16)]
    setup, why = kernels.choose_products(head_w, blocks_w, 4, measure=measure)
    ways = kernels.product_candidates(head_w)
    assert setup == chosen and seen == [([(61, 32)], 4, ways), ([(96, 32), (32, 32)], 4, ways)]
    assert chosen.name in why and "ms" in why and "2 block matrices" in why


SLOW = {OI: 9.0, OI_OFF: 9.0, IO: 9.0, IO_OFF: 9.0, PK: 9.0, FZ: 9.0}


@pytest.mark.parametrize(("head", "blocks", "chosen"), [
    ({FZ: 1.0}, {FZ: 1.0}, Kernels(frozen=True)),
    # the blocks' fastest way is plain, which a frozen step would freeze too: frozen head + packed blocks
    ({FZ: 1.0, PK: 3.0}, {IO: 1.0, PK: 1.5, FZ: 2.0}, Kernels("packed", "out_in", frozen=True)),
    ({FZ: 1.0, PK: 1.5}, {IO: 1.0, PK: 3.0, FZ: 3.0}, Kernels("in_out", "packed")),  # 2.5 beats 4.0
    ({FZ: 1.0, OI_OFF: 1.2}, {OI_OFF: 1.0, FZ: 1.5}, Kernels(onednn=False)),  # frozen: timed with oneDNN
    ({PK: 1.0, FZ: 2.0}, {FZ: 1.0, PK: 2.0}, Kernels("out_in", "packed", frozen=True)),
])  # fmt: skip
def test_frozen_combines_only_with_what_a_frozen_step_leaves_alone(head, blocks, chosen, monkeypatch) -> None:
    monkeypatch.setattr(kernels, "compile_problem", lambda device: None)
    measure = lambda matrices, rows, ways: {w: {**SLOW, **(head if len(matrices) == 1 else blocks)}[w]
                                            for w in ways}
    head_w, block_w = torch.zeros(61, 32, dtype=torch.bfloat16), torch.zeros(96, 32, dtype=torch.bfloat16)
    setup, why = kernels.choose_products(head_w, [block_w, block_w], 1, compile=True, measure=measure)
    assert setup == chosen and why.startswith(chosen.name)
    assert ("frozen" in why.split(":")[0]) == chosen.frozen


@pytest.mark.parametrize(("own", "times", "compile", "chosen"), [
    ("sdpa", {"sdpa": 3.0, "math": 1.0}, False, "math"),
    ("sdpa", {"sdpa": 1.1, "math": 1.0}, False, "sdpa"),  # within the noise margin: the model's own
    ("math", {"sdpa": 1.0, "math": 3.0}, False, "sdpa"),
    ("online", {"sdpa": 1.1, "math": 1.0}, False, "sdpa"),  # the teaching backend is compared as sdpa
    ("sdpa", {"sdpa": 3.0, "math": 2.0, "streamed": 1.0}, True, "streamed"),  # a compiled step's only
    ("sdpa", {"sdpa": 1.1, "math": 3.0, "streamed": 1.0}, True, "sdpa"),
])  # fmt: skip
def test_the_attention_choice_follows_the_measurement(own, times, compile, chosen, monkeypatch) -> None:
    monkeypatch.setattr(kernels, "compile_problem", lambda device: None)
    seen = []

    def measure(config, dtype, device, rows, backends, onednn, compiled):
        seen.append((config.attention, dtype, rows, backends, onednn, compiled))
        return {b: times[b] for b in backends}

    config = tiny_config(attention=own, vocab_size=61)
    backend, why = kernels.choose_attention(config, torch.bfloat16, torch.device("cpu"), 2, False, compile,
                                            measure)
    assert backend == chosen and f"{chosen} attention" in why
    assert seen == [(own, torch.bfloat16, 2, tuple(times), False, compile)]


def test_without_a_compiler_the_attention_is_timed_eagerly_as_the_step_will_run(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "compile_problem", lambda device: "no C++ compiler was found")
    seen = []
    measure = lambda config, dtype, device, rows, backends, onednn, compiled: seen.append(
        (backends, compiled)) or dict.fromkeys(backends, 1.0)
    kernels.choose_attention(tiny_config(vocab_size=61), torch.float32, torch.device("cpu"), 1, True, True,
                             measure)
    assert seen == [(("sdpa", "math"), False)]


def test_prepare_for_decoding_measures_the_head_and_the_attention_for_the_batch(monkeypatch, caplog) -> None:
    seen = []
    fake = lambda ms, rows, ways: seen.append((len(ms), rows)) or {w: 1.0 + (w != IO) for w in ways}
    fake_attention = lambda config, dtype, device, rows, backends, onednn, compile: seen.append(
        (dtype, rows)) or {"sdpa": 2.0, "math": 1.0}
    monkeypatch.setattr(decoder, "choose_kernels",
                        lambda m, rows, int8, compile: kernels.choose_kernels(m, rows, int8, compile, fake,
                                                                              fake_attention))
    model = _tiny()
    with caplog.at_level(logging.DEBUG, logger="minigpt.generation.decoder"):
        prepared = decoder.prepare_for_decoding(model, batch_size=3)
    assert prepared.model is model and not model.training
    assert seen == [(1, 3), (2 * 4, 3), (torch.float32, 3)]  # the head, the blocks' matrices, the attention
    assert prepared.step.kernels == Kernels("in_out", "in_out", attention="math")
    assert all(m.weight.stride()[0] == 1 for m in _linears(model))
    assert all(block.attn.decode_backend == "math" for block in model.transformer.h)
    assert "in_out" in caplog.text and "math attention" in caplog.text and "decode step eager" in caplog.text


@pytest.mark.parametrize(("chosen_s", "streamed_s", "streamed"), [
    ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], True),
    ([1.12, 1.12, 1.12], [1.0, 1.0, 1.0], True),
    ([1.08, 1.08, 1.08], [1.0, 1.0, 1.0], False),  # within the noise of whole steps
    ([2.0, 2.2, 1.8], [1.0, 2.0, 1.0], True),  # one slow round of the twin does not decide
    ([1.0, 4.0, 1.0], [1.0, 1.0, 1.0], False),  # nor one slow round of the step as chosen
    ([1.0, 2.0, 2.0], [0.98, 1.6, 1.6], True),  # the machine slowed after round 1: each round's ratio holds
])  # fmt: skip
def test_a_compiled_step_is_streamed_where_whole_steps_say(chosen_s, streamed_s, streamed, monkeypatch):
    """Timed on whole steps, judged by the median of the rounds' ratios; eager steps and steps given their
    kernels are not timed at all."""
    chosen_kernels = Kernels("packed", "packed", onednn=False, attention="math")
    chosen = lambda m, rows, int8, compile: (chosen_kernels, ["products packed"])
    monkeypatch.setattr(decoder, "choose_kernels", chosen)
    seen = []

    def measure(steps, rows):
        kind = lambda module: type(module).__name__
        seen.append({name: (step.kernels, kind(step.model.lm_head),
                            kind(step.model.transformer.h[0].mlp.c_fc))
                     for name, step in steps.items()})
        return {"chosen": chosen_s, "streamed": streamed_s}

    model = _tiny()
    prepared = decoder.prepare_for_decoding(model, batch_size=2, compile=True, measure_steps=measure)
    # the twin: blocks streamed, the head plain and frozen, the step's oneDNN flag and attention
    twin = Kernels("streamed", "out_in", onednn=False, attention="math", frozen=True)
    assert twin.name == "head frozen, blocks streamed, without oneDNN, math attention"
    assert seen == [{"chosen": (chosen_kernels, "PackedLinear", "PackedLinear"),
                     "streamed": (twin, "Linear", "StreamedLinear")}]
    assert prepared.step.kernels == (twin if streamed else chosen_kernels)
    assert (prepared.model is model) != streamed and prepared.step.model is prepared.model
    assert isinstance(prepared.model.lm_head, torch.nn.Linear if streamed else PackedLinear)
    assert any(("step streamed" if streamed else "step as chosen") in note for note in prepared.notes)
    decoder.prepare_for_decoding(_tiny(), compile=False, measure_steps=measure)
    decoder.prepare_for_decoding(_tiny(), compile=True, kernels=DEFAULT, measure_steps=measure)
    assert len(seen) == 1


def test_the_measurements_are_real_times() -> None:
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ways = kernels.product_candidates(w)
    times = kernels.time_products([w, w[:32]], 2, ways, repeats=1)
    assert set(times) == set(ways) and all(0 < t < math.inf for t in times.values())
    times = kernels.time_int8_activations(w, 1, [torch.float32, torch.bfloat16], repeats=1)
    assert all(0 < t < math.inf for t in times.values())
    config = tiny_config(vocab_size=61, block_size=16)
    times = kernels.time_attention(config, torch.bfloat16, torch.device("cpu"), 2, ("sdpa", "math"),
                                   repeats=1)
    assert set(times) == {"sdpa", "math"} and all(0 < t < math.inf for t in times.values())
    assert kernels.cache_lengths(16) == [2, 8, 16] and kernels.cache_lengths(4) == [1, 2, 4]


@pytest.mark.parametrize("onednn", [True, False])
def test_the_attention_is_timed_under_the_step_s_onednn_flag(onednn, monkeypatch) -> None:
    """A step runs with the products' flag, and 16-bit math attention is slow without oneDNN on some CPUs."""
    flags = []
    monkeypatch.setattr(kernels, "math_attention",
                        lambda *a: flags.append(torch.backends.mkldnn.enabled) or (None, None))
    config = tiny_config(vocab_size=61, block_size=16)
    kernels.time_attention(config, torch.bfloat16, torch.device("cpu"), 1, ("math",), onednn, repeats=1)
    assert flags and set(flags) == {onednn} and torch.backends.mkldnn.enabled
    seen = []
    fake_products = lambda ms, rows, ways: {w: 1.0 if w == OI_OFF else 3.0 for w in ways}
    fake_attention = lambda config, dtype, device, rows, backends, flag, compile: seen.append(
        flag) or dict.fromkeys(backends, 1.0)
    chosen, _ = kernels.choose_kernels(_tiny(torch.bfloat16), 1, False, False, fake_products, fake_attention)
    assert not chosen.onednn and seen == [False]


def test_an_int8_step_is_never_frozen(monkeypatch) -> None:
    """Only the activations' dtype and the attention are chosen for int8 weights (the module docstring says
    why)."""
    monkeypatch.setattr(kernels, "compile_problem", lambda device: None)
    model = quantize_int8(_tiny(), torch.float32)
    attention = lambda *a: {"sdpa": 1.0, "math": 1.0, "streamed": 1.0}
    chosen, why = kernels.choose_kernels(model, 2, True, True, measure_attention=attention)
    assert chosen == Kernels(attention="sdpa") and len(why) == 1 and why[0].startswith("attention")


@pytest.mark.slow
def test_compiled_products_are_the_products_and_are_timed() -> None:
    gen = torch.Generator().manual_seed(0)
    matrices = [torch.randn(96, 32, generator=gen), torch.randn(32, 96, generator=gen)]
    xs = [torch.randn(2, 32, generator=gen), torch.randn(2, 96, generator=gen)]
    linears = [torch.nn.Linear(w.shape[1], w.shape[0], bias=False) for w in matrices]
    for linear, w in zip(linears, matrices, strict=True):
        linear.weight.data.copy_(w)
    for got, x, w in zip(kernels.compiled_products(linears, frozen=True)(xs), xs, matrices, strict=True):
        torch.testing.assert_close(got, x @ w.T, atol=1e-5, rtol=1e-5)
    times = kernels.time_products(matrices, 2, [OI, FZ], repeats=1)
    assert set(times) == {OI, FZ} and all(0 < t < math.inf for t in times.values())


@pytest.mark.slow
def test_compiled_attention_is_the_attention_and_is_timed() -> None:
    """Each backend compiled as a step compiles it gives the eager sdpa's result, for every layer."""
    config = tiny_config(vocab_size=61, block_size=16)
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(2, config.n_head, 1, config.head_dim, generator=gen) for _ in range(2)]
    ks, vs = ([torch.randn(2, config.kv_heads, 5, config.head_dim, generator=gen) for _ in range(2)]
              for _ in range(2))
    expected = kernels.attention_layers("sdpa", torch.device("cpu"), False)(qs, ks, vs)
    for backend in kernels.COMPILED_ATTENTION_BACKENDS:
        got = kernels.attention_layers(backend, torch.device("cpu"), True)(qs, ks, vs)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    times = kernels.time_attention(config, torch.bfloat16, torch.device("cpu"), 2,
                                   kernels.COMPILED_ATTENTION_BACKENDS, compile=True, repeats=1)
    assert set(times) == set(kernels.COMPILED_ATTENTION_BACKENDS)
    assert all(0 < t < math.inf for t in times.values())


@pytest.mark.parametrize(("fp32_s", "bf16_s", "chosen"),
                         [(2.0, 1.0, torch.bfloat16), (1.0, 0.9, torch.float32)])
def test_int8_activations_follow_the_measurement(fp32_s, bf16_s, chosen) -> None:
    measure = lambda w, rows, dtypes: {torch.float32: fp32_s, torch.bfloat16: bf16_s}
    dtype, why = kernels.choose_int8_activation_dtype(torch.zeros(8, 16), 1, measure)
    assert dtype == chosen and str(chosen).removeprefix("torch.") in why
    # a layer width bfloat16's kernel cannot take (tests/model/test_int8.py) is not even measured
    assert kernels.choose_int8_activation_dtype(torch.zeros(8, 40), 1, measure)[0] == torch.float32


def test_a_step_without_compile_is_eager_and_reports_it() -> None:
    step = DecodeStep(_tiny())
    assert not step.compiled and step.kernels == DEFAULT
