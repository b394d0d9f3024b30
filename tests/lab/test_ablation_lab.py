"""The ablation lab: its configs, the one command that runs it (configs x seeds), and the report it writes."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import run_script
from conftest import CONFIG_DIR, ROOT, compose_train, fast_overrides

from minigpt.cli import to_object
from minigpt.data.eval_windows import eval_windows
from minigpt.lab.ablation_report import BEGIN, END, ROWS, doc_block, render_block
from minigpt.lab.loss_curves import read_scalars
from minigpt.model.factory import build_model
from minigpt.runs.train import train
from minigpt.training.batch_schedule import BatchSchedule
from minigpt.training.budget import Budget
from minigpt.training.config import TrainConfig

LAB = CONFIG_DIR / "experiment" / "ablation"
# what each file may change relative to the baseline: exactly one model field (or, for Muon, the optimizer)
CHANGES = {
    "no_causal_mask": {"causal": False}, "no_attn_scale": {"attn_scale": "none"},
    "integer_positions": {"pos_encoding": "integer"}, "no_positions": {"pos_encoding": "none"},
    "no_residual": {"residual": False}, "no_final_norm": {"final_norm": False},
    "post_norm": {"norm_placement": "post"},
    "batchnorm": {"norm": "batchnorm"}, "one_head": {"n_head": 1}, "dropout": {"dropout": 0.1},
}
# "what breaks" rows the documented lab run predates: docs/ablation.md gives their own sweep's numbers
MEASURED_APART = {"batchnorm", "one_head", "dropout"}
# the "what helps" rows: techniques of record-setting small-GPT runs (docs/tricks.md measures them on the
# default run; the documented lab run predates them)
HELPS = {
    "qk_norm": {"qk_norm": True}, "relu2": {"activation": "relu2"},
    "zero_init_proj": {"zero_init_proj": True},
    "value_embeds": {"value_embeds": True}, "smear": {"smear": True}, "bigram_embed": {"bigram_embed": 16384},
    "logit_softcap": {"logit_softcap": 15.0}, "muon": {},
}
HELPS = {**HELPS, "embed_lr": {}, "batch_warmup": {}, "seq_len_warmup": {}}  # the optimizer, the batches
CHANGES = {**CHANGES, **HELPS}
OPTIM_CHANGES = {"muon": {"name": "muon"}, "embed_lr": {"embed_lr": 3e-2}}
TRAINER_CHANGES = {"batch_warmup": {"batch_warmup_steps": 60, "batch_warmup_start": 4},
                   "seq_len_warmup": {"seq_len_warmup_steps": 90}}  # from 16 tokens, the default start


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
        for section in ("data", "tokenizer", "device", "logging"):
            assert getattr(cfg, section) == getattr(base, section), (name, section)  # same data and budget
        trainer = {k: v for k, v in vars(cfg.trainer).items() if getattr(base.trainer, k) != v}
        assert trainer == TRAINER_CHANGES.get(name, {}), name
        diff = {k: v for k, v in vars(cfg.model).items() if getattr(base.model, k) != v}
        assert diff == change, name
        optim = {k: v for k, v in vars(cfg.optim).items() if getattr(base.optim, k) != v}
        assert optim == OPTIM_CHANGES.get(name, {}), name


def test_every_file_trains_the_same_flops_and_ends_at_step_300():
    """The budget is in model FLOPs, so a file that changed the model's cost per token would train another
    number of tokens; these all cost (nearly) the same, and all end at step 300, except the batch-size
    warmup, whose first steps are smaller, so the same FLOPs take more of them."""
    for name in ("baseline", *CHANGES):
        cfg = _lab(name)
        tc = cfg.trainer
        assert tc.max_steps is None and tc.max_flops is not None
        with torch.device("meta"):
            model = build_model(cfg.model, vocab_size=cfg.tokenizer.bpe_vocab_size)
        batches = BatchSchedule(tc, cfg.model.block_size, 1, 1)
        budget = Budget(max_flops=tc.max_flops, tokens_per_step=batches.tokens(10**6),
                        flops_per_token=model.flops_per_token(), warmup_tokens=batches.warmup_tokens())
        assert budget.last_step(0, 0) == (325 if name == "batch_warmup" else 300), name


@pytest.mark.slow
def test_make_ablation_runs_every_file_x_seeds_in_one_multirun_then_the_report():
    out = subprocess.run(["make", "-n", "ablation", "ABLATION_DIR=outputs/ablation/x", "SEEDS=3"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    sweep = next(line for line in out.splitlines() if "scripts/train.py -m" in line)
    experiments = sweep.split("experiment=")[1].split()[0].split(",")
    assert experiments == [f"ablation/{name}" for name in ("baseline", *CHANGES)]  # baseline first: job 0
    assert sorted(experiments) == sorted(f"ablation/{p.stem}" for p in LAB.glob("*.yaml"))  # every file
    assert " trainer.seed=1337,1338,1339 " in sweep  # after the experiments: each file's seeds in a row
    assert "hydra.sweep.dir=outputs/ablation/x" in out
    assert "scripts/ablation_report.py sweep=outputs/ablation/x" in out


SEEDS = (1, 2)


@pytest.fixture
def tiny_sweep(tmp_path: Path, corpus_dir: Path) -> Path:
    """A two-file lab (baseline, no_causal_mask) x two seeds at smoke-test size, laid out as the multirun
    lays it out (with the overrides Hydra records)."""
    sweep = tmp_path / "sweep"
    jobs = [(name, seed) for name in ("baseline", "no_causal_mask") for seed in SEEDS]
    for i, (name, seed) in enumerate(jobs):
        fast = fast_overrides(tmp_path, corpus_dir)
        overrides = [f"experiment=ablation/{name}", f"trainer.seed={seed}", *fast]
        cfg = _lab(name, *overrides[1:])  # debug=fast shrinks model and budget
        record = {".hydra/overrides.yaml": "".join(f"- {o}\n" for o in overrides)}
        train(cfg, sweep / f"{i}_{name}_seed{seed}", record_files=record)
    swept = ["experiment=ablation/baseline,ablation/no_causal_mask", f"trainer.seed={SEEDS[0]},{SEEDS[1]}"]
    (sweep / "multirun.yaml").write_text(  # Hydra's record of the sweep: the jobs it launched
        "hydra:\n  overrides:\n    task:\n" + "".join(f"    - {o}\n" for o in swept))
    return sweep


@pytest.mark.slow
def test_report_measures_each_run_puts_the_seeds_together_and_regenerates_the_doc(tiny_sweep, tmp_path,
                                                                                  capsys):
    doc_path = tmp_path / "docs" / "ablation.md"
    doc_path.parent.mkdir()
    doc_path.write_text(f"# title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    run = run_script("ablation_report", [f"sweep={tiny_sweep}", "docs=true", f"doc={doc_path}"], capsys)
    assert run.code == 0, run.err
    doc = json.loads((tiny_sweep / "ablation.json").read_text())
    assert [(r["name"], r["run"]["seed"]) for r in doc["runs"]] == [
        (name, seed) for name in ("baseline", "no_causal_mask") for seed in SEEDS]
    for r in doc["runs"]:
        run_dir = Path(r["run_dir"])
        record = r["run"]  # what every row keeps
        assert record["config"].startswith(f"experiment=ablation/{r['name']} debug=fast")  # without the seed
        assert record["machine"]["dtype"] == "float32" and record["machine"]["cores"] >= 1
        assert record["tokens"] == record["steps"] * 4 * 32 and record["flops"] > 0
        # the trainer's own last val/loss, computed by its evaluation loop on the same fixed batches
        assert record["val_loss"] == pytest.approx(read_scalars(run_dir / "tb")["val/loss"][1][-1], abs=1e-4)
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
        expected = record["val_loss"] * r["scored_tokens"] / n_bytes / math.log(2)
        assert record["bits_per_byte"] == pytest.approx(expected, rel=1e-9)
        assert len(r["grad_norms"]) == 2 and all(0 < g < math.inf for g in r["grad_norms"])
        assert all(0 <= h <= math.log(32) for h in r["attn_entropy"])  # at most uniform over 32 keys
        assert r["train_loss"] == pytest.approx(read_scalars(run_dir / "tb")["train/loss"][1][-1])
    block = doc_block(doc_path.read_text())
    documented = json.loads((doc_path.parent / "ablation.json").read_text())
    assert block == render_block(documented, figure="ablation.png")
    text = doc_path.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{END}\nafter\n")  # the rest untouched
    assert "| no_causal_mask | `causal=false` | 2 |" in block and "**No causal mask.**" in block
    png = (doc_path.parent / "ablation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert (tiny_sweep / "ablation.md").read_text().startswith("2 configs x 2 seeds (1, 2): 4 runs")
    # the row's numbers are the seeds' own, put together here: mean, and the paired difference by seed
    losses = {(r["name"], r["run"]["seed"]): r["run"]["val_loss"] for r in doc["runs"]}
    diffs = [losses["no_causal_mask", s] - losses["baseline", s] for s in SEEDS]
    mean = (losses["no_causal_mask", 1] + losses["no_causal_mask", 2]) / 2
    row = next(line for line in block.splitlines() if line.startswith("| no_causal_mask"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[4].startswith(f"{mean:.3f} ± ") and cells[5].startswith(f"{sum(diffs) / 2:+.3f} ± ")
    # gradient norms: the geometric mean over the seeds, layer by layer
    norms = [r["grad_norms"] for r in doc["runs"] if r["name"] == "no_causal_mask"]
    geometric = [math.sqrt(a * b) for a, b in zip(*norms, strict=True)]
    assert cells[9] == " / ".join(f"{g:.3g}" for g in geometric)


def test_the_doc_block_is_what_the_script_renders_from_the_documented_run():
    text = (ROOT / "docs" / "ablation.md").read_text()
    doc = json.loads((ROOT / "docs" / "ablation.json").read_text())
    assert doc_block(text) == render_block(doc, figure="ablation.png")
    names = list(dict.fromkeys(r["name"] for r in doc["runs"]))
    assert names == ["baseline", *CHANGES][: len(names)]  # baseline first, in the Makefile's order
    assert set(CHANGES) - set(HELPS) - MEASURED_APART <= set(names)  # at least every "what breaks" row
    for name in names:  # the documented run: at least three seeds of every file, at equal FLOPs
        runs = [r["run"] for r in doc["runs"] if r["name"] == name]
        assert len({r["seed"] for r in runs}) >= 3 and {r["budget"] for r in runs} == {runs[0]["budget"]}
        assert runs[0]["budget"].startswith("trainer.max_flops=")


def test_report_refuses_a_folder_without_runs_or_without_a_baseline(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = run_script("ablation_report", [f"sweep={empty}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "no finished runs" in run.err_lines[0]
    meta = tmp_path / "sweep" / "0_no_causal_mask" / "checkpoints" / "last" / "meta.json"
    meta.parent.mkdir(parents=True)
    (tmp_path / "sweep" / "0_no_causal_mask" / ".hydra").mkdir()  # a finished job: its whole 1-step budget
    meta.write_text(json.dumps({"format_version": 1, "step": 1, "tokens_seen": 8, "config": {
        "run_name": "no_causal_mask", "trainer": {"max_steps": 1}}}))
    run = run_script("ablation_report", [f"sweep={tmp_path / 'sweep'}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "no baseline run first" in run.err_lines[0]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["0_no_causal_mask"]  # nothing written
    doc = tmp_path / "d" / "ablation.md"
    doc.parent.mkdir()
    doc.write_text("no markers here\n")
    run = run_script("ablation_report", [f"sweep={empty}", "docs=true", f"doc={doc}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "<!-- ablation:begin -->" in run.err_lines[0]
    assert doc.read_text() == "no markers here\n" and sorted(doc.parent.iterdir()) == [doc]
    run = run_script("ablation_report", [f"sweep={empty}", "docs=true", f"doc={tmp_path / 'nowhere.md'}"],
                     capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "does not exist" in run.err_lines[0]
