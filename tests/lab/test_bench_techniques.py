"""The techniques section of the bench: one contender per technique switch, each timed against the default."""

from __future__ import annotations

import pytest
import torch

from minigpt.lab.bench.report import format_techniques
from minigpt.lab.bench.techniques import TECHNIQUES, bench_techniques
from minigpt.model.config import ModelConfig
from minigpt.training.config import OptimConfig


def _changed(model: dict, optim: dict) -> set[str]:
    changed = {k for k, v in vars(ModelConfig(**model)).items() if getattr(ModelConfig(), k) != v}
    return changed | {k for k, v in vars(OptimConfig(**optim)).items() if getattr(OptimConfig(), k) != v}


def test_every_contender_is_a_valid_switch_and_the_default_is_the_default_run():
    assert TECHNIQUES["default"] == ({}, {})
    singles = {name: _changed(*c) for name, c in TECHNIQUES.items() if name != "combined"}
    for name, changed in singles.items():
        assert len(changed) == (0 if name == "default" else 1), name  # exactly one switch each
    # the combination is the union of three of the single switches
    model, optim = TECHNIQUES["combined"]
    for name in ("qk_norm", "relu2", "value_embeds"):
        assert TECHNIQUES[name][0].items() <= model.items() and TECHNIQUES[name][1].items() <= optim.items()
    assert _changed(model, optim) == set().union(*(singles[n] for n in ("qk_norm", "relu2", "value_embeds")))


@pytest.mark.slow
def test_a_quick_run_times_every_contender_against_the_default():
    result = bench_techniques(torch.device("cpu"), quick=True)
    assert set(result["rows"]) == set(TECHNIQUES)
    assert result["rows"]["default"]["ratio"] == 1.0
    assert all(r["step_s"] > 0 and r["tokens_per_s"] > 0 for r in result["rows"].values())
    table = format_techniques(result)
    assert len(table) == 3 + len(TECHNIQUES) and any(line.startswith("| adamw ") for line in table)
