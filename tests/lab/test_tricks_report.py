"""The technique screen's table (minigpt/lab/tricks.py, scripts/tricks_report.py): the arms read from run
folders, each paired with its control (against the t-test by hand), and docs/tricks.md against
docs/tricks.json."""

from __future__ import annotations

import json
import math

import pytest
from cli_helpers import run_script
from conftest import ROOT
from scipy import stats

from minigpt.errors import UserError
from minigpt.lab.tricks import BEGIN, END, collect, compare, page_block, render_block

COMMON = ["trainer.max_steps={steps}", "trainer.seed={seed}", "trainer.eval_tokens=all",
          "logging.sample_tokens=0", "device.type=cpu"]


def _run(root, arm, seed, steps, loss, change=()):
    run = root / arm / f"s{seed}"
    (run / ".hydra").mkdir(parents=True)
    lines = [o.format(steps=steps, seed=seed) for o in COMMON] + list(change)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in lines))
    (run / "checkpoints" / "last").mkdir(parents=True)
    meta = {"step": steps, "val_loss": loss, "val_bpb": loss / 2.5, "train_seconds": 60.0,
            "eval": {"eval_tokens": "all"}}
    (run / "checkpoints" / "last" / "meta.json").write_text(json.dumps(meta))


def test_collect_pairs_each_arm_with_the_control_of_its_budget_by_seed(tmp_path):
    for seed, loss in enumerate([4.90, 4.92, 4.91]):
        _run(tmp_path, "base500", seed, 500, loss)
        _run(tmp_path, "s500_relu2", seed, 500, loss - 0.05 - 0.01 * seed, ["model.activation=relu2"])
    _run(tmp_path, "base1500", 0, 1500, 4.27)
    _run(tmp_path, "s1500_relu2", 0, 1500, 4.20, ["model.activation=relu2"])
    _run(tmp_path, "s1500_relu2", 7, 1500, 4.10, ["model.activation=relu2"])  # no control of seed 7
    doc = collect(tmp_path)
    assert list(doc["arms"]) == ["base500", "s500_relu2", "base1500", "s1500_relu2"]  # controls first
    assert doc["arms"]["s500_relu2"]["change"] == ["model.activation=relu2"]
    assert doc["arms"]["s500_relu2"]["control"] == "base500" and doc["arms"]["base500"]["control"] is None
    c = compare(doc, "s500_relu2")
    assert c.difference.mean == pytest.approx(-0.06) and c.difference.n == 3
    # by hand: the differences are -0.05, -0.06, -0.07, so s = 0.01 and t = -0.06 / (0.01 / sqrt 3)
    assert c.p_value == pytest.approx(2 * stats.t.sf(0.06 / (0.01 / math.sqrt(3)), 2))
    c = compare(doc, "s1500_relu2")
    assert c.difference.n == 1 and c.difference.mean == pytest.approx(-0.07)  # seed 7 has no pair
    assert math.isnan(c.p_value)
    table = render_block(json.loads(json.dumps(doc)))  # as read back from the JSON
    assert "| s500_relu2 | `model.activation=relu2` | 500 | 3 | 4.850 |" in table
    _run(tmp_path, "s1200_relu2", 0, 1200, 4.25, ["model.activation=relu2"])  # equal time: fewer steps
    doc = collect(tmp_path, {"s1200_relu2": "base1500"})
    assert doc["arms"]["s1200_relu2"]["control"] == "base1500"
    assert compare(doc, "s1200_relu2").difference.mean == pytest.approx(-0.02)
    with pytest.raises(UserError, match="base900"):
        collect(tmp_path, {"s1200_relu2": "base900"})


def test_collect_refuses_an_arm_whose_runs_change_different_things(tmp_path):
    _run(tmp_path, "s500_x", 0, 500, 4.9, ["model.qk_norm=true"])
    _run(tmp_path, "s500_x", 1, 500, 4.9, ["model.smear=true"])
    with pytest.raises(UserError, match="unlike the other runs of its arm"):
        collect(tmp_path)
    with pytest.raises(UserError, match="no finished runs"):
        collect(tmp_path / "missing")


def test_the_page_is_what_the_json_renders_to():
    doc = json.loads((ROOT / "docs" / "tricks.json").read_text())
    assert page_block((ROOT / "docs" / "tricks.md").read_text()) == render_block(doc)


def test_the_script_writes_the_json_and_the_table_and_refuses_a_page_without_markers(tmp_path, capsys):
    for seed in range(2):
        _run(tmp_path / "runs", "base500", seed, 500, 4.9 + seed / 100)
        _run(tmp_path / "runs", "s500_qk_norm", seed, 500, 4.8 + seed / 50, ["model.qk_norm=true"])
    page = tmp_path / "tricks.md"
    page.write_text("# page\n")
    run = run_script("tricks_report", [str(tmp_path / "runs"), "--page", str(page)], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "markers" in run.err_lines[0]
    assert page.read_text() == "# page\n" and not (tmp_path / "tricks.json").exists()  # nothing written
    page.write_text(f"# page\n{BEGIN}\n{END}\nafter\n")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"sections": {"techniques": {"rows": {"qk_norm": {"ratio": 1.25}}}}}))
    run = run_script("tricks_report", [str(tmp_path / "runs"), "--page", str(page), "--bench", str(bench)],
                     capsys)
    assert run.code == 0
    doc = json.loads((tmp_path / "tricks.json").read_text())
    assert doc["step_ratios"] == {"s500_qk_norm": 1.25}
    assert page.read_text() == f"# page\n{BEGIN}\n{render_block(doc)}\n{END}\nafter\n"
