"""Decoding's product kernels: chosen by measurement (generation/products.py), and whichever is chosen, the
cached path gives the tokens and logits of the plain, uncached one."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
from model_helpers import tiny_config

from minigpt.generation import decoder, products
from minigpt.generation.products import DEFAULT, ProductSetup
from minigpt.generation.step import DecodeStep
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

IN_OUT, NO_ONEDNN, BOTH = ProductSetup(True, True), ProductSetup(False, False), ProductSetup(True, False)


def _tiny(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=61)).eval()
    return model.to(dtype)


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_either_layout_on_either_dtype_changes_strides_and_nothing_else(dtype: torch.dtype) -> None:
    model = _tiny(dtype)
    ref = copy.deepcopy(model)
    model.prepare_for_inference(in_out_layout=True)
    for m in _linears(model):
        assert m.weight.stride() == (1, m.weight.shape[0])  # (out, in) with (in, out) memory
    for (name, w), (_, w_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(w, w_ref), name
    model.prepare_for_inference(in_out_layout=False)  # and back: nn.Linear's own layout
    assert all(m.weight.is_contiguous() for m in _linears(model))
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied throughout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("setup", [DEFAULT, IN_OUT, NO_ONEDNN, BOTH], ids=lambda s: s.name)
def test_cached_decoding_on_every_setup_equals_the_uncached_plain_path(dtype, setup: ProductSetup) -> None:
    plain = _tiny(dtype)  # as trained: never prepared
    fast = decoder.prepare_for_decoding(copy.deepcopy(plain), products=setup)
    assert torch.backends.mkldnn.enabled
    runs = [generate(m, [[4, 8, 15, 16]], max_new_tokens=10, params=SamplingParams(temperature=0.0),
                     generator=torch.Generator().manual_seed(0), use_cache=cached, keep_logits=True,
                     step=step)
            for m, cached, step in ((fast.model, True, fast.step), (plain, False, None))]
    assert torch.backends.mkldnn.enabled  # the step restores PyTorch's setting after each call
    assert runs[0].tokens == runs[1].tokens
    tol = 1e-5 if dtype == torch.float32 else 5e-2  # bf16: 8 significant bits, a few roundings apart
    for a, b in zip(runs[0].logits, runs[1].logits, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def test_the_candidates_are_what_can_differ() -> None:
    assert products.candidates(torch.zeros(4, 4)) == [DEFAULT, IN_OUT]  # float32: BLAS whatever oneDNN says
    bf16 = torch.zeros(4, 4, dtype=torch.bfloat16)
    assert set(products.candidates(bf16)) == {DEFAULT, IN_OUT, NO_ONEDNN, BOTH}
    assert products.candidates(torch.zeros(4, 4, device="meta")) == [DEFAULT]  # not a CPU: nothing to choose


@pytest.mark.parametrize(("times", "chosen"), [
    ({DEFAULT: 3.0, IN_OUT: 1.0, NO_ONEDNN: 2.0, BOTH: 4.0}, IN_OUT),
    ({DEFAULT: 3.0, IN_OUT: 4.0, NO_ONEDNN: 1.0, BOTH: 2.0}, NO_ONEDNN),
    ({DEFAULT: 1.1, IN_OUT: 1.0, NO_ONEDNN: 1.2, BOTH: 1.3}, DEFAULT),  # within the noise margin
    ({DEFAULT: 1.0, IN_OUT: 2.0, NO_ONEDNN: 2.0, BOTH: 2.0}, DEFAULT),
])  # fmt: skip
def test_the_choice_follows_the_measurement(times: dict, chosen: ProductSetup) -> None:
    seen = []

    def measure(weight, rows, setups):
        seen.append((weight.shape, rows, setups))
        return {s: times[s] for s in setups}

    weight = torch.zeros(61, 32, dtype=torch.bfloat16)
    setup, why = products.choose_products(weight, 4, measure=measure)
    assert setup == chosen and seen == [((61, 32), 4, products.candidates(weight))]
    assert chosen.name in why and "ms" in why


def test_prepare_for_decoding_measures_the_head_for_the_batch(monkeypatch, caplog) -> None:
    seen = []
    fake = lambda w, rows, setups: seen.append((w.shape, rows)) or {s: 2.0 - s.in_out_layout for s in setups}
    monkeypatch.setattr(decoder, "choose_products", lambda w, rows: products.choose_products(w, rows, fake))
    model = _tiny()
    with caplog.at_level(logging.DEBUG, logger="minigpt.generation.decoder"):
        prepared = decoder.prepare_for_decoding(model, batch_size=3)
    assert prepared.model is model and not model.training and seen == [((61, 32), 3)]
    assert prepared.step.products == IN_OUT and all(m.weight.stride()[0] == 1 for m in _linears(model))
    assert "in_out" in caplog.text and "decode step eager" in caplog.text


def test_the_measurements_are_real_times() -> None:
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    times = products.time_products(w, 2, products.candidates(w), repeats=1)
    assert set(times) == set(products.candidates(w)) and all(0 < t < math.inf for t in times.values())
    times = products.time_int8_activations(w, 1, [torch.float32, torch.bfloat16], repeats=1)
    assert all(0 < t < math.inf for t in times.values())


@pytest.mark.parametrize(("fp32_s", "bf16_s", "chosen"),
                         [(2.0, 1.0, torch.bfloat16), (1.0, 0.9, torch.float32)])
def test_int8_activations_follow_the_measurement(fp32_s, bf16_s, chosen) -> None:
    measure = lambda w, rows, dtypes: {torch.float32: fp32_s, torch.bfloat16: bf16_s}
    dtype, why = products.choose_int8_activation_dtype(torch.zeros(8, 16), 1, measure)
    assert dtype == chosen and str(chosen).removeprefix("torch.") in why
    # a layer width bfloat16's kernel cannot take (tests/model/test_int8.py) is not even measured
    assert products.choose_int8_activation_dtype(torch.zeros(8, 40), 1, measure)[0] == torch.float32


def test_a_step_without_compile_is_eager_and_reports_it() -> None:
    step = DecodeStep(_tiny())
    assert not step.compiled and step.products == DEFAULT
