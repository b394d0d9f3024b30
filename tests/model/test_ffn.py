"""The FFN formula for every activation and the `seed` preset's √C embedding scale, against explicit math."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import VOCAB, load_preset, shrunk_config

from minigpt.model.factory import build_model
from minigpt.model.ffn import MLP


def _phi(x: torch.Tensor) -> torch.Tensor:
    """The standard normal CDF, written with erf."""
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


# each activation's hidden-layer function, written out from its definition
EXPLICIT = {
    "relu": lambda h: torch.where(h > 0, h, torch.zeros_like(h)),
    "gelu": lambda h: h * _phi(h),
    "gelu_tanh": lambda h: 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3))),
}


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_ffn_is_down_of_activation_of_up(activation):
    cfg = shrunk_config("tiny", activation=activation)
    mlp = MLP(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # wide weights, so the activations' nonlinear regions all matter
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(2, 5, cfg.n_embd, generator=g).double()
    w_up, b_up = mlp.c_fc.weight.double(), mlp.c_fc.bias.double()
    w_down, b_down = mlp.c_proj.weight.double(), mlp.c_proj.bias.double()
    up = x @ w_up.T + b_up  # (B, T, hidden) or (B, T, 2·hidden)
    if activation == "swiglu":
        hidden = 8 * math.ceil(2 / 3 * 4 * cfg.n_embd / 8)  # 2/3 of 4C, rounded up to a multiple of 8
        assert w_up.shape == (2 * hidden, cfg.n_embd)
        gate, lin = up[..., :hidden], up[..., hidden:]  # the fused matrix: gate rows first, then up rows
        h = gate * torch.sigmoid(gate) * lin  # SiLU(x W_gate) ⊙ (x W_up)
    else:
        assert w_up.shape == (4 * cfg.n_embd, cfg.n_embd)  # ffn_mult = 4: C -> 4C
        h = EXPLICIT[activation](up)
    expected = h @ w_down.T + b_down  # (B, T, C)
    torch.testing.assert_close(mlp.double()(x), expected, atol=1e-9, rtol=1e-9)


def test_activations_differ_where_they_should():
    """The four are really four functions: relu is 0 for negatives, gelu is not, gelu_tanh only
    approximates gelu (to ~1e-3), and the formulas above tell them apart."""
    h = torch.linspace(-4, 4, 81, dtype=torch.float64)
    relu, gelu, tanh = (EXPLICIT[a](h) for a in ("relu", "gelu", "gelu_tanh"))
    assert (relu[h < 0] == 0).all() and (gelu[h < 0] < 0).all()
    gap = (gelu - tanh).abs().max().item()
    assert 1e-5 < gap < 1e-2


def test_seed_preset_scales_token_embeddings_by_sqrt_c_before_adding_the_sinusoidal_table():
    cfg = load_preset("seed")  # the real preset: C = 128
    model = build_model(cfg, vocab_size=VOCAB).eval()
    seen = {}
    model.transformer.drop.register_forward_hook(lambda m, i, o: seen.__setitem__("x", i[0]))
    idx = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    model(idx)
    C = cfg.n_embd
    pos = torch.arange(10, dtype=torch.float64).unsqueeze(1)  # PE(pos, 2i) = sin(pos / 10000^(2i/C)), ...
    angles = pos / 10000 ** (torch.arange(0, C, 2, dtype=torch.float64) / C)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)  # interleaved: sin, cos, sin, ...
    expected = model.transformer.wte.weight.double()[idx] * math.sqrt(C) + pe
    torch.testing.assert_close(seen["x"].double(), expected, atol=1e-5, rtol=1e-5)
    # at init the scaled embeddings (std 0.02·√128 ≈ 0.23) are comparable to the table (RMS 1/√2),
    # not ~35x smaller
    ratio = (model.transformer.wte.weight * math.sqrt(C)).std().item() / pe.pow(2).mean().sqrt().item()
    assert 0.2 < ratio < 0.5
    assert build_model(shrunk_config("tiny")).emb_scale == 1.0  # learned positions: no scale
