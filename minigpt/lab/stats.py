"""Is a difference real? A mean over seeds with its 95% interval, and the paired comparison of two configs.

A row of the speedrun or the ablation lab is one config trained with n seeds. Its mean comes with a Student-t
interval,

    mean ± t(0.975, n - 1) · s / √n          s: the standard deviation over the seeds (n - 1 in its divisor)

which, for results spread normally around the config's true mean, covers that mean in 95% of experiments.
With 3 seeds t(0.975, 2) = 4.30, so the interval is wide unless the seeds agree closely; one seed has none.

Two rows trained with the same seeds are compared seed by seed. A seed fixes the data order and, where the
two models have the same shapes, the initial weights, so much of what varies from seed to seed is shared by
the two runs of one seed and cancels in their difference d_i = x_i - b_i. The paired t-test asks whether
the mean difference could be 0:

    t = mean(d) / (s_d / √n),       p = P(|T_(n-1)| >= |t|)          (two-sided)

p is how often a mean difference at least this large would appear if the two configs were equally good. A row
is *within noise* when p >= alpha, which is the same as its 95% interval of the mean difference containing 0
(at alpha = 0.05). Differences are identical across seeds only when the two configs compute the same thing:
then s_d = 0 and p is 1 for d = 0 (no difference) and 0 otherwise.

One shared seed gives one difference and no spread to judge it by: no interval, no p-value, and no verdict,
"within noise" included (`Paired.label`: "1 seed: no test"). A fixed number of seeds answers "could these
seeds tell?", not "is there a difference?": scripts/compare.py adds seeds until it can say which
(compare_sequential.py).

Comparing many rows with one baseline, about one row in twenty that is really no different comes out below
alpha = 0.05 by chance; read a lone p = 0.03 among eight rows with that in mind (modded-nanogpt asks
p < 0.01 of a new record). The t quantiles and tail probabilities are scipy's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

CONFIDENCE = 0.95
ALPHA = 0.05  # a row whose paired p-value is at least this is within noise


@dataclass(frozen=True)
class Interval:
    """A mean over `n` values and the half-width of its interval (NaN for a single value)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def text(self, digits: int = 3, signed: bool = False) -> str:
        """`4.213 ± 0.021` (`+0.031 ± 0.040` when signed); a single value alone."""
        mean = f"{self.mean:+.{digits}f}" if signed else f"{self.mean:.{digits}f}"
        return mean if math.isnan(self.half_width) else f"{mean} ± {self.half_width:.{digits}f}"


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of `values` and its Student-t interval at `confidence` (see the module docstring)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, math.nan, 1)
    t = float(scipy_stats.t.ppf(0.5 + confidence / 2, df=n - 1))
    return Interval(mean, t * statistics.stdev(values) / math.sqrt(n), n)


@dataclass(frozen=True)
class Paired:
    """A row against the baseline over the seeds both have: the mean difference (row - baseline) with its
    interval, and the two-sided p-value of the paired t-test."""

    difference: Interval
    p_value: float  # NaN with fewer than 2 shared seeds

    @property
    def tested(self) -> bool:
        """Whether there was a test: at least 2 shared seeds (one difference has no spread to judge it by)."""
        return not math.isnan(self.p_value)

    def within_noise(self, alpha: float = ALPHA) -> bool:
        """Tested, and not distinguishable from the baseline at `alpha`."""
        return self.tested and self.p_value >= alpha

    def label(self, alpha: float = ALPHA) -> str:
        """What the comparison may say: ` (noise)`, ` (1 seed: no test)`, or nothing (a difference)."""
        if not self.tested:
            return f" ({self.difference.n} seed: no test)"
        return " (noise)" if self.within_noise(alpha) else ""


def paired_comparison(values: Mapping[int, float], baseline: Mapping[int, float],
                      confidence: float = CONFIDENCE) -> Paired | None:
    """Compare `values` with `baseline`, both by seed, on the seeds they share; None if they share none."""
    seeds = sorted(set(values) & set(baseline))
    if not seeds:
        return None
    diffs = [values[s] - baseline[s] for s in seeds]
    difference = mean_interval(diffs, confidence)
    if len(diffs) < 2:
        return Paired(difference, math.nan)
    if statistics.stdev(diffs) == 0:  # the same computation: t would be 0/0 or ±inf
        return Paired(difference, 1.0 if difference.mean == 0 else 0.0)
    test = scipy_stats.ttest_rel([values[s] for s in seeds], [baseline[s] for s in seeds])
    return Paired(difference, float(test.pvalue))
