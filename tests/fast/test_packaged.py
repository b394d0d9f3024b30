"""The packaged decode step (fast/packaged.py) and its place in the decode-step cache (fast/kept.py): a
package is found only under its own key and weights, a damaged one is packaged again with one line, a wrong
one is refused by the numbers gate, and the step hands what a package does not hold to the model's own step.

Building a real package starts the C++ compiler, so here packaging is injected: the "package" is the exported
program's module run eagerly (`_Program`), which takes the same inputs as the compiled one. The real thing,
across two processes, is in tests/fast/test_kept.py's slow tier.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_config

from minigpt.fast import packaged
from minigpt.fast.gate import record_probes
from minigpt.fast.kept import Kept, StepCache, weights_digest
from minigpt.fast.step import Plan, build_step
from minigpt.model.factory import build_model
from minigpt.sampling.decode import decode_forward, generate, prefill
from minigpt.sampling.params import SamplingParams

MACHINE = {"torch": "2.13.0", "cpu": "AMD EPYC 9R14", "isa": "AVX512", "cpu_flags": "0123456789abcdef"}
KEPT = Kept(Plan(attention="math", compiled=True), ["attention math"], 30.0)


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=61)).eval()


def _cache(folder: Path) -> StepCache:
    return StepCache(folder, lambda: MACHINE)


def _inject(monkeypatch, model: torch.nn.Module, shift: float = 0.0) -> list:
    """Packaging injected: a 'package' is a file of bytes, and loading it gives `model`'s `_Program` run
    eagerly (its logits moved by `shift` at one entry). Returns the packagings made."""
    made = []

    def package_step(step, example, path):
        made.append(example.batch_size)
        Path(path).write_bytes(b"package of rows %d" % example.batch_size)

    def load_package(path):
        program = packaged._Program(copy.deepcopy(model))
        return lambda *inputs: program(*inputs) + shift * (torch.arange(61) == 7)
    monkeypatch.setattr(packaged, "package_step", package_step)
    monkeypatch.setattr(packaged, "load_package", load_package)
    return made


def test_a_package_is_found_only_under_its_key_and_for_its_weights(tmp_path: Path) -> None:
    cache, model = _cache(tmp_path), _tiny()
    key, weights = cache.key(model, 1, True), weights_digest(model)
    cache.write(key, KEPT)
    assert cache.package(key, weights) is None  # none kept yet: a quiet miss
    kept = cache.keep_package(key, KEPT, b"package", weights)
    assert cache.peek(key) == kept and kept.package["weights"] == weights
    assert cache.package(key, weights).read_bytes() == b"package"
    assert cache.package(key, weights_digest(_tiny().half())) is None  # other weights
    assert cache.package(cache.key(model, 2, True), weights) is None  # another key: rows
    assert cache.package(StepCache(tmp_path, lambda: {**MACHINE, "torch": "2.14.0"}).key(model, 1, True),
                         weights) is None  # another key: torch


def test_the_weights_digest_changes_with_any_one_weight() -> None:
    model = _tiny()
    assert weights_digest(model) == weights_digest(copy.deepcopy(model))
    with torch.no_grad():
        model.transformer.h[1].mlp.c_proj.weight[3, 5] += 1e-6
    assert weights_digest(model) != weights_digest(_tiny())


def test_a_packaged_step_is_kept_and_read_back_and_decodes_as_the_eager_step(monkeypatch, tmp_path) -> None:
    cache, model = _cache(tmp_path), _tiny()
    key, weights = cache.key(model, 2, True), weights_digest(model)
    made = _inject(monkeypatch, model)
    step, kept = packaged.packaged_step(model, 2, key, KEPT, cache, weights)
    assert made == [2] and "packaged" in step.notes and cache.peek(key).package == kept.package
    step, _ = packaged.packaged_step(model, 2, key, cache.peek(key), cache, weights)
    assert made == [2] and "kept, packaged" in step.notes  # read back, not packaged again
    prompts = [[3, 4, 5], [6, 7, 8]]  # unpadded rows through the package, then padded ones through the model
    for rows in (prompts, [[3], [6, 7, 8]]):
        args = dict(max_new_tokens=30, params=SamplingParams(0.0), generator=torch.Generator())
        want = generate(model, rows, **args).tokens  # 30 tokens: past the context, windows rebuilt
        assert generate(model, rows, step=step, **args).tokens == want


def test_what_a_package_does_not_hold_goes_through_the_model_s_own_step() -> None:
    model, calls = _tiny(), []
    program = packaged._Program(copy.deepcopy(model))
    runner = lambda *inputs: calls.append(1) or program(*inputs)
    step = packaged.PackagedStep.loaded(model, KEPT.plan, 2, runner)
    cases = {"one token a row": (model.new_kv_cache(2), 1, False), "padded": (model.new_kv_cache(2), 1, True),
             "two tokens a row": (model.new_kv_cache(2), 2, False),
             "a shorter cache": (model.new_kv_cache(2, max_len=12), 1, False)}
    for name, (cache, tokens, padded) in cases.items():
        calls.clear()
        mine = model.new_kv_cache(2, max_len=cache.max_len)
        for c in (cache, mine):
            c.set_padding(torch.tensor([1 if padded else 0, 0]))
            model(torch.tensor([[5, 6, 7], [8, 9, 10]]), kv_cache=c)  # prefilled
        fed = torch.tensor([[11, 12][:tokens], [13, 14][:tokens]])  # (2, tokens)
        want = decode_forward(model, fed, mine)
        assert torch.allclose(step(fed, cache), want, atol=1e-5) and cache.length == mine.length, name
        assert calls == ([1] if name == "one token a row" else []), name


@pytest.mark.parametrize("damage", ["bytes", "missing"])
def test_a_damaged_package_is_packaged_again_with_one_line(damage: str, monkeypatch, caplog,
                                                            tmp_path: Path) -> None:
    cache, model = _cache(tmp_path), _tiny()
    key, weights = cache.key(model, 1, True), weights_digest(model)
    kept = cache.keep_package(key, KEPT, b"package", weights)
    file = tmp_path / kept.package["file"]
    file.write_bytes(b"packagf") if damage == "bytes" else file.unlink()
    made = _inject(monkeypatch, model)
    with caplog.at_level(logging.INFO, logger="minigpt.fast"):
        step, kept = packaged.packaged_step(model, 1, key, kept, cache, weights)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 1 and f"decode cache {file} is damaged" in lines[0], lines
    assert made == [1] and "packaged" in step.notes  # packaged again, not trusted
    assert cache.package(key, weights).read_bytes() == b"package of rows 1"


def test_a_package_that_gives_other_numbers_is_refused_with_one_line(monkeypatch, caplog, tmp_path) -> None:
    cache, model = _cache(tmp_path), _tiny()
    _inject(monkeypatch, model, shift=1.0)
    with caplog.at_level(logging.INFO, logger="minigpt.fast"):
        step, _ = packaged.packaged_step(model, 1, cache.key(model, 1, True), KEPT, cache,
                                         weights_digest(model))
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert step is None and len(lines) == 1 and "refused the decode step packaged" in lines[0], lines


def test_a_step_is_traced_on_the_gate_s_first_probe_as_its_prefill_left_it(monkeypatch, tmp_path) -> None:
    """The example a package is traced on is the cache of the probe it is then held to: its rows, its
    prompts' keys in their slots, and nothing of the tokens fed after them."""
    cache, model = _cache(tmp_path), _tiny()
    _inject(monkeypatch, model)
    examples = []
    package = packaged.package_step
    monkeypatch.setattr(packaged, "package_step", lambda step, example, path: examples.append(
        (example.length, example.k[0].clone())) or package(step, example, path))
    packaged.packaged_step(model, 3, cache.key(model, 3, True), KEPT, cache, weights_digest(model))
    first = record_probes(model, 3)[0]  # recorded again: the probes are seeded
    (length, keys), = examples
    want, _ = prefill(model, first.prompts)
    assert length == want.length == 8 and keys.shape[0] == 3
    assert torch.equal(keys[:, :, :length], want.k[0][:, :, :length])


def test_a_context_too_short_to_trace_on_is_compiled_not_packaged(monkeypatch, caplog, tmp_path) -> None:
    """Export specialises on cache lengths 0 and 1: a model whose probe prompts are one token long (a
    context of 5) keeps its compiled step, with one line saying why, and nothing is packaged."""
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=1, n_head=2, n_embd=16, block_size=5, vocab_size=61)).eval()
    made = _inject(monkeypatch, model)
    compiled = build_step(copy.deepcopy(model), KEPT.plan, 1)
    with caplog.at_level(logging.INFO, logger="minigpt.fast"):
        step = packaged.packaged_candidate(compiled, model, record_probes(model, 1)[0].prefilled, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert step is compiled and made == [] and len(lines) == 1, lines
    assert "not packaged: a context of 5 tokens is too short to trace a step on" in lines[0]
