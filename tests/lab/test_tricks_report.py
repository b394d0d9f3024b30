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
from minigpt.lab.tricks import collect, compare, markers, page_block, render_block

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


def test_an_arm_built_on_its_control_shows_only_what_it_adds(tmp_path):
    base = ["optim.lr=1e-2", "model.n_layer=3"]
    for seed in range(2):
        _run(tmp_path, "s500_base", seed, 500, 4.5, base)
        _run(tmp_path, "s500_more", seed, 500, 4.4, [*base, "model.qk_norm=true"])
        _run(tmp_path, "s500_other", seed, 500, 4.4, ["optim.lr=2e-2", "model.qk_norm=true"])
    doc = collect(tmp_path, {"s500_more": "s500_base", "s500_other": "s500_base"})
    table = render_block(doc)
    assert "| s500_more | `+ model.qk_norm=true` | 500 |" in table
    # it drops model.n_layer=3, so the whole list is shown
    assert "| s500_other | `optim.lr=2e-2` `model.qk_norm=true` | 500 |" in table
    assert "| s500_base | `optim.lr=1e-2` `model.n_layer=3` | 500 |" in table


def test_collect_refuses_an_arm_whose_runs_change_different_things(tmp_path):
    _run(tmp_path, "s500_x", 0, 500, 4.9, ["model.qk_norm=true"])
    _run(tmp_path, "s500_x", 1, 500, 4.9, ["model.smear=true"])
    with pytest.raises(UserError, match="unlike the other runs of its arm"):
        collect(tmp_path)
    with pytest.raises(UserError, match="no finished runs"):
        collect(tmp_path / "missing")


def test_an_arm_that_changes_the_vocabulary_is_compared_in_bits_per_byte(tmp_path):
    for seed in range(3):
        _run(tmp_path, "base500", seed, 500, 4.9 + seed / 100)  # bits per byte: loss / 2.5
        _run(tmp_path, "s500_v8k", seed, 500, 5.2 + seed / 50, ["tokenizer.vocab_size=8192"])
    doc = collect(tmp_path)
    c = compare(doc, "s500_v8k")
    assert c.difference.mean == pytest.approx((0.3 + 0.01) / 2.5)  # bits/byte, not the nats' +0.31
    assert "| +0.124 ± " in render_block(doc) and " bits/byte vs base500 |" in render_block(doc)


def test_the_page_is_what_the_json_renders_to():
    doc = json.loads((ROOT / "docs" / "tricks.json").read_text())
    text = (ROOT / "docs" / "tricks.md").read_text()
    assert doc["rounds"]
    for name, round_doc in doc["rounds"].items():
        assert page_block(text, name) == render_block(round_doc), name


def test_the_script_writes_the_json_and_the_table_and_refuses_a_page_without_markers(tmp_path, capsys):
    for seed in range(2):
        _run(tmp_path / "runs", "base500", seed, 500, 4.9 + seed / 100)
        _run(tmp_path / "runs", "s500_qk_norm", seed, 500, 4.8 + seed / 50, ["model.qk_norm=true"])
    page, results = tmp_path / "tricks.md", tmp_path / "tricks.json"
    page.write_text("# page\n")
    args = [f"runs={tmp_path / 'runs'}", "round=two", f"doc={page}", f"results={results}"]
    run = run_script("tricks_report", args, capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "markers" in run.err_lines[0]
    assert page.read_text() == "# page\n" and not results.exists()  # nothing written
    (b1, e1), (b2, e2) = markers("one"), markers("two")
    page.write_text(f"# page\n{b1}\nkept\n{e1}\n{b2}\n{e2}\nafter\n")
    results.write_text(json.dumps({"rounds": {"one": {"arms": {}, "step_ratios": {}}}}))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"sections": {"techniques": {"rows": {"qk_norm": {"ratio": 1.25}}}}}))
    run = run_script("tricks_report", [*args, f"bench={bench}"], capsys)
    assert run.code == 0 and run.out == f"wrote {results}\nwrote {page}\n", run.err
    doc = json.loads(results.read_text())
    assert list(doc["rounds"]) == ["one", "two"]  # the other round kept
    assert doc["rounds"]["two"]["step_ratios"] == {"s500_qk_norm": 1.25}
    block = render_block(doc["rounds"]["two"])
    assert page.read_text() == f"# page\n{b1}\nkept\n{e1}\n{b2}\n{block}\n{e2}\nafter\n"
    page.write_text(page.read_text().replace(block, "stale"))
    run = run_script("tricks_report", ["render=true", f"results={results}", f"doc={page}"], capsys)
    assert run.code == 0 and page_block(page.read_text(), "two") == block
    controls = [f"runs={tmp_path / 'runs'}", "round=two", "+controls.s500_qk_norm=base500", f"doc={page}",
                f"results={results}"]
    assert run_script("tricks_report", controls, capsys).code == 0  # an arm named with its control


def _damaged(root):
    """Every way a run folder or an input file can be unreadable, each with the line it must end in."""
    meta = root / "runs" / "s500_relu2" / "s0" / "checkpoints" / "last" / "meta.json"
    cases = {
        "corrupt meta.json": (lambda: meta.write_text('{"val_loss": '), [], f"{meta} cannot be read as"),
        "meta.json of no run": (lambda: meta.write_text("{}"), [], f"{meta} lacks 'val_loss'"),
        "no overrides": (lambda: (meta.parents[2] / ".hydra" / "overrides.yaml").unlink(), [],
                         f"{meta.parents[2]} has no .hydra/overrides.yaml"),
        "corrupt bench": (lambda: (root / "bench.json").write_text("["), [f"bench={root / 'bench.json'}"],
                          f"{root / 'bench.json'} cannot be read as a bench JSON"),
        "bench without the section": (lambda: (root / "bench.json").write_text("{}"),
                                      [f"bench={root / 'bench.json'}"], "has no techniques section"),
        "corrupt results": (lambda: (root / "tricks.json").write_text("{"), [],
                            f"{root / 'tricks.json'} cannot be read as the screen's JSON"),
        "unknown control": (lambda: None, ["+controls.s500_relu2=base900"], "base900"),
        "no runs": (lambda: None, [f"runs={root / 'none'}"], "no finished runs"),
        "round without runs": (lambda: None, ["runs=null"], "give the arms and their round"),
        "render and runs": (lambda: None, ["render=true"], "render=true reads no runs"),
    }
    return cases


@pytest.mark.parametrize("case", list(_damaged(ROOT)))
def test_bad_input_is_one_line_naming_the_file_and_nothing_is_written(case, tmp_path, capsys):
    for seed in range(2):
        _run(tmp_path / "runs", "base500", seed, 500, 4.9)
        _run(tmp_path / "runs", "s500_relu2", seed, 500, 4.8, ["model.activation=relu2"])
    page, results = tmp_path / "tricks.md", tmp_path / "tricks.json"
    begin, end = markers("r")
    page.write_text(f"{begin}\n{end}\n")
    results.write_text(json.dumps({"rounds": {}}))
    damage, extra, message = _damaged(tmp_path)[case]
    damage()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    args = [f"runs={tmp_path / 'runs'}", "round=r", f"doc={page}", f"results={results}", *extra]
    run = run_script("tricks_report", args, capsys)
    assert run.code == 2 and len(run.err_lines) == 1, run.err
    assert run.err.startswith("error: ") and message in run.err and "Traceback" not in run.err, run.err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
