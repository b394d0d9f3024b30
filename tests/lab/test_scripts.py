"""Inspection entry points: the argparse tools in-process, the Hydra shape walk as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from minigpt.inspect.plotting import save_png
from minigpt.lab.pe_plots import plot_positional_encodings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # the argparse scripts expose main(argv)

import loss_curves  # noqa: E402
import pe_plots  # noqa: E402
from test_plots import _write_run  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_pe_plots_and_loss_curves_write_pngs_of_their_input(tmp_path: Path, capsys) -> None:
    # pe_plots: the figure the library draws for these arguments (test_inspect_plots reads what that is)
    pe_plots.main(["--dim", "16", "--positions", "32", "--head-dim", "8", "--out", str(tmp_path / "pe.png")])
    reference = save_png(plot_positional_encodings(dim=16, n_positions=32, head_dim=8), tmp_path / "ref.png")
    assert np.array_equal(imread(tmp_path / "pe.png"), imread(reference))
    # loss_curves: the same labels and title; other logged values give another image, the same ones the same
    for name, lr in (("a", 0.05), ("b", 0.2), ("c", 0.05)):
        _write_run(tmp_path / name / "run", lr, [])
        out = str(tmp_path / f"{name}.png")
        loss_curves.main([str(tmp_path / name / "run"), "--title", "t", "--out", out])
    a, b, c = (imread(tmp_path / f"{name}.png") for name in "abc")
    assert a.shape == b.shape and not np.array_equal(a, b) and np.array_equal(a, c)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        loss_curves.main([str(tmp_path / "missing")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1  # one line, no traceback


@pytest.mark.slow
def test_shape_walk_script_prints_the_walk() -> None:
    ok = _run("scripts/shape_walk.py", "model.n_layer=1", "model.n_head=4", "model.n_embd=24",
              "model.block_size=5", "vocab_size=50")  # B=2, T=5, H=4, D=6: no size is ambiguous
    assert ok.returncode == 0, ok.stderr
    assert "(B, H, T, T)" in ok.stdout and "lm_head [Linear]" in ok.stdout
