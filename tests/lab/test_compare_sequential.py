"""The sequential test against computations made here: its Bayes factor against the two marginal likelihoods
integrated numerically, its interval against the formula written out, its decisions by hand, and its error
rate by simulations written here in plain loops (not the module's vectorised `simulate`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from minigpt.lab import compare_sequential as cs

ALPHA = 0.05


def integrated_bayes_factor(d: np.ndarray, c: float, tau: float) -> float:
    """B_n(c) from its definition: the likelihood of the data with the standardized effect delta ~ N(0, tau^2)
    and sigma with the scale-invariant prior 1/sigma, over the same without an effect, both integrated
    numerically on a grid (log sigma, where the 1/sigma prior is flat, and delta)."""
    x = d - c
    n, sx, sxx = len(x), x.sum(), (x * x).sum()
    log_sigma = np.linspace(math.log(x.std()) - 8, math.log(x.std()) + 8, 1201)[:, None]
    delta = np.linspace(-10 * tau, 10 * tau, 1201)[None, :]
    sigma = np.exp(log_sigma)
    # log prod N(x_i; delta sigma, sigma^2), up to the constant both hypotheses share
    log_lik = -n * log_sigma - (sxx - 2 * delta * sigma * sx + n * (delta * sigma) ** 2) / (2 * sigma ** 2)
    alt = integrate.trapezoid(integrate.trapezoid(np.exp(log_lik) * stats.norm.pdf(delta, scale=tau),
                                                  delta[0], axis=1), log_sigma[:, 0])
    null = integrate.trapezoid(np.exp(-n * log_sigma[:, 0] - sxx / (2 * sigma[:, 0] ** 2)), log_sigma[:, 0])
    return float(alt / null)


@pytest.mark.parametrize("n,tau,c", [(3, 1.0, 0.0), (5, 2.0, 0.3), (8, 0.5, -0.2)])
def test_the_bayes_factor_is_the_ratio_of_the_integrated_likelihoods(n: int, tau: float, c: float):
    d = np.random.default_rng(n).normal(0.4, 1.0, size=n)
    t = (d.mean() - c) / (d.std(ddof=1) / math.sqrt(n))
    assert cs.bayes_factor(t, n, tau) == pytest.approx(integrated_bayes_factor(d, c, tau), rel=1e-4)


def test_the_boundary_is_where_the_bayes_factor_reaches_one_over_alpha():
    for n in range(4, 40):
        t = cs.t_boundary(n, ALPHA, 2.0)
        assert cs.bayes_factor(t, n, 2.0) == pytest.approx(1 / ALPHA, rel=1e-9)
        assert t > stats.t.ppf(0.975, n - 1)  # wider than the fixed-n t interval
    # B_n grows with |t| towards K^((n-1)/2), K = 1 + n tau^2: below 1/alpha, no t can exclude anything
    for n in (2, 3):
        assert (1 + n * 4.0) ** ((n - 1) / 2) < 1 / ALPHA and math.isinf(cs.t_boundary(n, ALPHA, 2.0))
    assert cs.bayes_factor(1e6, 3, 2.0) == pytest.approx(13.0, rel=1e-6)  # K^((n-1)/2) = 13^1


def test_the_sequence_is_a_t_interval_with_the_boundary_as_multiplier():
    diffs = [0.09, 0.12, 0.05, 0.11, 0.08, 0.10]
    seq = cs.confidence_sequence(diffs, ALPHA, 2.0)
    mean, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
    half = cs.t_boundary(6, ALPHA, 2.0) * sd / math.sqrt(6)
    assert (seq.n, seq.mean, seq.sd) == (6, pytest.approx(mean), pytest.approx(sd))
    assert (seq.low, seq.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert math.isinf(cs.confidence_sequence([0.1], ALPHA).half_width)
    assert cs.confidence_sequence([0.1, 0.2, 0.3]).text() == "+0.200 (no interval yet)"


def test_the_verdicts():
    worse = [0.09, 0.12, 0.05, 0.11, 0.08, 0.10]  # CS about +0.04 to +0.15: above 0
    assert cs.decide(worse, 0.01, 12).kind == "worse"
    assert "by at least min_effect=0.01" in cs.decide(worse, 0.01, 12).text()
    assert cs.decide([-d for d in worse], 0.01, 12).kind == "better"
    assert cs.decide([-d for d in worse], 0.1, 12).text().startswith("better after 6 pairs")  # neither size
    assert "by less than min_effect=0.2" in cs.decide([-d for d in worse], 0.2, 12).text()
    tiny = [0.001, -0.002, 0.0015, -0.001, 0.0005, 0.0, -0.0005, 0.001]
    assert cs.decide(tiny, 0.01, 12).kind == "equivalent"
    mixed = [0.05, -0.04, 0.06, -0.05]
    assert cs.decide(mixed, 0.01, 12).kind == "running"
    undecided = cs.decide(mixed, 0.01, 4)
    assert undecided.kind == "undecided" and not undecided.decided
    assert f"beyond ±{undecided.sequence.half_width:.3g}" in undecided.text()
    assert cs.decide([0.1, 0.2], 0.01, 2).text().endswith("could tell nothing from 0, not min_effect=0.01")


def first_stop(d: np.ndarray, min_effect: float, look_every: int) -> str:
    """The decision rule applied by hand, pair by pair, with `decide`: the verdict where it stops."""
    cap = len(d)
    for n in range(1, cap + 1):
        if n % look_every and n != cap:
            continue
        verdict = cs.decide(list(d[:n]), min_effect, cap)
        if verdict.kind != "running":
            return verdict.kind
    raise AssertionError("the cap always ends a comparison")


def test_the_vectorised_simulation_decides_as_decide_does():
    for effect, look_every in ((0.0, 1), (1.0, 1), (0.3, 3)):
        rng = np.random.default_rng(7)
        d = rng.normal(effect, 1.0, size=(300, 12))
        by_hand = [first_stop(row, 0.5, look_every) for row in d]
        sim = cs.simulate(effect, 0.5, 12, 300, np.random.default_rng(7), pairs_per_look=look_every)
        for kind in ("better", "worse", "equivalent", "undecided"):
            assert getattr(sim, kind) == pytest.approx(by_hand.count(kind) / 300), (effect, kind)


REPEATS = 20_000
MARGIN = 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPEATS)  # 3 Monte Carlo standard errors at the nominal rate


@pytest.mark.parametrize("look_every", [1, 4])
def test_the_false_positive_rate_on_a_null_is_at_most_alpha(look_every: int):
    """A config against itself: paired differences of mean 0 (the sd does not matter: the test is scale
    free), 40 looks; the share of comparisons that ever say better or worse must be at most alpha, up to the
    margin."""
    sim = cs.simulate(0.0, 0.01, 40, REPEATS, np.random.default_rng(1), pairs_per_look=look_every)
    assert sim.better + sim.worse <= ALPHA + MARGIN
    heavy = np.random.default_rng(2).standard_t(5, size=(REPEATS, 40))  # heavier tails than assumed
    n = np.arange(1, 41)
    mean = heavy.cumsum(1) / n
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(np.maximum((heavy ** 2).cumsum(1) - n * mean ** 2, 0) / (n - 1))
    half = np.array([cs.t_boundary(int(k)) for k in n]) * sd / np.sqrt(n)
    assert (np.abs(mean) > half).any(axis=1).mean() <= ALPHA + MARGIN


def test_the_sequence_covers_the_true_mean_at_every_look():
    """Time-uniform coverage, the guarantee every verdict rests on, checked for a nonzero mean and scale."""
    d = np.random.default_rng(3).normal(0.7, 0.03, size=(REPEATS, 30))
    n = np.arange(1, 31)
    mean = d.cumsum(1) / n
    sd = np.array([[np.std(row[:k], ddof=1) if k > 1 else np.nan for k in n] for row in d[:5]])
    seqs = [cs.confidence_sequence(list(d[0, :k])) for k in n]
    assert [s.sd for s in seqs[1:]] == pytest.approx(list(sd[0, 1:]))  # the running sd below, checked once
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(np.maximum((d * d).cumsum(1) - n * mean ** 2, 0) / (n - 1))
    half = np.array([cs.t_boundary(int(k)) for k in n]) * sd / np.sqrt(n)
    missed = (np.abs(mean - 0.7) > half).any(axis=1).mean()
    assert missed <= ALPHA + MARGIN


def test_a_false_equivalence_is_at_most_alpha():
    """Configs that differ by exactly min_effect must rarely be called equivalent."""
    sim = cs.simulate(0.5, 0.5, 60, REPEATS, np.random.default_rng(4))
    assert sim.equivalent <= ALPHA + MARGIN
