"""LayerNorm and RMSNorm: the defining per-token statistics, computed independently."""

from __future__ import annotations

import torch
from torch import nn

from minigpt.model.norm import build_norm


def _input() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(3, 7, 64) * 5 + 3  # (B, T, C), far from zero mean / unit scale


def test_layernorm_gives_zero_mean_unit_variance_per_token():
    norm = build_norm("layernorm", 64, eps=1e-5, bias=True)
    with torch.no_grad():  # a trained affine must not hide the normalisation: undo it by hand
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.normal_()
        y = (norm(_input()) - norm.bias) / norm.weight
    torch.testing.assert_close(y.mean(-1), torch.zeros(3, 7), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(3, 7), atol=1e-3, rtol=0)


def test_rmsnorm_gives_unit_rms_per_token():
    norm = build_norm("rmsnorm", 64, eps=1e-6, bias=True)
    assert isinstance(norm, nn.RMSNorm) and not any(n.endswith("bias") for n, _ in norm.named_parameters())
    x = _input()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        y = norm(x) / norm.weight
    torch.testing.assert_close(y.pow(2).mean(-1).sqrt(), torch.ones(3, 7), atol=1e-4, rtol=0)
    # no centring: the direction of each token is kept, only its length changes
    cos = nn.functional.cosine_similarity(y, x, dim=-1)
    torch.testing.assert_close(cos, torch.ones(3, 7))


def test_layernorm_without_bias_has_no_bias_parameter():
    norm = build_norm("layernorm", 16, eps=1e-5, bias=False)
    assert norm.bias is None
