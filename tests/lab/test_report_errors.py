"""The lab's reports never draw a conclusion their data cannot carry, and fail in one line, through the real
command lines: a doc rendered from a missing or empty results file is refused and left as it was; a sweep's
failed and never-started jobs are named in the report and its JSON; one seed is "1 seed: no test", never
"noise"; a ladder of mixed budgets is refused with each run's real tokens per parameter; a damaged
overrides.yaml, multirun.yaml or meta.json is one line naming the file."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_script, snapshot
from conftest import fast_overrides, write_corpus

from minigpt.lab import scaling, speedrun
from minigpt.lab.runs import RunRecord


def one_line_refusal(run, *words: str) -> None:
    assert run.code == 2, run.err
    assert len(run.err_lines) == 1 and run.err_lines[0].startswith("error: "), run.err
    assert "Traceback" not in run.err
    for word in words:
        assert word in run.err_lines[0], (word, run.err_lines[0])


def _row(config: str, seed: int, bpb: float, budget: str = "trainer.max_flops=1e+12", params: int = 1000,
         tokens: int = 1000) -> RunRecord:
    return RunRecord(config=config, seed=seed, budget=budget, machine={"cpu": "cpu A", "cores": 2,
                     "dtype": "float32", "torch": "2.13"}, steps=10, params=params, tokens=tokens, flops=1e12,
                     train_seconds=1.0, tokens_per_s=1000.0, val_loss=2 * bpb, bits_per_byte=bpb,
                     command="", date="2026-01-01")


def _doc(tmp_path: Path) -> Path:
    doc = tmp_path / "speedrun.md"
    doc.write_text(f"# t\n\n{speedrun.BEGIN}\n| `default` (baseline) | ... |\n{speedrun.END}\n")
    return doc


def test_rendering_the_speedrun_from_a_mistyped_or_empty_results_file_is_refused(tmp_path: Path, capsys):
    doc = _doc(tmp_path)
    before = snapshot(tmp_path)
    mistyped = tmp_path / "speedrn.json"
    run = run_script("speedrun", ["render=true", f"results={mistyped}", f"doc={doc}"], capsys)
    one_line_refusal(run, "speedrn.json does not exist", "left as it is")
    (tmp_path / "empty.json").write_text('{"baseline": null, "rows": []}')
    before = snapshot(tmp_path)
    run = run_script("speedrun", ["render=true", f"results={tmp_path / 'empty.json'}", f"doc={doc}"], capsys)
    one_line_refusal(run, "empty.json holds no rows")
    assert snapshot(tmp_path) == before


def test_one_seed_is_no_test_and_never_noise(tmp_path: Path, capsys):
    results = tmp_path / "r.json"
    results.write_text(json.dumps(speedrun.new_results([_row("default", 1, 2.0), _row("a=1", 1, 2.38)])))
    doc = _doc(tmp_path)
    run = run_script("speedrun", ["render=true", f"results={results}", f"doc={doc}"], capsys)
    assert run.code == 0, run.err
    line = next(line for line in doc.read_text().splitlines() if line.startswith("| `a=1`"))
    assert "+0.380 (1 seed: no test) | - |" in line and "noise" not in line


def _ladder_state(out: Path, budgets: list[str]) -> None:
    runs = []
    for i, (size, budget) in enumerate(zip(("w016", "w032", "w048"), budgets, strict=True)):
        for seed in (1337, 1338):
            row = _row(f"experiment=scaling/{size}", seed, 2.0 - 0.1 * i, budget=budget,
                       params=1000 * (i + 1), tokens=3000)
            runs.append({"size": size, "held_out": False, **dataclasses.asdict(row)})
    out.mkdir()
    (out / scaling.STATE).write_text(json.dumps({"runs": runs, "failed": [], "prediction": None}))


def test_a_ladder_of_mixed_budgets_is_refused_with_the_real_ratios(tmp_path: Path, capsys):
    out = tmp_path / "ladder"
    _ladder_state(out, ["trainer.max_flops=6e+11", "trainer.max_steps=100 trainer.max_flops=6e+11",
                        "trainer.max_flops=6e+11"])
    profiles = "profiles=[{flops:6e11,sizes:[w016,w032,w048]},{flops:1.5e12,sizes:[w016,w032]}," \
               "{flops:4e12,sizes:[w032,w048]}]"
    before = snapshot(tmp_path)
    held_out = "held_out={flops:1.2e13,sizes:[w048]}"
    run = run_script("scaling", [profiles, held_out, f"out={out}", "train=false"], capsys)
    one_line_refusal(run, "w032 seed 1337: trainer.max_steps=100 trainer.max_flops=6e+11, 1.5 tokens per "
                     "parameter", "w032 seed 1338")
    assert snapshot(tmp_path) == before


def test_a_damaged_ladder_file_is_one_line(tmp_path: Path, capsys):
    out = tmp_path / "ladder"
    out.mkdir()
    (out / scaling.STATE).write_text('{"runs": [{"size": "w016"}]')
    run = run_script("scaling", [f"out={out}", "train=false"], capsys)
    one_line_refusal(run, "ladder.json is not a ladder's results file")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab sweep as `make ablation` leaves one when jobs fail: jobs 0 (the baseline) and 1 (another config)
    trained with one seed; job 2 started and failed before its first checkpoint (a folder with .hydra/ only);
    job 3 never started (multirun.yaml says there were 4)."""
    tmp = tmp_path_factory.mktemp("sweep")
    fast = [*fast_overrides(tmp, write_corpus(tmp / "corpus")), "trainer.max_steps=4",
            "logging.sample_tokens=0"]
    folder = tmp / "sweep"
    subdir = "hydra.sweep.subdir=${hydra.job.num}_${run_name}"
    run = run_script("train", ["-m", *fast, "run_name=baseline,other", "trainer.seed=1337",
                               f"hydra.sweep.dir={folder}", subdir], None)
    assert run.code == 0
    shutil.copytree(folder / "1_other" / ".hydra", folder / "2_third" / ".hydra")
    multirun = folder / "multirun.yaml"
    multirun.write_text(multirun.read_text().replace("run_name=baseline,other", "run_name=baseline,other,a,"
                                                                                 "b"))
    return folder


