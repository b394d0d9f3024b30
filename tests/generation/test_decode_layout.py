"""Decoding's weight layout: chosen by measurement (generation/run.prepare_for_decoding), and whichever it is,
the cached path gives the tokens and logits of the plain, uncached one."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from model_helpers import tiny_config

from minigpt.device.probe import in_out_layout_speedup
from minigpt.generation import run
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams


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
@pytest.mark.parametrize("in_out", [True, False])
def test_cached_decoding_equals_the_uncached_plain_path_on_both_layouts(dtype, in_out: bool) -> None:
    plain = _tiny(dtype)  # as trained: never prepared
    fast = copy.deepcopy(plain).prepare_for_inference(in_out_layout=in_out)
    runs = [generate(m, [[4, 8, 15, 16]], max_new_tokens=10, params=SamplingParams(temperature=0.0),
                     generator=torch.Generator().manual_seed(0), use_cache=c, keep_logits=True)
            for m, c in ((fast, True), (plain, False))]
    assert runs[0].tokens == runs[1].tokens
    tol = 1e-5 if dtype == torch.float32 else 5e-2  # bf16: 8 significant bits, a few roundings apart
    for a, b in zip(runs[0].logits, runs[1].logits, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(("speedup", "in_out"), [(2.7, True), (0.33, False), (1.1, False)])
def test_prepare_for_decoding_follows_the_measurement(monkeypatch, caplog, speedup: float, in_out: bool):
    measured = []
    monkeypatch.setattr(run, "in_out_layout_speedup", lambda w: measured.append(w.shape) or speedup)
    model = _tiny()
    with caplog.at_level(logging.DEBUG, logger="minigpt.generation.run"):
        assert run.prepare_for_decoding(model) is model
    assert measured == [(61, 32)]  # the head's weight, the largest of a decode step
    assert all((m.weight.stride()[0] == 1) == in_out for m in _linears(model))
    assert not model.training
    assert f"measured {speedup:.2f}x" in caplog.text


def test_the_layout_measurement_is_a_ratio_of_real_times() -> None:
    w = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
    ratio = in_out_layout_speedup(w, repeats=2)
    assert 0 < ratio < float("inf")
