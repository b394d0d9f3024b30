"""The temperature tool: entropy against T on a real model's logits, its two limits, and the figure."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.figure
import matplotlib.image
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from minigpt.config import register_configs, to_object
from minigpt.errors import UserError
from minigpt.generation.config import TemperatureConfig
from minigpt.generation.temperature import (
    distributions,
    entropy_curve,
    next_token_logits,
    temperature_figure,
)
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model

VOCAB = 64


def real_logits() -> torch.Tensor:
    """Next-token logits of a small model with sharp random weights (GPT-2's init is near-uniform)."""
    model = build_model(ModelConfig(n_layer=2, n_head=4, n_embd=32, block_size=16), vocab_size=VOCAB).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return next_token_logits(model, [3, 1, 4, 1, 5, 9, 2, 6])


def test_entropy_never_decreases_with_temperature():
    logits = real_logits()
    h = entropy_curve(logits, torch.logspace(-3, 3, 200).tolist())
    assert (h[1:] - h[:-1] >= -1e-9).all()
    assert h[0] < 0.1 * math.log(VOCAB) and h[-1] > 0.99 * math.log(VOCAB)  # it spans both regimes


def test_limits_one_hot_and_uniform():
    logits = real_logits()
    cold, hot = distributions(logits, [1e-3, 1e3])
    one_hot = torch.zeros(VOCAB)
    one_hot[logits.argmax()] = 1.0
    torch.testing.assert_close(cold, one_hot, atol=1e-6, rtol=0)
    h_hot = float(-(hot * hot.log()).sum())  # entropy written out, not the library's function
    assert abs(h_hot - math.log(VOCAB)) < 0.01 * math.log(VOCAB)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _entropy(p: np.ndarray) -> float:
    return float(-(p[p > 0] * np.log(p[p > 0])).sum())


def test_figure_draws_each_distribution_and_the_entropy_curve(tmp_path, monkeypatch):
    """What is drawn, read back from the saved figure's artists, against softmax(logits / T) written out."""
    figures, real_savefig = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), real_savefig(fig, *a, **k))[1])
    logits = real_logits()
    path = temperature_figure(logits, lambda i: f"tok{i}", tmp_path / "t.png", temperatures=(0.5, 2.0), top=8)
    (fig,) = figures
    x = logits.double().numpy()
    top8 = np.argsort(-x)[:8]
    for ax, t in zip(fig.axes[:2], (0.5, 2.0), strict=True):
        p = _softmax(x / t)
        np.testing.assert_allclose([bar.get_width() for bar in ax.patches], p[top8], rtol=1e-5)
        assert f"H = {_entropy(p):.2f} nats" in ax.get_title()
    assert [label.get_text() for label in fig.axes[0].get_yticklabels()] == [f"tok{i}" for i in top8]
    curve = next(line for line in fig.axes[2].get_lines() if line.get_label() == "entropy H(T)")
    ts = np.asarray(curve.get_xdata())
    assert ts.min() == pytest.approx(1e-3) and ts.max() == pytest.approx(1e3)
    np.testing.assert_allclose(curve.get_ydata(), [_entropy(_softmax(x / t)) for t in ts], atol=1e-6)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).shape[:2] == (500, 1100)  # figsize (3 * 2 + 5, 5) at 100 dpi


def _compose(*overrides: str) -> TemperatureConfig:
    """configs/temperature.yaml composed as scripts/temperature.py composes it."""
    register_configs()
    root = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(version_base="1.3", config_dir=str(root)):
        return to_object(compose(config_name="temperature", overrides=list(overrides)), TemperatureConfig)


def test_config_composes_and_rejects_bad_values():
    cfg = _compose("temperatures=[0.1,1,10]", "top=5")
    assert cfg.temperatures == [0.1, 1.0, 10.0] and cfg.top == 5 and cfg.device.type == "cpu"
    with pytest.raises(UserError, match="temperatures"):
        _compose("temperatures=[0,1]")
    for bad in ({"temperatures": []}, {"top": 0}):
        with pytest.raises(UserError):
            TemperatureConfig(**bad)