@pytest.mark.slow
def test_failed_and_missing_jobs_are_named_and_one_seed_is_no_test(sweep: Path, tmp_path: Path, capsys):
    folder = shutil.copytree(sweep, tmp_path / "sweep")
    run = run_script("speedrun", [f"sweep={folder}"], capsys)
    assert run.code == 0, run.err
    failed = json.loads((folder / "speedrun.json").read_text())["failed"]
    assert [f["job"] for f in failed] == ["2_third", "job 3"]
    assert "no checkpoint" in failed[0]["reason"] and "never started" in failed[1]["reason"]
    assert "Not in the table: 2 job(s) of the sweep did not finish" in run.out and "`2_third`" in run.out
    assert "(1 seed: no test)" in run.out and "(noise)" not in run.out
    run = run_script("ablation_report", [f"sweep={folder}"], capsys)
    assert run.code == 0, run.err
    report = json.loads((folder / "ablation.json").read_text())
    assert [f["job"] for f in report["failed"]] == ["2_third", "job 3"]
    md = (folder / "ablation.md").read_text()
    assert "`job 3`: never started" in md and "1 seed: no test" in md and "(noise)" not in md


@pytest.mark.slow
@pytest.mark.parametrize("damaged", ["1_other/.hydra/overrides.yaml", "multirun.yaml",
                                     "1_other/checkpoints/last/meta.json"])
def test_a_damaged_file_in_a_sweep_is_one_line_naming_it(sweep: Path, tmp_path: Path, capsys, damaged: str):
    folder = shutil.copytree(sweep, tmp_path / "sweep")
    (folder / damaged).write_text("- [unclosed\n  : {")
    before = snapshot(tmp_path)
    run = run_script("speedrun", [f"sweep={folder}"], capsys)
    one_line_refusal(run, str(folder / damaged.replace("/meta.json", "")))
    assert snapshot(tmp_path) == before


def test_a_damaged_comparison_file_is_one_line_and_kept(tmp_path: Path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.json").write_text('{"runs": [')
    before = snapshot(tmp_path)
    run = run_script("compare", ["candidate=['experiment=speedrun/six_layers']", f"out={out}"], capsys)
    one_line_refusal(run, "compare.json is not a comparison's results file")
    assert snapshot(tmp_path) == before
