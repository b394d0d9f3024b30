"""The lab's statistics against computations made here: the Student t distribution in closed form for 1, 2
and 4 degrees of freedom, textbook formulas written out, and the coverage of the interval by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minigpt.lab.stats import mean_interval, paired_comparison


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t in closed form: df 1 is the Cauchy distribution, df 2 has
    F(t) = 1/2 + t / (2 sqrt(2 + t^2)), inverted by hand."""
    if df == 1:
        return math.tan(math.pi * (q - 0.5))
    if df == 2:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    raise ValueError(df)


def two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) from the closed-form CDFs of df 1, 2 and 4."""
    t = abs(t)
    if df == 1:
        return 1 - 2 / math.pi * math.atan(t)
    if df == 2:
        return 1 - t / math.sqrt(2 + t * t)
    if df == 4:  # F(t) = 1/2 + (3/8) u (1 - t^2 / (12 (1 + t^2 / 4))), u = t / sqrt(1 + t^2 / 4)
        u = t / math.sqrt(1 + t * t / 4)
        return 1 - 2 * (3 / 8) * u * (1 - t * t / (12 * (1 + t * t / 4)))
    raise ValueError(df)


def _sd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_three_seeds_get_the_t_interval_with_two_degrees_of_freedom():
    losses = [4.21, 4.25, 4.23]  # mean 4.23, sd 0.02
    interval = mean_interval(losses)
    half = t_quantile(0.975, 2) * 0.02 / math.sqrt(3)  # t = 4.3027
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)  # the printed tables' value
    assert interval.mean == pytest.approx(4.23) and interval.half_width == pytest.approx(half)
    assert interval.n == 3 and interval.text() == "4.230 ± 0.050"
    two = mean_interval([1.0, 2.0])
    assert two.half_width == pytest.approx(t_quantile(0.975, 1) * _sd([1.0, 2.0]) / math.sqrt(2))  # 12.7 x


def test_one_seed_has_no_interval():
    one = mean_interval([4.2])
    assert one.mean == 4.2 and math.isnan(one.half_width) and one.text() == "4.200"


@pytest.mark.parametrize("row, base", [
    ([5.30, 5.41, 5.38], [5.27, 5.26, 5.31]),  # clearly above
    ([5.27, 5.29, 5.26], [5.27, 5.26, 5.31]),  # about the same
    ([4.0, 4.5, 3.8, 4.2, 4.4], [4.1, 4.2, 3.7, 4.0, 4.1]),  # 5 seeds: df 4
])
def test_the_paired_test_is_the_t_test_of_the_differences(row: list[float], base: list[float]):
    seeds = [1337 + i for i in range(len(row))]
    result = paired_comparison(dict(zip(seeds, row, strict=True)), dict(zip(seeds, base, strict=True)))
    d = [r - b for r, b in zip(row, base, strict=True)]
    n, mean, sd = len(d), sum(d) / len(d), _sd(d)
    t = mean / (sd / math.sqrt(n))
    assert result.p_value == pytest.approx(two_sided_p(t, n - 1), rel=1e-9)
    assert result.difference.mean == pytest.approx(mean)
    if n == 3:
        assert result.difference.half_width == pytest.approx(t_quantile(0.975, 2) * sd / math.sqrt(n))
    # within noise <=> the 95% interval of the difference holds 0
    assert result.within_noise() == result.difference.contains(0.0)


def test_pairs_are_made_by_seed_on_the_seeds_both_have():
    row = {3: 10.0, 1: 1.5, 2: 2.0}  # seed 3 has no baseline run
    base = {1: 1.0, 2: 1.0, 4: 7.0}
    result = paired_comparison(row, base)
    assert result.difference.n == 2 and result.difference.mean == pytest.approx(0.75)  # (0.5 + 1.0) / 2
    t = 0.75 / (_sd([0.5, 1.0]) / math.sqrt(2))
    assert result.p_value == pytest.approx(two_sided_p(t, 1))
    assert paired_comparison({1: 1.0}, {2: 1.0}) is None
    single = paired_comparison({1: 2.0}, {1: 1.0})
    assert math.isnan(single.p_value) and not single.tested and not single.within_noise()  # one pair: no test
    assert single.label() == " (1 seed: no test)"


def test_identical_differences_are_decided_without_a_t_statistic():
    same = paired_comparison({1: 4.0, 2: 5.0}, {1: 4.0, 2: 5.0})
    assert same.p_value == 1.0 and same.within_noise()
    shifted = paired_comparison({1: 4.5, 2: 5.5, 3: 6.5}, {1: 4.0, 2: 5.0, 3: 6.0})
    assert shifted.difference.mean == pytest.approx(0.5) and not shifted.within_noise()


def test_the_interval_covers_the_true_mean_95_times_in_100():
    """Seeded simulation: 4,000 experiments of 3 normal draws; the 95% interval must hold the true mean in
    about 95% of them (binomial sd 0.34%), and a paired test of two equal configs must reject about 5% of
    the time."""
    rng = np.random.default_rng(0)
    draws = rng.normal(4.2, 0.05, size=(4000, 3))
    covered = np.mean([mean_interval(list(x)).contains(4.2) for x in draws])
    assert covered == pytest.approx(0.95, abs=0.015)
    shared = rng.normal(0, 0.05, size=(4000, 3))  # what the seed does to both runs
    noise = rng.normal(0, 0.01, size=(2, 4000, 3))
    rejected = np.mean([not paired_comparison(dict(enumerate(s + a)), dict(enumerate(s + b))).within_noise()
                        for s, a, b in zip(shared, noise[0], noise[1], strict=True)])
    assert rejected == pytest.approx(0.05, abs=0.015)
