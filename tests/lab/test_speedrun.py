"""The CPU speedrun: docs/speedrun.md shows what docs/speedrun.json renders to, the table's statistics are the
ones computed here by hand, and a real configs x seeds sweep at equal FLOPs is scored correctly (against a
loss computed here from the raw bytes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_script
from conftest import CONFIG_DIR, ROOT, compose_train, fast_overrides

from minigpt.checkpoint.load import load_model
from minigpt.cli import to_object
from minigpt.data.config import DataConfig
from minigpt.data.sources import load_corpus
from minigpt.data.tokenizers import ByteTokenizer
from minigpt.errors import UserError
from minigpt.lab import speedrun
from minigpt.lab.runs import RunRecord
from minigpt.model.factory import build_model
from minigpt.training.config import TrainConfig

DOC = ROOT / "docs" / "speedrun.md"


def test_the_doc_table_is_rendered_from_the_checked_in_results():
    results = speedrun.load_results(ROOT / "docs" / "speedrun.json")
    assert results["rows"], "docs/speedrun.json holds no rows"
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index(speedrun.BEGIN): text.index(speedrun.END) + len(speedrun.END)]
    stale = "docs/speedrun.md is stale: run `python scripts/speedrun.py render=true`"
    assert block == speedrun.render_table(results), stale
    rows = [RunRecord(**r) for r in results["rows"]]
    assert all(r.budget.startswith("trainer.max_flops=") for r in rows)  # the documented runs: equal FLOPs
    assert len({r.seed for r in rows}) >= 3  # and at least three seeds


def test_every_candidate_is_the_llama_style_run_at_the_speedruns_budget_plus_its_change():
    candidates = sorted(p.stem for p in (CONFIG_DIR / "experiment" / "speedrun").glob("*.yaml"))
    default = to_object(compose_train(["model=demo", "optim=muon"]), TrainConfig)
    base = to_object(compose_train(["experiment=speedrun/default"]), TrainConfig)
    assert base.model == default.model and base.optim == default.optim  # pinned: the table's baseline
    assert base.trainer.max_steps is None and base.trainer.max_flops == 8.16e12
    with torch.device("meta"):  # 8.16e12 FLOPs are 1,500 steps of model=demo at the default batch
        tokens = default.trainer.batch_size * default.model.block_size
        per_step = build_model(default.model, vocab_size=4096).flops_per_token() * tokens
    assert math.ceil(base.trainer.max_flops / per_step) == 1500
    for name in candidates:
        cfg = to_object(compose_train([f"experiment=speedrun/{name}"]), TrainConfig)
        assert cfg.run_name == name and cfg.trainer.max_flops == base.trainer.max_flops, name
        assert cfg.data == base.data and cfg.tokenizer == base.tokenizer, name  # the same val text


def _row(config: str, seed: int, bpb: float, cpu: str = "cpu A") -> RunRecord:
    return RunRecord(config=config, seed=seed, budget="trainer.max_flops=1e+12",
                     machine={"cpu": cpu, "cores": 2, "dtype": "bfloat16", "torch": "2.13"}, steps=10,
                     params=1000, tokens=1000, flops=1e12, train_seconds=2.0, tokens_per_s=500.0,
                     val_loss=2 * bpb, bits_per_byte=bpb, command=f"python scripts/train.py {config}",
                     date="2026-01-01")


def _results(rows: list[RunRecord], baseline: str = "default") -> dict:
    return {"baseline": baseline, "rows": [r.__dict__ for r in rows]}


def test_each_line_is_a_config_over_its_seeds_against_the_baseline_seed_by_seed():
    base = [_row("default", s, b) for s, b in ((1, 1.60), (2, 1.62), (3, 1.61))]
    worse = [_row("a=1", s, b) for s, b in ((1, 1.70), (2, 1.74), (3, 1.72))]  # d = 0.10, 0.12, 0.11
    same = [_row("a=2", s, b) for s, b in ((1, 1.61), (2, 1.61), (3, 1.62))]  # d = 0.01, -0.01, 0.01
    table = speedrun.render_table(_results([*worse, *base, *same]))
    lines = [line for line in table.splitlines() if line.startswith("| `")]
    assert [line.split("|")[1].strip() for line in lines] == ["`default` (baseline)", "`a=2`", "`a=1`"]
    # by hand: bpb 1.70, 1.74, 1.72 (sd 0.02): 1.72 ± 4.3027 * 0.02 / sqrt 3 = 0.0497; the loss is twice it.
    # d = 0.10, 0.12, 0.11 has mean 0.11, sd 0.01; t = 0.11 / (0.01 / sqrt 3) = 19.05 with 2 df:
    # p = 1 - t / sqrt(2 + t^2) = 0.00274; half-width 4.3027 * 0.01 / sqrt 3 = 0.0248
    cells = [c.strip() for c in lines[2].split("|")]
    assert cells[2:8] == ["1e+12 FLOPs", "3", "3.440 ± 0.099", "1.720 ± 0.050", "+0.110 ± 0.025", "0.0027"]
    t = (0.01 / 3) / (math.sqrt(((0.01 - 1 / 300) ** 2 * 2 + (-0.01 - 1 / 300) ** 2) / 2) / math.sqrt(3))
    p = 1 - t / math.sqrt(2 + t * t)
    cells = [c.strip() for c in lines[1].split("|")]
    assert cells[6] == "+0.003 ± 0.029 (noise)" and cells[7] == f"{p:.2g}"
    assert [c.strip() for c in lines[0].split("|")][6:8] == ["-", "-"]  # the baseline itself
    assert "cpu A, 2 cores, bfloat16, torch 2.13 (2026-01-01)" in table and "seeds (1, 2, 3;" in table


def test_merge_keeps_other_machines_and_replaces_a_rerun():
    old = speedrun.new_results([_row("default", 1, 1.6), _row("default", 1, 1.5, cpu="cpu B")])
    new = speedrun.new_results([_row("default", 1, 1.4), _row("a=1", 1, 1.7)])
    merged = speedrun.merge(old, new)
    assert merged["baseline"] == "default"
    got = sorted((r["config"], r["machine"]["cpu"], r["bits_per_byte"]) for r in merged["rows"])
    assert got == [("a=1", "cpu A", 1.7), ("default", "cpu A", 1.4), ("default", "cpu B", 1.5)]
    # the same seed on two machines counts once, with the mean of its runs
    assert "| `default` (baseline) | 1e+12 FLOPs | 1 | 2.900 | 1.450 |" in speedrun.render_table(merged)


def test_a_doc_without_markers_and_a_broken_json_are_one_line_errors(tmp_path: Path):
    with pytest.raises(UserError, match="speedrun:begin"):
        speedrun.update_doc("# no table here\n", "table", "speedrun.md")
    bad = tmp_path / "results.json"
    bad.write_text('{"rows": [{"config": "x"}]}')
    with pytest.raises(UserError, match="not a speedrun results file"):
        speedrun.load_results(bad)


def test_the_report_refuses_a_doc_without_markers_before_scoring(tmp_path: Path, capsys):
    doc = tmp_path / "speedrun.md"
    doc.write_text("no markers\n")
    run = run_script("speedrun", [f"sweep={tmp_path / 'nowhere'}", "docs=true", f"doc={doc}",
                                  f"results={tmp_path / 'r.json'}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "speedrun:begin" in run.err_lines[0]
    assert doc.read_text() == "no markers\n" and not (tmp_path / "r.json").exists()
    run = run_script("speedrun", [f"sweep={tmp_path / 'nowhere'}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "is not a folder" in run.err_lines[0]
    run = run_script("speedrun", ["sweeep=x"], capsys)  # a misspelled key: Hydra's refusal, in one line
    assert run.code == 2 and len(run.err_lines) == 1 and "sweeep" in run.err_lines[0]


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
def test_a_configs_x_seeds_sweep_at_equal_flops_is_scored_and_tabulated(tmp_path: Path, corpus_dir: Path,
                                                                        capsys):
    """Two configs (one twice as deep) x two seeds, as `make speedrun` runs them: every run stops at the
    first step at or past the FLOPs budget, so the deeper model trains fewer steps."""
    fast = fast_overrides(tmp_path, corpus_dir)
    per_token = {}
    for layers in (2, 4):
        cfg = to_object(compose_train([*fast, f"model.n_layer={layers}"]), TrainConfig)
        model = build_model(cfg.model, vocab_size=ByteTokenizer().vocab_size)
        per_token[f"model.n_layer={layers}"] = model.flops_per_token()
    budget = 6.5 * per_token["model.n_layer=2"] * 4 * 32  # 7 steps of the debug model (4 x 32 tokens each)
    sweep = tmp_path / "sweep"
    train = run_script("train", ["-m", *fast, "model.n_layer=2,4", "trainer.seed=1,2",
                                 "trainer.max_steps=null", f"trainer.max_flops={budget}",
                                 "logging.sample_tokens=0", f"hydra.sweep.dir={sweep}"], capsys)
    assert train.code == 0, train.err
    doc, results = tmp_path / "speedrun.md", tmp_path / "results.json"
    doc.write_text(f"# title\n\nbefore\n\n{speedrun.BEGIN}\nold\n{speedrun.END}\n\nafter\n")
    args = [f"sweep={sweep}", "docs=true", f"doc={doc}", f"results={results}"]
    report = run_script("speedrun", args, capsys)
    assert report.code == 0, report.err
    got = json.loads(results.read_text())
    # a config is the job's overrides without its seed and budget
    shallow, deep = (" ".join([*fast, f"model.n_layer={n}", "logging.sample_tokens=0"]) for n in (2, 4))
    per_token = {shallow: per_token["model.n_layer=2"], deep: per_token["model.n_layer=4"]}
    assert got["baseline"] == shallow  # job 0's config
    rows = [RunRecord(**r) for r in got["rows"]]
    assert [(r.config, r.seed) for r in rows] == [(shallow, 1), (shallow, 2), (deep, 1), (deep, 2)]
    for job, row in enumerate(rows):
        assert row.budget == f"trainer.max_flops={budget:.4g}" and row.machine["dtype"] == "float32"
        assert budget <= row.flops < budget + row.flops / row.steps  # less than one step over
        assert row.flops == row.tokens * per_token[row.config] and row.tokens == row.steps * 128
        nats, scored, n_bytes = _disjoint_window_loss(sweep / str(job))
        assert row.val_loss == pytest.approx(nats / scored, rel=1e-5)
        assert row.bits_per_byte == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert {r.steps for r in rows if r.config == shallow} == {7}
    assert all(r.steps < 7 for r in rows if r.config == deep)
    text = doc.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old" not in text
    assert speedrun.render_table(got) in text
    assert (sweep / "speedrun.json").is_file()
    assert speedrun.render_table(got) in (sweep / "speedrun.md").read_text()
