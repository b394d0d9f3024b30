"""The numbers gate (fast/gate.py): honest fast steps pass it; a wrong one, injected, is refused with one log
line that names it, and the user decodes with the next step that passes (in the end the eager one)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from model_helpers import tiny_config

from minigpt.fast import fastest
from minigpt.fast.gate import TOLERANCE, check, record_probes
from minigpt.fast.step import DecodeStep, Plan, build_step
from minigpt.model.factory import build_model
from minigpt.model.int8 import quantize_int8
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

FAST = Plan("packed", "in_out", attention="math")


def _tiny(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=61)).eval()
    return model.to(dtype)


class Shifted(DecodeStep):
    """A wrong step: an honest one whose logits are moved, by `by` standard deviations of themselves, for one
    vocabulary entry; only on left-padded batches where `padded_only`."""

    def __init__(self, model, plan, by: float, padded_only: bool = False) -> None:
        super().__init__(model, plan)
        self.by, self.padded_only = by, padded_only

    def __call__(self, tokens, cache):
        logits = super().__call__(tokens, cache).clone()  # (B, T, V)
        if cache.has_padding or not self.padded_only:
            logits[..., 7] += self.by * logits.std()
        return logits


def _wrong(by: float, padded_only: bool = False):
    """A build_step whose steps are `Shifted`."""
    def build(model, plan, rows=1):
        honest = build_step(model, plan, rows)
        return Shifted(honest.model, honest.plan, by, padded_only)
    return build


def test_the_probe_has_the_step_s_own_rows_and_a_left_padded_pair() -> None:
    probes = record_probes(_tiny(), rows=3)
    assert [len(p.prompts) for p in probes] == [3, 2]
    assert len({len(p) for p in probes[0].prompts}) == 1 and len({len(p) for p in probes[1].prompts}) == 2
    assert all(p.tokens.shape == (4, len(p.prompts)) and p.logits.shape == (5, len(p.prompts), 61)
               for p in probes)
    # the fed tokens are the eager step's own greedy ones
    assert all(torch.equal(p.tokens, p.logits[:-1].argmax(-1)) for p in probes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plan", [Plan("in_out", "in_out"), Plan("packed", "packed", attention="math"),
                                  Plan(onednn=False), Plan("streamed", "out_in", attention="sdpa")],
                         ids=lambda p: p.name)
def test_honest_fast_steps_pass(dtype, plan: Plan) -> None:
    model = _tiny(dtype)
    probes = record_probes(model, rows=2)
    passed, how = check(build_step(copy.deepcopy(model), plan, rows=2), probes)
    assert passed, how


def test_an_honest_int8_step_passes_against_its_own_eager_step() -> None:
    model = quantize_int8(_tiny(), torch.bfloat16).eval()
    passed, how = check(build_step(copy.deepcopy(model), Plan(attention="math")), record_probes(model, 1))
    assert passed, how


@pytest.mark.parametrize(("by", "passes"), [(0.3 * TOLERANCE[torch.float32], True),
                                            (3 * TOLERANCE[torch.float32], False), (float("nan"), False)])
def test_the_tolerance_is_the_dtype_s(by: float, passes: bool) -> None:
    model = _tiny()
    step = Shifted(copy.deepcopy(model), Plan(), by)
    passed, how = check(step, record_probes(model, 1))
    assert passed == passes
    assert "standard deviations from the eager step's" in how and "at most 0.001 for float32" in how


def test_a_wrong_step_is_refused_with_one_line_and_the_eager_step_decodes(monkeypatch, caplog) -> None:
    monkeypatch.setattr(fastest, "build_step", _wrong(by=3.0))
    model = _tiny()
    with caplog.at_level(logging.WARNING, logger="minigpt.fast"):
        step = fastest.fastest_step(model, rows=2, plan=FAST)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("refused the decode step eager: ")
    assert FAST.name in lines[0] and "standard deviations" in lines[0]
    assert step.model is model and not isinstance(step, Shifted) and step.name.startswith("decode step eager")
    assert step.notes[-2:] == [lines[0], step.name]  # the refusal is among the step's notes too
    runs = [generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8, params=SamplingParams(0.0),
                     generator=torch.Generator(), step=s) for s in (step, None)]
    assert runs[0].tokens == runs[1].tokens


def test_a_step_wrong_only_for_left_padded_rows_is_refused(monkeypatch, caplog) -> None:
    monkeypatch.setattr(fastest, "build_step", _wrong(by=3.0, padded_only=True))
    with caplog.at_level(logging.WARNING, logger="minigpt.fast"):
        step = fastest.fastest_step(_tiny(), rows=1, plan=FAST)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "on 2 rows (one left-padded)" in lines[0]
    assert not isinstance(step, Shifted)


@pytest.mark.slow
def test_a_wrong_compiled_step_gives_way_to_the_next_that_passes(monkeypatch, caplog) -> None:
    """The compiled step as planned is wrong; the plain compiled step, next in line, is honest and kept."""
    build = fastest.build_step
    monkeypatch.setattr(fastest, "build_step", lambda model, plan, rows=1: (
        _wrong(3.0)(model, plan, rows) if plan.attention else build(model, plan, rows)))
    with caplog.at_level(logging.WARNING, logger="minigpt.fast"):
        step = fastest.fastest_step(_tiny(), plan=Plan(attention="math"), compile=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "decode step compiled: head out_in, blocks out_in, math attention" in lines[0]
    assert step.compiled and step.plan == Plan(compiled=True) and not isinstance(step, Shifted)
