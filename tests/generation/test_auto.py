"""compile=auto (generation/auto.py): compiled only where the steps asked for pay for the start, from the
timings and the records of a real decode-step cache injected; the config's three values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import tiny_config

from minigpt.errors import UserError
from minigpt.fast.kept import Kept, StepCache
from minigpt.fast.step import DEFAULT, Plan
from minigpt.generation.auto import choose_compile
from minigpt.generation.config import GenerateConfig
from minigpt.model.factory import build_model

COMPILED = Plan(attention="math", compiled=True)
# a step 2 ms eager and 0.5 ms compiled: 1.5 ms saved per step
WARM = Kept(COMPILED, [], choose_s=30.0, times={"eager": 2e-3, "compiled": 5e-4}, warm_s=3.0)


def _never(model, rows) -> float:
    raise AssertionError("the eager step was timed where nothing needed it")


def _choose(folder: Path, steps: int, kept: Kept | None, other: Kept | None, time_eager=_never):
    """choose_compile for a tiny model decoding 1 row, its cache holding `kept` for this model and `other`
    for another model on the same machine (None: no record)."""
    torch.manual_seed(0)
    model, another = (build_model(tiny_config(n_layer=n, block_size=16, vocab_size=61)) for n in (1, 2))
    cache = StepCache(folder, lambda: {"cpu": "test"})
    for m, record in ((another, other), (model, kept)):  # written in this order: `kept` is the newest
        if record is not None:
            cache.write(cache.key(m, 1, True), record)
    return choose_compile(model, 1, steps, cache, time_eager)


@pytest.mark.parametrize(("steps", "compiled"), [(1000, False), (2000, False), (2001, True), (100_000, True)])
def test_a_warm_cache_compiles_where_the_steps_pay_for_its_start(tmp_path, steps, compiled) -> None:
    chose, why = _choose(tmp_path, steps, WARM, WARM)  # 2000 x 1.5 ms = 3 s: the warm start
    assert chose == compiled and why.startswith("compiled" if compiled else "eager")
    assert f"{steps} steps x 1.50 ms saved" in why and "warm start of 3.0 s (kept)" in why


def test_a_warm_cache_whose_start_is_not_measured_yet_compiles(tmp_path) -> None:
    chose, why = _choose(tmp_path, 10, Kept(COMPILED, [], 30.0, dict(WARM.times)), None)
    assert chose and why == "compiled: the cache is warm (chosen and compiled once, in 30 s)"


def test_where_the_gate_refused_every_compiled_step_here_it_stays_eager(tmp_path) -> None:
    chose, why = _choose(tmp_path, 10**6, Kept(DEFAULT, [], 30.0), WARM)
    assert not chose and "refused by the numbers gate" in why


@pytest.mark.parametrize(("eager_s", "steps", "compiled"), [(2e-3, 20_000, False), (2e-3, 20_001, True),
                                                            (4e-3, 10_001, True)])
def test_a_cold_cache_weighs_choosing_and_compiling_estimated_from_the_newest_kept_step(
        tmp_path, eager_s, steps, compiled) -> None:
    """Cold: another model's record gives the cost (30 s) and the speedup (4x); this eager step is timed."""
    timed = []
    chose, why = _choose(tmp_path, steps, None, WARM, lambda model, rows: timed.append(rows) or eager_s)
    # saved per step: eager_s x (1 - 1/4); 2 ms -> 1.5 ms, 30 s / 1.5 ms = 20,000 steps
    assert timed == [1] and chose == compiled
    assert "choosing and compiling of 30.0 s (estimated from the newest compiled step kept here)" in why


def test_with_nothing_compiled_on_this_machine_it_stays_eager(tmp_path) -> None:
    chose, why = _choose(tmp_path, 10**6, None, None)
    assert not chose and why.startswith("eager: nothing compiled on this machine yet")


def test_without_a_cache_it_stays_eager() -> None:
    chose, why = choose_compile(build_model(tiny_config(vocab_size=61)), 1, 10**6, None, _never)
    assert not chose and why == "eager: no decode-step cache to judge compiling by"


@pytest.mark.parametrize(("given", "kept"), [(True, "true"), (False, "false"), ("auto", "auto"),
                                             ("AUTO", "auto")])
def test_compile_is_true_false_or_auto(given, kept: str) -> None:
    assert GenerateConfig(compile=given).compile == kept
    with pytest.raises(UserError, match=r"compile=sometimes must be one of true, false, auto"):
        GenerateConfig(compile="sometimes")
