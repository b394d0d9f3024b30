"""Positional encodings: sinusoidal, learned and rotary, checked against their defining formulas."""

from __future__ import annotations

import math

import pytest
import torch

from minigpt.model.embedding import LearnedPositionalEncoding, SinusoidalPositionalEncoding, sinusoidal_table
from minigpt.model.rope import RotaryEmbedding, apply_rope


def test_sinusoidal_matches_the_formula_elementwise():
    P, C = 50, 16
    table = sinusoidal_table(P, C)
    for pos in range(P):
        for i in range(C // 2):
            angle = pos / 10000 ** (2 * i / C)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_stays_in_unit_range():
    table = sinusoidal_table(4096, 64)
    assert table.abs().max() <= 1.0


def test_sinusoidal_shift_is_one_linear_map_for_every_position():
    """PE(pos + k) = M_k PE(pos), M_k block-diagonal 2x2 rotations by k·w_i, independent of pos."""
    P, C, k = 200, 32, 7
    table = sinusoidal_table(P + k, C).double()
    M = torch.zeros(C, C, dtype=torch.float64)
    for i in range(C // 2):
        w = 1 / 10000 ** (2 * i / C)
        c, s = math.cos(k * w), math.sin(k * w)
        # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1] = c, s
        M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = -s, c
    shifted = table[:P] @ M.T  # (P, C): the same M applied to every position
    torch.testing.assert_close(shifted, table[k:], atol=1e-5, rtol=0)


def test_sinusoidal_module_takes_batched_positions():
    pe = SinusoidalPositionalEncoding(block_size=32, n_embd=8)
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    out = pe(pos)
    assert out.shape == (2, 4, 8)
    torch.testing.assert_close(out[1], sinusoidal_table(32, 8)[5:9])
    assert "table" not in pe.state_dict()  # a pure function of the sizes: not saved in checkpoints


def test_learned_positions_are_rows_of_a_table_and_end_at_block_size():
    pe = LearnedPositionalEncoding(block_size=8, n_embd=4)
    pos = torch.tensor([[0, 7], [3, 3]])
    torch.testing.assert_close(pe(pos)[0, 1], pe.weight[7])
    with pytest.raises(IndexError):
        pe(torch.tensor([8]))


def _rotate_by_hand(x: torch.Tensor, pos: int, base: float = 10000.0) -> torch.Tensor:
    """Pair (x_i, x_{i+D/2}) read as the complex number x_i + j·x_{i+D/2}, multiplied by e^{j·pos·θ_i}."""
    half = x.shape[-1] // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(
        torch.ones(half, dtype=torch.float64), pos * theta
    )
    return torch.cat((z.real, z.imag), dim=-1).float()


def test_rope_is_a_rotation_of_each_pair():
    D = 16
    rope = RotaryEmbedding(D, max_len=64)
    x = torch.randn(1, 1, 5, D)  # (B, H, T, D)
    pos = torch.tensor([0, 1, 9, 30, 63])
    out = apply_rope(x, *rope(pos))
    for t, p in enumerate(pos.tolist()):
        torch.testing.assert_close(out[0, 0, t], _rotate_by_hand(x[0, 0, t], p), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # rotations keep lengths


def test_rope_dot_product_depends_only_on_the_offset():
    D = 32
    rope = RotaryEmbedding(D, max_len=128)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def score(pq: int, pk: int) -> float:
        rq = apply_rope(q, *rope(torch.tensor([pq])))
        rk = apply_rope(k, *rope(torch.tensor([pk])))
        return (rq * rk).sum().item()

    for offset in (0, 3, 17):
        same = [score(p + offset, p) for p in (0, 5, 40, 100)]
        assert max(same) - min(same) < 1e-4, same
    assert abs(score(10, 0) - score(13, 0)) > 1e-3  # and it does depend on the offset


def test_rope_batched_positions_equal_per_row_positions():
    D = 8
    rope = RotaryEmbedding(D, max_len=32)
    x = torch.randn(2, 3, 4, D)  # (B, H, T, D)
    pos = torch.tensor([[0, 1, 2, 3], [6, 7, 8, 9]])
    out = apply_rope(x, *rope(pos))
    for b in range(2):
        torch.testing.assert_close(out[b : b + 1], apply_rope(x[b : b + 1], *rope(pos[b])))
