"""`scripts/train.py` as a user runs it: one real run, a 2-job sweep, and one-line failures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, fast_overrides

pytestmark = pytest.mark.slow


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_run_writes_the_run_folder_and_learns(tmp_path: Path, corpus_dir: Path):
    run = tmp_path / "run"
    proc = _run(*fast_overrides(tmp_path, corpus_dir), "trainer.max_steps=12", "optim.lr=1e-2",
                f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr
    start, end = map(float, re.search(r"val loss ([\d.]+) -> ([\d.]+)", proc.stdout).groups())
    assert end < start
    for path in (".hydra/config.yaml", ".hydra/overrides.yaml", "train.log", "checkpoints/last/meta.json",
                 "checkpoints/last/tokenizer"):
        assert (run / path).exists(), path
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert "val loss" in (run / "train.log").read_text()


def test_cli_multirun_sweep(tmp_path: Path, corpus_dir: Path):
    sweep = tmp_path / "sweep"
    proc = _run("-m", *fast_overrides(tmp_path, corpus_dir), "optim.lr=1e-3,3e-3", "trainer.max_steps=2",
                "logging.sample_tokens=0", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    for job in ("0", "1"):
        assert (sweep / job / "checkpoints" / "last" / "meta.json").is_file(), job
    assert "optim.lr=0.003" in (sweep / "1" / ".hydra" / "overrides.yaml").read_text()


@pytest.mark.parametrize("override, needle", [
    ("trainer.max_stepz=3", "Could not override 'trainer.max_stepz'"),  # unknown key: Hydra's composition
    ("model.n_embd=97", "model.n_embd=97 must be divisible by model.n_head"),  # bad value: validation
])
def test_cli_bad_input_fails_with_one_line(override: str, needle: str, tmp_path: Path):
    proc = _run(override, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # a UserError's code, whoever found it
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    run = tmp_path / "run"  # Hydra may have made the folder; nothing may be written into it
    assert not run.exists() or not any(run.iterdir()), sorted(run.rglob("*"))
