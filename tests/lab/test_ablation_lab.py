"""The ablation lab: its configs, the one command that runs it, and the report it writes."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_script
from conftest import CONFIG_DIR, ROOT, compose_train, fast_overrides

from minigpt.cli import to_object
from minigpt.data.eval_windows import eval_windows
from minigpt.lab.ablation_report import BEGIN, END, ROWS, readme_block, render_block
from minigpt.lab.loss_curves import read_scalars
from minigpt.training.config import TrainConfig
from minigpt.training.trainer import train

LAB = CONFIG_DIR / "experiment" / "ablation"
# what each file may change relative to the baseline: exactly one model field
CHANGES = {
    "no_causal_mask": {"causal": False}, "no_attn_scale": {"attn_scale": "none"},
    "integer_positions": {"pos_encoding": "integer"}, "no_positions": {"pos_encoding": "none"},
    "no_residual": {"residual": False}, "no_final_norm": {"final_norm": False},
    "post_norm": {"norm_placement": "post"},
}


def _lab(name: str, *extra: str) -> TrainConfig:
    return to_object(compose_train([f"experiment=ablation/{name}", *extra]), TrainConfig)


def test_every_ablation_file_is_the_baseline_plus_one_change():
    names = sorted(p.stem for p in LAB.glob("*.yaml"))
    assert names == sorted([*CHANGES, "baseline"])
    base = _lab("baseline")
    assert base.run_name == "baseline" and base.model.head_dim == 64  # a head size where 1/√D matters
    for name, change in CHANGES.items():
        cfg = _lab(name)
        assert cfg.run_name == name and name in ROWS  # the report has the design's claim for it
        for section in ("data", "tokenizer", "optim", "trainer", "device", "logging"):
            assert getattr(cfg, section) == getattr(base, section), (name, section)  # same data and budget
        diff = {k: v for k, v in vars(cfg.model).items() if getattr(base.model, k) != v}
        assert diff == change, name


@pytest.mark.slow
def test_make_ablation_runs_every_file_in_one_multirun_then_the_report():
    out = subprocess.run(["make", "-n", "ablation", "ABLATION_DIR=outputs/ablation/x"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    sweep = next(line for line in out.splitlines() if "scripts/train.py -m" in line)
    experiments = sweep.split("experiment=")[1].split()[0].split(",")
    assert experiments == [f"ablation/{name}" for name in ("baseline", *CHANGES)]  # baseline first: job 0
    assert sorted(experiments) == sorted(f"ablation/{p.stem}" for p in LAB.glob("*.yaml"))  # every file
    assert "hydra.sweep.dir=outputs/ablation/x" in out
    assert "scripts/ablation_report.py outputs/ablation/x" in out


@pytest.fixture
def tiny_sweep(tmp_path: Path, corpus_dir: Path) -> Path:
    """A two-run lab (baseline, no_causal_mask) at smoke-test size, laid out as the multirun lays it out."""
    sweep = tmp_path / "sweep"
    for i, name in enumerate(("baseline", "no_causal_mask")):
        cfg = _lab(name, *fast_overrides(tmp_path, corpus_dir))  # debug=fast shrinks model and budget
        train(cfg, sweep / f"{i}_{name}")
    (sweep / "multirun.yaml").write_text("{}\n")
    return sweep


@pytest.mark.slow
def test_report_measures_each_run_and_regenerates_the_docs_block(tiny_sweep, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    readme = docs / "ablation.md"  # laid out as the repository's docs/ablation.md
    readme.write_text(f"# title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    args = [str(tiny_sweep), "--readme", str(readme), "--docs", str(docs)]
    run = run_script("ablation_report", args, capsys)
    assert run.code == 0, run.err
    doc = json.loads((tiny_sweep / "ablation.json").read_text())
    assert [r["name"] for r in doc["runs"]] == ["baseline", "no_causal_mask"]
    for r in doc["runs"]:
        run_dir = Path(r["run_dir"])
        # the trainer's own last val/loss, computed by its evaluation loop on the same fixed batches
        assert r["val_loss"] == pytest.approx(read_scalars(run_dir / "tb")["val/loss"][1][-1], abs=1e-4)
        # bits per byte from the token file itself: byte tokenizer, so every target but <|endoftext|> (256)
        # is one byte of text
        meta = json.loads((run_dir / "checkpoints" / "last" / "meta.json").read_text())
        shards = sorted(Path(meta["data"]["dir"]).glob("val_*.bin"))
        tokens = np.concatenate([np.fromfile(f, dtype=np.uint16) for f in shards])
        T, trainer = meta["model_config"]["block_size"], meta["config"]["trainer"]
        windows = eval_windows(len(tokens), T, trainer["eval_tokens"])
        spans = zip(windows.starts.tolist(), windows.scored.tolist(), strict=True)
        targets = np.concatenate([tokens[start + 1 : start + T + 1][T - n :] for start, n in spans])
        assert len(targets) == r["scored_tokens"]
        n_bytes = int((targets != 256).sum())
        assert r["scored_bytes"] == n_bytes
        expected = r["val_loss"] * r["scored_tokens"] / n_bytes / math.log(2)
        assert r["bits_per_byte"] == pytest.approx(expected, rel=1e-9)
        assert len(r["grad_norms"]) == 2 and all(0 < g < math.inf for g in r["grad_norms"])
        assert all(0 <= h <= math.log(32) for h in r["attn_entropy"])  # at most uniform over 32 keys
        assert r["train_loss"] == pytest.approx(read_scalars(run_dir / "tb")["train/loss"][1][-1])
    block = readme_block(readme.read_text())
    rendered = render_block(json.loads((docs / "ablation.json").read_text()), figure="ablation.png")
    assert block == rendered
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{END}\nafter\n")  # the rest untouched
    assert "| no_causal_mask | `causal=false` |" in block and "**No causal mask.**" in block
    png = (docs / "ablation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert (tiny_sweep / "ablation.md").read_text().startswith("2 runs of 8 steps")


def test_the_docs_block_is_what_the_script_renders_from_the_documented_run():
    page = (ROOT / "docs" / "ablation.md").read_text()
    doc = json.loads((ROOT / "docs" / "ablation.json").read_text())
    assert readme_block(page) == render_block(doc, figure="ablation.png")  # beside docs/ablation.md
    assert [r["name"] for r in doc["runs"]] == ["baseline", *CHANGES]  # every row, baseline first


def test_report_refuses_a_folder_without_runs_or_without_a_baseline(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = run_script("ablation_report", [str(empty)], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "no trained runs" in run.err_lines[0]
    meta = tmp_path / "sweep" / "0_no_causal_mask" / "checkpoints" / "last" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"format_version": 1, "config": {"run_name": "no_causal_mask"}}))
    run = run_script("ablation_report", [str(tmp_path / "sweep")], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "no baseline run first" in run.err_lines[0]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["0_no_causal_mask"]  # nothing written
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    run = run_script("ablation_report", [str(empty), "--readme", str(readme), "--docs", str(tmp_path / "d")],
                     capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "<!-- ablation:begin -->" in run.err_lines[0]
    assert readme.read_text() == "no markers here\n" and not (tmp_path / "d").exists()
