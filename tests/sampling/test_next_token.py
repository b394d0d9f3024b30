"""Sampling filters and the seeded draw, checked against explicit NumPy formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minigpt.errors import UserError
from minigpt.sampling.next_token import entropy, probabilities, sample
from minigpt.sampling.params import SamplingParams


def _logits(rows: int = 8, vocab: int = 50, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_reference(x: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
    """Temperature, then top-k, then top-p, written out row by row in float64."""
    out = np.zeros_like(x)
    for r, row in enumerate(x):
        probs = _np_softmax(row / t)
        order = np.argsort(-probs, kind="stable")
        keep = order[:k] if k else order
        kept = np.zeros_like(probs)
        kept[keep] = probs[keep]
        kept /= kept.sum()
        order = np.argsort(-kept, kind="stable")
        cum, nucleus = 0.0, []
        for i in order:  # the smallest prefix of the sorted tokens whose mass reaches p
            nucleus.append(i)
            cum += kept[i]
            if cum >= p - 1e-12:
                break
        final = np.zeros_like(kept)
        final[nucleus] = kept[nucleus]
        out[r] = final / final.sum()
    return out


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.6), (2, 3, 0.95)])
def test_probabilities_match_explicit_formula(t, k, p):
    x = _logits()
    got = probabilities(x, SamplingParams(t, k, p)).double().numpy()
    want = _np_reference(x.double().numpy(), t, k, p)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_temperature_near_zero_is_argmax_and_zero_is_greedy():
    x = _logits(rows=64)
    argmax = x.argmax(dim=-1)
    x[torch.arange(64), argmax] += 0.05  # a clear winner: at T = 1e-4 the runner-up gets exp(-500)
    probs = probabilities(x, SamplingParams(temperature=1e-4))
    assert torch.equal(probs.argmax(dim=-1), argmax)
    assert torch.allclose(probs.max(dim=-1).values, torch.ones(64))
    g = torch.Generator().manual_seed(0)
    for t in (0.0, 1e-4):
        assert torch.equal(sample(x, SamplingParams(temperature=t), g), argmax)


def test_huge_temperature_is_near_uniform():
    x = _logits(vocab=1000, scale=10.0)
    h = entropy(probabilities(x, SamplingParams(temperature=1e5)))
    assert torch.allclose(h, torch.full_like(h, math.log(1000)), rtol=1e-4)
    assert (entropy(probabilities(x, SamplingParams(temperature=1.0))) < 0.9 * math.log(1000)).all()


def test_temperature_is_stable_for_huge_logits():
    # At T=1e-10, x / T overflows float32 (1e30 / 1e-10 = 1e40 > 3.4e38): without subtracting the row
    # maximum first, softmax would see inf - inf and give NaN (its own max shift comes too late).
    x = torch.tensor([[1e30, 1e30 - 1e24, -1e30]])
    assert torch.isnan(torch.softmax(x / 1e-10, dim=-1)).any()  # the naive formula really breaks here
    probs = probabilities(x, SamplingParams(temperature=1e-10))
    assert torch.equal(probs, torch.tensor([[1.0, 0.0, 0.0]]))


def test_top_k_never_samples_outside_the_k_most_likely():
    x = _logits(rows=4000, vocab=30, seed=1, scale=1.0)
    tokens = sample(x, SamplingParams(1.0, top_k=4), torch.Generator().manual_seed(1))
    top4 = np.argsort(-x.numpy(), axis=-1)[:, :4]
    assert all(t in row for t, row in zip(tokens.tolist(), top4, strict=True))
    assert len(set(tokens.tolist())) > 4  # the rows differ, so all tokens do not come from one set


def test_top_k_with_ties_keeps_exactly_k():
    x = torch.zeros(1, 10)  # every token ties
    assert int((probabilities(x, SamplingParams(1.0, top_k=3)) > 0).sum()) == 3


def test_top_p_never_samples_outside_the_nucleus():
    x = _logits(rows=4000, vocab=30, seed=2, scale=2.0)
    p = 0.7
    tokens = sample(x, SamplingParams(1.0, top_p=p), torch.Generator().manual_seed(2))
    want = _np_reference(x.double().numpy(), 1.0, 0, p)
    assert all(want[r, t] > 0 for r, t in enumerate(tokens.tolist()))


def test_samples_follow_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0]))
    x = logits.expand(40000, 5)
    tokens = sample(x, SamplingParams(1.0), torch.Generator().manual_seed(3))
    freq = torch.bincount(tokens, minlength=5).double() / 40000
    assert torch.allclose(freq, torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0], dtype=torch.double), atol=0.01)


def test_seeded_and_independent_of_the_global_rng():
    x = _logits(rows=100, scale=0.5)
    params = SamplingParams(1.0, top_k=20, top_p=0.9)
    state = torch.get_rng_state()
    a = sample(x, params, torch.Generator().manual_seed(7))
    torch.manual_seed(123)  # must make no difference
    b = sample(x, params, torch.Generator().manual_seed(7))
    c = sample(x, params, torch.Generator().manual_seed(8))
    torch.set_rng_state(state)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_generator_consumption_does_not_depend_on_the_knobs():
    x = _logits(rows=3)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    sample(x, SamplingParams(0.0), g1)
    sample(x, SamplingParams(1.5, top_k=2, top_p=0.5), g2)
    assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.parametrize(
    "kwargs,key",
    [({"temperature": -0.1}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"),
     ({"top_p": 1.5}, "top_p"), ({"temperature": float("nan")}, "temperature")],
)  # fmt: skip
def test_bad_knobs_are_user_errors(kwargs, key):
    with pytest.raises(UserError, match=key):
        SamplingParams(**kwargs)
