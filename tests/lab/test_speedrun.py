"""The CPU speedrun: the table in docs/speedrun.md is what docs/speedrun.json renders to, and the sweep
machinery scores real time-budgeted runs correctly (checked against a loss computed here from the raw
bytes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_script
from conftest import ROOT, fast_overrides

from minigpt.checkpoint.load import load_model
from minigpt.data.config import DataConfig
from minigpt.data.sources import load_corpus
from minigpt.errors import UserError
from minigpt.lab import speedrun


def test_the_docs_table_is_rendered_from_the_checked_in_results():
    results = speedrun.load_results(ROOT / "docs" / "speedrun.json")
    assert results["rows"], "docs/speedrun.json holds no rows"
    doc = (ROOT / "docs" / "speedrun.md").read_text(encoding="utf-8")
    block = doc[doc.index(speedrun.BEGIN): doc.index(speedrun.END) + len(speedrun.END)]
    stale = "docs/speedrun.md is stale: run `python scripts/speedrun.py --render`"
    assert block == speedrun.render_table(results), stale


def _row(command: str, loss: float) -> speedrun.Row:
    return speedrun.Row(config=command.split()[-1], budget="1s", val_loss=loss, bits_per_byte=loss / 2,
                        steps=3, tokens=300, tokens_per_s=100.0, train_seconds=3.0, command=command,
                        machine="m", date="2026-01-01")


def test_merge_replaces_a_rerun_and_sorts_best_first():
    results = speedrun.merge({"rows": []}, [_row("python scripts/train.py a=1", 3.0),
                                            _row("python scripts/train.py a=2", 2.0)])
    results = speedrun.merge(results, [_row("python scripts/train.py a=1", 1.5)])
    assert [(r["config"], r["val_loss"]) for r in results["rows"]] == [("a=1", 1.5), ("a=2", 2.0)]
    table = speedrun.render_table(results)
    assert table.index("`a=1`") < table.index("`a=2`") and "| 1.500 | 0.750 | 3 | 100 |" in table


def test_a_readme_without_markers_and_a_broken_json_are_one_line_errors(tmp_path: Path):
    with pytest.raises(UserError, match="speedrun:begin"):
        speedrun.update_readme("# no table here\n", "table")
    bad = tmp_path / "results.json"
    bad.write_text('{"rows": [{"config": "x"}]}')
    with pytest.raises(UserError, match="not a speedrun results file"):
        speedrun.load_results(bad)


def _disjoint_window_loss(run: Path) -> tuple[float, int, int]:
    """(summed nats, scored tokens, val bytes), computed here: the val documents as raw bytes (the byte
    tokenizer's ids, end-of-text = 256 before each), each target scored once in consecutive windows of `block`
    targets; the last, shorter one reads back a full `block` of context (as evaluate.py does)."""
    model, _, meta = load_model(run, "cpu")
    block = model.config.block_size
    data = DataConfig(**meta["config"]["data"])
    docs = list(load_corpus(data, Path(data.cache_dir)).documents("val"))
    ids = [i for d in docs for i in (256, *d.text.encode("utf-8"))]
    nats, scored = 0.0, 0
    with torch.no_grad():
        for first in range(1, len(ids), block):  # the first target of this window
            end = min(first + block, len(ids))
            chunk = torch.tensor(ids[max(0, end - 1 - block) : end])
            logits, _ = model(chunk[None, :-1])  # (1, T, V)
            new = end - first  # targets not scored before
            nats += F.cross_entropy(logits[0, -new:].double(), chunk[-new:], reduction="sum").item()
            scored += new
    return nats, scored, sum(len(d.text.encode("utf-8")) for d in docs)


@pytest.mark.slow
def test_a_two_job_sweep_trains_to_the_budget_scores_each_run_and_writes_the_table(tmp_path: Path,
                                                                                  corpus_dir: Path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{speedrun.BEGIN}\nold\n{speedrun.END}\n\nafter\n")
    results_path, sweep = tmp_path / "results.json", tmp_path / "sweep"
    args = ["--budget", "1s", "--results", str(results_path), "--readme", str(readme),
            "--sweep-dir", str(sweep), *fast_overrides(tmp_path, corpus_dir), "optim.lr=0.003,0.01",
            "logging.sample_tokens=0"]
    result = run_script("speedrun", args, capsys)
    assert result.code == 0, result.err
    rows = json.loads(results_path.read_text())["rows"]
    assert len(rows) == 2 and {r["config"].split()[-2] for r in rows} == {"optim.lr=0.003", "optim.lr=0.01"}
    for row in rows:
        job = sweep / ("0" if "optim.lr=0.003" in row["config"] else "1")
        assert row["train_seconds"] >= 1.0  # the budget ends a run, never earlier
        assert row["tokens"] == row["steps"] * 4 * 32  # debug=fast: batch 4 x block 32
        assert row["command"].startswith("python scripts/train.py ")
        assert "trainer.max_time=1s" in row["command"]
        nats, scored, n_bytes = _disjoint_window_loss(job)
        assert row["val_loss"] == pytest.approx(nats / scored, rel=1e-5)
        assert row["bits_per_byte"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old" not in text
    assert speedrun.render_table(json.loads(results_path.read_text())) in text
