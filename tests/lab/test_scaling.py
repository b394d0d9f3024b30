"""The scaling ladder: the power-law fit and its prediction interval against formulas written out here
(numpy's least squares, Student's t with 2 degrees of freedom in closed form), the report, its TensorBoard
logs, the checked-in doc, and a real ladder of tiny models through the real commands."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_script
from conftest import CONFIG_DIR, ROOT, compose_train, fast_overrides
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minigpt.cli import to_object
from minigpt.errors import UserError
from minigpt.lab import scaling
from minigpt.lab.runs import RunRecord
from minigpt.model.factory import build_model
from minigpt.training.config import TrainConfig

T_975_DF2 = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)  # t(0.975, 2) in closed form: 4.3027


def test_an_exact_power_law_is_recovered():
    flops = [1e11, 3e11, 1e12, 3e12]
    law = scaling.fit_power_law(flops, [5.0 * c ** -0.05 for c in flops])
    assert law.a == pytest.approx(5.0) and law.alpha == pytest.approx(0.05)
    assert law.r2 == pytest.approx(1.0) and law.s == pytest.approx(0.0, abs=1e-12)
    assert law(1e13) == pytest.approx(5.0 * 1e13 ** -0.05)


def test_the_fit_and_its_prediction_interval_are_least_squares_in_log_log():
    flops = np.array([2e11, 7e11, 2.5e12, 9e12])
    bpb = np.array([2.31, 2.02, 1.83, 1.60])
    law = scaling.fit_power_law(list(flops), list(bpb))
    x, y = np.log(flops), np.log(bpb)
    slope, intercept = np.polyfit(x, y, 1)
    assert law.alpha == pytest.approx(-slope) and law.a == pytest.approx(math.exp(intercept))
    residuals = y - (intercept + slope * x)
    s = math.sqrt((residuals ** 2).sum() / 2)  # n - 2 = 2 degrees of freedom
    x_new = math.log(3e13)
    half = T_975_DF2 * s * math.sqrt(1 + 1 / 4 + (x_new - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum())
    centre = intercept + slope * x_new
    low, high = law.interval(3e13)
    assert low == pytest.approx(math.exp(centre - half)) and high == pytest.approx(math.exp(centre + half))
    assert law.r2 == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)


def _record(width: int, seed: int, flops: float, bpb: float) -> RunRecord:
    return RunRecord(config=f"experiment=scaling/w{width:03d}", seed=seed,
                     budget="trainer.max_tokens_per_param=1",
                     machine={"cpu": "cpu A", "cores": 2, "dtype": "bfloat16", "torch": "2.13"}, steps=10,
                     params=width * 1000, tokens=width * 1000, flops=flops, train_seconds=1.0,
                     tokens_per_s=1.0, val_loss=2 * bpb, bits_per_byte=bpb, command="", date="2026-01-01")


def _ladder(held_bpb: float) -> tuple[list[RunRecord], list[str]]:
    """Four sizes on bpb = 10 C^-0.05 (the first one with two seeds around it), and a fifth held out."""
    rows, names = [], []
    for width, flops in ((32, 1e11), (64, 4e11), (96, 1.6e12), (128, 6.4e12)):
        wobble = (0.01, -0.01) if width == 32 else (0.0,)
        for seed, w in enumerate(wobble):
            rows.append(_record(width, seed, flops, 10 * flops ** -0.05 + w))
            names.append(f"w{width:03d}")
    rows.append(_record(160, 0, 2.56e13, held_bpb))
    names.append("w160")
    return rows, names


def test_the_report_fits_the_smaller_sizes_and_checks_the_largest():
    on_the_line = 10 * 2.56e13 ** -0.05
    rows, names = _ladder(held_bpb=on_the_line)
    report = scaling.ladder_report(rows, names, "sweep")
    assert [p["name"] for p in report["points"]] == ["w032", "w064", "w096", "w128", "w160"]
    first = report["points"][0]
    assert first["seeds"] == 2 and first["bpb"] == pytest.approx(10 * 1e11 ** -0.05)  # the seeds' mean
    assert report["fit"]["n"] == 4 and report["fit"]["alpha"] == pytest.approx(0.05)
    check = report["check"]
    assert check["name"] == "w160" and check["predicted"] == pytest.approx(on_the_line) and check["inside"]
    assert not scaling.ladder_report(*_ladder(held_bpb=on_the_line * 1.5), "sweep")["check"]["inside"]
    block = scaling.render_block(report, "scaling.png")
    assert block.startswith(scaling.BEGIN) and block.endswith(scaling.END)
    assert "| w160 | 160,000 | 1 | 160,000 | 2.56e+13 |" in block and "inside the interval" in block
    with pytest.raises(UserError, match="at least 3 sizes"):
        scaling.ladder_report(rows[-3:], names[-3:], "sweep")


def test_tensorboard_gets_the_points_the_fit_and_the_figure(tmp_path: Path):
    report = scaling.ladder_report(*_ladder(held_bpb=2.0), "sweep")
    scaling.write_tensorboard(report, scaling.scaling_figure(report), tmp_path / "tb")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    measured = [(e.step, e.value) for e in events.Scalars(scaling.TAGS["measured"])]
    assert [s for s, _ in measured] == [round(p["flops"]) for p in report["points"]]
    assert [v for _, v in measured] == pytest.approx([p["bpb"] for p in report["points"]], rel=1e-6)
    fit = [e.value for e in events.Scalars(scaling.TAGS["fit"])]
    assert fit == pytest.approx([10 * p["flops"] ** -0.05 for p in report["points"]], rel=1e-4)
    assert events.Tags()["images"] == [scaling.TAGS["figure"]]


def test_the_doc_block_is_what_the_script_renders_from_the_documented_ladder():
    report = json.loads((ROOT / "docs" / "scaling.json").read_text())
    text = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    block = text[text.index(scaling.BEGIN): text.index(scaling.END) + len(scaling.END)]
    assert block == scaling.render_block(report, "scaling.png"), "docs/scaling.md is stale"
    assert len(report["points"]) >= 5 and report["fit"]["n"] == len(report["points"]) - 1


def test_every_size_of_the_ladder_is_the_default_block_at_one_ratio():
    sizes = sorted(p.stem for p in (CONFIG_DIR / "experiment" / "scaling").glob("w*.yaml"))
    default = to_object(compose_train(), TrainConfig).model
    for name in sizes:
        cfg = to_object(compose_train([f"experiment=scaling/{name}"]), TrainConfig)
        assert cfg.run_name == name and cfg.trainer.max_steps is None
        assert cfg.trainer.max_tokens_per_param == 1.0
        assert cfg.model.n_embd == int(name[1:]) and cfg.model.head_dim == 16
        changed = {k for k, v in vars(cfg.model).items() if getattr(default, k) != v}
        assert changed <= {"n_embd", "n_head"}, name  # the default block otherwise


def test_the_fit_refuses_a_missing_doc_or_sweep_in_one_line(tmp_path: Path, capsys):
    doc = tmp_path / "scaling.md"
    doc.write_text("no markers\n")
    run = run_script("scaling", [f"sweep={tmp_path}", "docs=true", f"doc={doc}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "scaling:begin" in run.err_lines[0]
    run = run_script("scaling", [f"sweep={tmp_path}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "no trained runs" in run.err_lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scaling.md"]  # nothing written


@pytest.mark.slow
def test_make_scaling_trains_every_size_once_then_fits():
    out = subprocess.run(["make", "-n", "scaling", "SCALING_DIR=outputs/scaling/x"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    sweep = next(line for line in out.splitlines() if "scripts/train.py -m" in line)
    sizes = sorted(p.stem for p in (CONFIG_DIR / "experiment" / "scaling").glob("w*.yaml"))
    assert sweep.split("experiment=")[1].split()[0].split(",") == [f"scaling/{s}" for s in sizes]
    assert " trainer.seed=1337 " in sweep and "scripts/scaling.py sweep=outputs/scaling/x" in out


@pytest.mark.slow
def test_a_real_ladder_is_fitted_checked_and_logged(tmp_path: Path, corpus_dir: Path, capsys):
    """Four widths of the debug model at one ratio, through train.py -m and scripts/scaling.py."""
    fast = [*fast_overrides(tmp_path, corpus_dir), "model.n_head=1", "trainer.max_steps=null",
            "trainer.max_tokens_per_param=0.02", "trainer.eval_every=1000", "logging.sample_tokens=0"]
    sweep = tmp_path / "sweep"
    train = run_script("train", ["-m", *fast, "model.n_embd=16,24,32,48", f"hydra.sweep.dir={sweep}"],
                       capsys)
    assert train.code == 0, train.err
    doc = tmp_path / "scaling.md"
    doc.write_text(f"before\n{scaling.BEGIN}\n{scaling.END}\nafter\n")
    run = run_script("scaling", [f"sweep={sweep}", "docs=true", f"doc={doc}"], capsys)
    assert run.code == 0, run.err
    report = json.loads((tmp_path / "scaling.json").read_text())
    params = []
    for width in (16, 24, 32, 48):
        cfg = to_object(compose_train([*fast, f"model.n_embd={width}"]), TrainConfig)
        params.append(build_model(cfg.model, vocab_size=257).num_params())
    assert [p["params"] for p in report["points"]] == params  # smallest first
    for p in report["points"]:  # the first step at or past 0.02 tokens per parameter
        assert p["tokens"] == math.ceil(0.02 * p["params"] / 128) * 128
    fitted = report["points"][:-1]
    slope, intercept = np.polyfit(np.log([p["flops"] for p in fitted]), np.log([p["bpb"] for p in fitted]),
                                  1)
    held = report["points"][-1]
    predicted = math.exp(intercept + slope * math.log(held["flops"]))
    assert report["check"]["predicted"] == pytest.approx(predicted)
    assert report["check"]["measured"] == held["bpb"]
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((sweep / "tb").glob("events.out.tfevents.*"))
    assert doc.read_text() == f"before\n{scaling.render_block(report, 'scaling.png')}\nafter\n"
