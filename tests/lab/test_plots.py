"""Positional-encoding plots, loss curves and attention maps: checked for content, not just existence."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread
from model_helpers import tiny_config
from torch.utils.tensorboard import SummaryWriter

from minigpt.errors import UserError
from minigpt.inspect.attention_maps import attention_figure, attention_probs, log_attention_images
from minigpt.inspect.plotting import DPI, save_png
from minigpt.lab.loss_curves import load_runs, plot_loss_curves, read_scalars
from minigpt.lab.pe_plots import plot_positional_encodings, rope_similarity, sinusoidal_similarity
from minigpt.model.factory import build_model


def _check_png(path: Path, width_in: float, height_in: float) -> None:
    """The PNG has the figure's pixel size and is drawn on (what is drawn: the callers read the artists)."""
    img = imread(path)  # (H, W, 4) floats
    assert img.shape[:2] == (round(height_in * DPI), round(width_in * DPI))
    assert img[..., :3].std() > 0.05
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50


def test_sinusoidal_similarity_depends_only_on_the_offset() -> None:
    dim, offsets = 16, torch.arange(21, dtype=torch.float64)
    sim = sinusoidal_similarity(dim, [0, 7, 300], max_offset=20)
    # independent closed form: sum_i sin(a)sin(b) + cos(a)cos(b) = sum_i cos(k * w_i), w_i = 10000^(-2i/C)
    w = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = torch.cos(offsets[:, None] * w[None, :]).sum(1)
    for row in sim:
        torch.testing.assert_close(row, expected)


def test_rope_similarity_is_the_same_from_every_position() -> None:
    sim = rope_similarity(8, [0, 5, 123], max_offset=30)
    torch.testing.assert_close(sim[1], sim[0])
    torch.testing.assert_close(sim[2], sim[0])
    assert sim[0, 0].item() == pytest.approx(1.0)  # a unit vector against itself
    assert sim[0].std() > 0.05  # and the similarity really changes with the offset


def test_pe_figure_draws_the_table_and_both_similarity_curves(tmp_path: Path) -> None:
    """What is drawn, read back from the figure's artists, against the closed forms written out here."""
    dim, n_positions, head_dim = 32, 64, 8
    fig = plot_positional_encodings(dim=dim, n_positions=n_positions, head_dim=head_dim)
    ax_tab, ax_sin, ax_rope = fig.axes[:3]  # (then the colorbar's)
    pos, two_i = np.arange(n_positions)[:, None], np.arange(0, dim, 2)[None, :]
    table = np.empty((n_positions, dim))
    angle = pos / 10000 ** (two_i / dim)  # (P, C/2)
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    np.testing.assert_allclose(ax_tab.images[0].get_array(), table, atol=1e-6)
    k = np.arange(n_positions // 2 + 1)[:, None]
    # sum over the sin/cos pairs of cos(k w_i); RoPE on x = 1/sqrt(D) everywhere: (2/D) sum cos(k theta_i)
    sin_curve = np.cos(k * 10000.0 ** (-np.arange(0, dim, 2) / dim)).sum(1)
    rope_curve = 2 / head_dim * np.cos(k * 10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)).sum(1)
    for ax, curve in ((ax_sin, sin_curve), (ax_rope, rope_curve)):
        lines = ax.get_lines()
        assert len(lines) == 3  # one per starting position, all on the same curve
        for line in lines:
            np.testing.assert_allclose(line.get_xdata(), k[:, 0])
            np.testing.assert_allclose(line.get_ydata(), curve, atol=1e-6)  # RoPE angles are float32
    _check_png(save_png(fig, tmp_path / "pe.png"), 13, 4.2)


def _write_run(run: Path, lr: float, overrides: list[str]) -> dict[str, list[tuple[int, float]]]:
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    logged: dict[str, list[tuple[int, float]]] = {"train/loss": [], "val/loss": [], "optim/lr": []}
    with SummaryWriter(run / "tb") as w:
        for step in range(0, 41, 10):
            values = {"train/loss": 4 * math.exp(-step * lr) + 0.5, "optim/lr": lr * min(1.0, step / 20)}
            if step % 20 == 0:
                values["val/loss"] = values["train/loss"] + 0.25
            for tag, v in values.items():
                w.add_scalar(tag, v, step)
                logged[tag].append((step, v))
    return logged


def test_loss_curve_reader_returns_the_logged_values(tmp_path: Path) -> None:
    logged = _write_run(tmp_path / "run", 0.05, ["optim.lr=0.05"])
    scalars = read_scalars(tmp_path / "run" / "tb")
    for tag, points in logged.items():
        steps, values = scalars[tag]
        assert steps == [s for s, _ in points]
        np.testing.assert_allclose(values, [v for _, v in points], rtol=1e-6)  # stored as float32


def test_sweep_runs_are_labelled_by_their_own_overrides(tmp_path: Path) -> None:
    logged = {lr: _write_run(tmp_path / "sweep" / str(job), lr, [f"optim.lr={lr}", "trainer.max_steps=40"])
              for job, lr in enumerate((0.05, 0.1))}
    runs, shared = load_runs([tmp_path / "sweep"])
    assert [r.label for r in runs] == ["optim.lr=0.05", "optim.lr=0.1"]
    assert shared == ["trainer.max_steps=40"]
    fig = plot_loss_curves(runs)
    ax_loss, ax_lr = fig.axes
    drawn = {line.get_label(): line for line in ax_loss.get_lines()}
    for job, (lr, points) in enumerate(logged.items()):  # what was drawn is what each run logged
        for tag, name in (("train/loss", f"optim.lr={lr} train"), ("val/loss", f"optim.lr={lr} val")):
            np.testing.assert_allclose(drawn[name].get_xdata(), [step for step, _ in points[tag]])
            np.testing.assert_allclose(drawn[name].get_ydata(), [v for _, v in points[tag]], rtol=1e-6)
        np.testing.assert_allclose(ax_lr.get_lines()[job].get_ydata(), [v for _, v in points["optim/lr"]],
                                   rtol=1e-6)
    assert drawn["optim.lr=0.1 val"].get_linestyle() == "--"
    assert drawn["optim.lr=0.1 train"].get_linestyle() == "-"
    _check_png(save_png(fig, tmp_path / "curves.png"), 10, 6)
    with pytest.raises(UserError, match="no TensorBoard event files"):
        load_runs([tmp_path / "sweep" / "0" / ".hydra"])


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    cfg = tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=30, attention="sdpa")
    return build_model(cfg)


def test_attention_probabilities_are_causal_rows(tiny_model) -> None:
    probs = attention_probs(tiny_model, list(range(10)))
    assert len(probs) == 2 and probs[0].shape == (2, 10, 10)
    for p in probs:
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 10))
        assert torch.all(p.triu(diagonal=1) == 0)
    assert tiny_model.training  # the model's mode is restored


def test_attention_figure_and_tensorboard_image(tmp_path: Path, tiny_model) -> None:
    fig = attention_figure(tiny_model, list(range(12)), layers=[0, 1], heads=[1])
    _check_png(save_png(fig, tmp_path / "attn.png"), 2.4 + 0.6, 2 * 2.4 + 0.6)
    with SummaryWriter(tmp_path / "tb") as w:
        log_attention_images(w, tiny_model, torch.arange(8).view(1, 8), step=7)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    acc.Reload()
    (image,) = acc.Images("attention")
    assert image.step == 7 and image.width > 300 and image.height > 300
