"""The lab's file tools in this process through their real entry points, the shape walk as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_script
from matplotlib.image import imread
from test_plots import _write_run

from minigpt.inspect.plotting import save_png
from minigpt.lab.pe_plots import plot_positional_encodings

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_pe_plots_and_loss_curves_write_pngs_of_their_input(tmp_path: Path, capsys) -> None:
    # pe_plots: the figure the library draws for these arguments (test_plots.py reads what that is)
    args = ["dim=16", "positions=32", "head_dim=8", f"out={tmp_path / 'pe.png'}"]
    run = run_script("pe_plots", args, capsys)
    assert run.code == 0, run.err
    reference = save_png(plot_positional_encodings(dim=16, n_positions=32, head_dim=8), tmp_path / "ref.png")
    assert np.array_equal(imread(tmp_path / "pe.png"), imread(reference))
    # loss_curves: the same labels and title; other logged values give another image, the same ones the same
    for name, lr in (("a", 0.05), ("b", 0.2), ("c", 0.05)):
        _write_run(tmp_path / name / "run", lr, [])
        out = str(tmp_path / f"{name}.png")
        args = [f"runs=[{tmp_path / name / 'run'}]", "title=t", f"out={out}"]
        run = run_script("loss_curves", args, capsys)
        assert run.code == 0, run.err
    a, b, c = (imread(tmp_path / f"{name}.png") for name in "abc")
    assert a.shape == b.shape and not np.array_equal(a, b) and np.array_equal(a, c)
    for bad in (["dim=15"], ["positions=1"]):
        run = run_script("pe_plots", bad, capsys)
        assert run.code == 2 and len(run.err_lines) == 1 and run.err.startswith("error:"), run.err
    run = run_script("loss_curves", [f"runs=[{tmp_path / 'missing'}]"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and run.err.startswith("error:"), run.err


@pytest.mark.slow
def test_shape_walk_script_prints_the_walk() -> None:
    ok = _run("scripts/shape_walk.py", "model.n_layer=1", "model.n_head=4", "model.n_embd=24",
              "model.block_size=5", "vocab_size=50")  # B=2, T=5, H=4, D=6: no size is ambiguous
    assert ok.returncode == 0, ok.stderr
    assert "(B, H, T, T)" in ok.stdout and "lm_head [Linear]" in ok.stdout
