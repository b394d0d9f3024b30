"""The temperature tool: entropy against T on a real model's logits, its two limits, and the figure;
and the apple/durian/joke example (50/49/1) of docs/design.md against the explicit formula."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.figure
import matplotlib.image
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from model_helpers import tiny_config

from minigpt.cli import to_object
from minigpt.config import register_configs
from minigpt.errors import UserError
from minigpt.lab.config import TemperatureConfig
from minigpt.lab.temperature import (
    distributions,
    entropy_curve,
    next_token_logits,
    temperature_figure,
)
from minigpt.model.factory import build_model
from minigpt.sampling.next_token import probabilities
from minigpt.sampling.params import SamplingParams

VOCAB = 64


def real_logits() -> torch.Tensor:
    """Next-token logits of a small model with sharp random weights (GPT-2's init is near-uniform)."""
    model = build_model(tiny_config(n_layer=2, n_head=4, n_embd=32, block_size=16), vocab_size=VOCAB).eval()
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
    root = Path(__file__).resolve().parents[2] / "configs"
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


# The example of docs/design.md: after "I love to eat ...", apple 50%, durian 49%, and a joke token 1%.
EXAMPLE_PROBS = (0.50, 0.49, 0.01)
EXAMPLE_TEMPERATURES = (0.25, 0.5, 1.0, 2.0, 5.0)


def example_table(temperatures) -> list[list[float]]:
    """softmax(log p / T) written out: p_i^(1/T) / sum_j p_j^(1/T), in Python floats."""
    rows = []
    for t in temperatures:
        w = [p ** (1.0 / t) for p in EXAMPLE_PROBS]
        rows.append([x / sum(w) for x in w])
    return rows


def test_the_apple_durian_example_follows_the_formula_and_low_t_barely_separates_the_top_two():
    logits = torch.tensor(EXAMPLE_PROBS, dtype=torch.float64).log()
    table = distributions(logits, EXAMPLE_TEMPERATURES)
    expected = torch.tensor(example_table(EXAMPLE_TEMPERATURES), dtype=torch.float64)
    torch.testing.assert_close(table.double(), expected, atol=1e-6, rtol=1e-6)
    apple, durian, joke = table.T
    # The example claims a low temperature makes the model "very likely" say apple. Not here: the two
    # logits differ by ln(50/49) = 0.02, so at T = 0.25 the gap is only 0.08 and durian keeps 48%.
    assert apple[0] < 0.53 and durian[0] > 0.47
    # only T -> 0 makes apple certain: p_apple / p_durian = (50/49)^(1/T) needs T < 0.0044 for 99 : 1
    cold = distributions(logits, [0.01, 0.004])
    assert cold[0, 0] < 0.9 and cold[1, 0] > 0.99
    torch.testing.assert_close(probabilities(logits, SamplingParams(0.0)), torch.tensor([1.0, 0.0, 0.0]))
    # what the example gets right about high T: the 1% token rises (to 18.6% at T = 5, 1/3 as T -> inf)
    assert joke.tolist() == sorted(joke.tolist()) and 0.18 < joke[-1] < 0.19


def test_the_design_doc_quotes_the_temperature_table_the_formula_gives():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    block = readme.split("<!-- temperature-table:begin -->")[1].split("<!-- temperature-table:end -->")[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    expected = example_table(EXAMPLE_TEMPERATURES)
    assert len(rows) == len(EXAMPLE_TEMPERATURES)
    for line, t, probs in zip(rows, EXAMPLE_TEMPERATURES, expected, strict=True):
        cells = [c.strip().rstrip("%") for c in line.strip("|").split("|")]
        assert float(cells[0]) == t
        assert [float(c) for c in cells[1:4]] == [round(100 * p, 1) for p in probs]
