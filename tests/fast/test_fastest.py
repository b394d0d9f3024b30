"""The wing's entry point (fast/fastest.py): what it measures for which model, what it builds from the
measurement (injected), that a plan is a plain record a later run can hand back, and the int8 activations'
choice. Whether what it hands back gives the eager step's numbers is tests/fast/test_gate.py's."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
from model_helpers import tiny_config

from minigpt.fast import fastest
from minigpt.fast.attention import ONE_QUERY
from minigpt.fast.int8 import choose_int8_activation_dtype, time_int8_activations
from minigpt.fast.packed import PackedLinear
from minigpt.fast.step import DEFAULT, DecodeStep, Plan
from minigpt.model.factory import build_model
from minigpt.model.int8 import quantize_int8

IO = ("in_out", True)


def _tiny(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=61)).eval()
    return model.to(dtype)


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def test_the_step_is_measured_for_the_batch_and_built_on_a_copy(monkeypatch, caplog) -> None:
    seen = []
    fake = lambda ms, rows, ways: seen.append((len(ms), rows)) or {w: 1.0 + (w != IO) for w in ways}
    fake_attention = lambda config, dtype, device, rows, backends, onednn, compile: seen.append(
        (dtype, rows)) or {"sdpa": 2.0, "math": 1.0}
    choose = fastest.choose_plan
    monkeypatch.setattr(fastest, "choose_plan", lambda m, rows, compile: choose(m, rows, compile, fake,
                                                                                fake_attention))
    model = _tiny().train()
    with caplog.at_level(logging.DEBUG, logger="minigpt.fast.fastest"):
        step = fastest.fastest_step(model, rows=3)
    assert seen == [(1, 3), (2 * 4, 3), (torch.float32, 3)]  # the head, the blocks' matrices, the attention
    assert step.plan == Plan("in_out", "in_out", attention="math") and not step.compiled
    assert step.model is not model and not model.training and not step.model.training
    assert all(m.weight.stride()[0] == 1 for m in _linears(step.model))
    assert all(m.weight.is_contiguous() for m in _linears(model))  # the model handed in: as it was
    assert all(block.attn.decode_attention is ONE_QUERY["math"] for block in step.model.transformer.h)
    assert all(block.attn.decode_attention is None for block in model.transformer.h)
    assert "in_out" in caplog.text and "math attention" in caplog.text
    name = "decode step eager: head in_out, blocks in_out, math attention"
    assert step.notes[-2].startswith(f"passed the {name}: ") and step.notes[-1] == name


def test_where_nothing_pays_the_step_is_the_model_s_own(monkeypatch) -> None:
    """No copy, no probe: the default plan is the eager step itself."""
    monkeypatch.setattr(fastest, "choose_plan", lambda m, rows, compile: (DEFAULT, ["nothing pays"]))
    monkeypatch.setattr(fastest, "first_passing", lambda *a: pytest.fail("the eager step was probed"))
    model = _tiny()
    step = fastest.fastest_step(model)
    assert step.model is model and step.plan == DEFAULT and step.notes == ["nothing pays", step.name]


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
    plan are not timed at all. (Every candidate passes the gate here; nothing is compiled.)"""
    chosen_plan = Plan("packed", "packed", onednn=False, attention="math")
    monkeypatch.setattr(fastest, "compile_problem", lambda device: None)
    monkeypatch.setattr(fastest, "choose_plan", lambda m, rows, compile: (chosen_plan, ["products packed"]))
    monkeypatch.setattr(fastest, "first_passing", lambda model, probes, steps: (next(iter(steps)), []))
    seen = []

    def measure(steps, rows):
        kind = lambda module: type(module).__name__
        seen.append({name: (step.plan, kind(step.model.lm_head), kind(step.model.transformer.h[0].mlp.c_fc))
                     for name, step in steps.items()})
        return {"chosen": chosen_s, "streamed": streamed_s}

    model = _tiny()
    step = fastest.fastest_step(model, rows=2, compile=True, measure_steps=measure)
    chosen = Plan("packed", "packed", onednn=False, attention="math", compiled=True)
    # the twin: blocks streamed, the head plain and frozen, the step's oneDNN flag and attention
    twin = Plan("streamed", "out_in", onednn=False, attention="math", frozen=True, compiled=True)
    assert twin.name == "head frozen, blocks streamed, without oneDNN, math attention"
    assert seen == [{"chosen": (chosen, "PackedLinear", "PackedLinear"),
                     "streamed": (twin, "Linear", "StreamedLinear")}]
    assert step.plan == (twin if streamed else chosen) and step.compiled and step.model is not model
    assert isinstance(step.model.lm_head, torch.nn.Linear if streamed else PackedLinear)
    assert any(("step streamed" if streamed else "step as chosen") in note for note in step.notes)
    fastest.fastest_step(_tiny(), compile=False, measure_steps=measure)
    fastest.fastest_step(_tiny(), compile=True, plan=chosen_plan, measure_steps=measure)
    assert len(seen) == 1


def test_a_plan_is_a_plain_record_a_later_run_can_hand_back(monkeypatch) -> None:
    """Through JSON and back, and followed as given: nothing is measured, and `compile` still decides."""
    plan = Plan("in_out", "packed", onednn=False, attention="math", frozen=False, compiled=True)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    monkeypatch.setattr(fastest, "choose_plan", lambda *a: pytest.fail("a given plan was measured again"))
    step = fastest.fastest_step(_tiny(), rows=2, plan=plan)
    assert step.plan == Plan("in_out", "packed", onednn=False, attention="math") and not step.compiled
    assert isinstance(step.model.lm_head, PackedLinear)


def test_an_int8_step_is_never_frozen(monkeypatch) -> None:
    """Only the attention is chosen for int8 weights: their matrices keep their own kernel."""
    monkeypatch.setattr(fastest, "compile_problem", lambda device: None)
    model = quantize_int8(_tiny(), torch.float32)
    attention = lambda *a: {"sdpa": 1.0, "math": 1.0, "streamed": 1.0}
    plan, why = fastest.choose_plan(model, 2, True, measure_attention=attention)
    assert plan == Plan(attention="sdpa", compiled=True) and len(why) == 1 and why[0].startswith("attention")


@pytest.mark.parametrize(("fp32_s", "bf16_s", "chosen"),
                         [(2.0, 1.0, torch.bfloat16), (1.0, 0.9, torch.float32)])
def test_int8_activations_follow_the_measurement(fp32_s, bf16_s, chosen) -> None:
    measure = lambda w, rows, dtypes: {torch.float32: fp32_s, torch.bfloat16: bf16_s}
    dtype, why = choose_int8_activation_dtype(torch.zeros(8, 16), 1, measure)
    assert dtype == chosen and str(chosen).removeprefix("torch.") in why
    # a layer width bfloat16's kernel cannot take (tests/model/test_int8.py) is not even measured
    assert choose_int8_activation_dtype(torch.zeros(8, 40), 1, measure)[0] == torch.float32


def test_the_int8_measurements_are_real_times() -> None:
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))
    times = time_int8_activations(w, 1, [torch.float32, torch.bfloat16], repeats=1)
    assert set(times) == {torch.float32, torch.bfloat16} and all(0 < t < float("inf") for t in times.values())


def test_a_step_without_compile_is_eager_and_says_so() -> None:
    step = DecodeStep(copy.deepcopy(_tiny()))
    assert not step.compiled and step.plan == DEFAULT and step.name.startswith("decode step eager")
