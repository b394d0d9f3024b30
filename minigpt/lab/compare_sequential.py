"""When to stop adding seeds: a confidence sequence for the mean paired difference, valid at every look.

A comparison trains the baseline and the candidate with seed 1, then seed 2, ..., and looks at the paired
differences d_i = candidate_i - baseline_i after each pair. A fixed-n t-test read after every pair is wrong:
looking again and again until p < 0.05 finds a "difference" between a config and itself far more often than
5% of the time. What is needed is an interval that holds at every n at once,

    P(the true mean difference mu lies in CS_n for every n = 2, 3, ...) >= 1 - alpha,

a *confidence sequence*. Then any rule that stops when CS_n says enough (after every pair, after a group of
pairs trained in parallel, after a resumed comparison, after raising the seed cap half-way) keeps its error
rate, because the guarantee never depended on when anyone looked.

**The one used here** is the sequential t-test whose evidence against mu = c is a Bayes factor of the
scale-invariant t statistic (Lai 1976's construction with a Gaussian mixture over the effect instead of his
flat one: Wang & Ramdas 2023, "Anytime-valid t-tests and confidence sequences for Gaussian means with unknown
variance"). With the standardized effect (mu - c)/sigma drawn from N(0, tau^2) under the alternative and
sigma given the scale-invariant (right Haar) prior under both hypotheses, the Bayes factor after n pairs is

    B_n(c) = (1 + n tau^2)^(-1/2) * [(1 + t^2/nu) / (1 + t^2 / (nu (1 + n tau^2)))]^(n/2)

with t = (mean - c) / (s / sqrt n) the t statistic against c and nu = n - 1 (Gönen et al. 2005 give the same
form for the one-sample t-test). If the differences are normal with mean c, B_n(c) is a nonnegative
martingale with B_1 = 1 in the filtration of the scale-free information (d_2/|d_1|, d_3/|d_1|, ...), so by
Ville's inequality P(B_n(c) >= 1/alpha for some n) <= alpha. CS_n is every c whose B_n(c) is below 1/alpha;
B_n grows with |t|, so

    CS_n = mean ± t*_n s / sqrt n,      t*_n: the |t| at which B_n = 1/alpha,

an ordinary t interval with a larger multiplier. Solving B_n = 1/alpha for a = t^2/nu, with K = 1 + n tau^2
and R = (sqrt K / alpha)^(2/n): a = (R - 1) / (1 - R/K), and no finite t reaches 1/alpha while R >= K (with
alpha 0.05 and tau 2, at n <= 3: the interval is the whole line until the fourth pair).

Why this rather than a group-sequential design with an alpha-spending function (O'Brien-Fleming, Pocock)?
Those spend alpha over a schedule of looks fixed by a planned maximum, and their boundaries are computed for a
normal statistic: with few pairs the t statistic's heavy tails need approximations, and raising the cap
after the fact or looking in unplanned groups breaks them. The confidence sequence needs no plan. It pays for
that with width: at n = 10 and alpha 0.05 its multiplier t*_10 is about 4 where the fixed-n t-test's is 2.26.

**The decision** (d = candidate - baseline of a metric where lower is better, m = min_effect): stop at the
first look where

    better        CS_n lies below 0 (the report adds "by at least m" when it lies below -m),
    worse         CS_n lies above 0,
    equivalent    CS_n lies inside (-m, +m): whatever the difference is, it is smaller than what matters,

and otherwise at the seed cap: undecided, with the half-width of CS_n, the size of difference these pairs
could have told from 0. The chance of a wrong "better"/"worse" when the configs are equal, and of a wrong
"equivalent" when they differ by m or more, is at most alpha each (both need mu outside CS_n at some n).
tau sets where the test is most sensitive: a larger tau decides big standardized effects in fewer pairs and
small ones in more. `simulate` measures the error rate and power by drawing normal paired differences.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from minigpt.lab.stats import Interval

ALPHA = 0.05
PRIOR_SCALE = 2.0  # tau: paired seed differences of two configs are often several of their sds apart


def bayes_factor(t: float, n: int, prior_scale: float = PRIOR_SCALE) -> float:
    """B_n against mu = c for a t statistic `t` against c after `n` pairs (see the module docstring)."""
    if n < 2:
        return 1.0  # one difference says nothing about its scale, so nothing scale-free about its mean
    nu, k = n - 1, 1 + n * prior_scale ** 2
    return k ** -0.5 * ((1 + t * t / nu) / (1 + t * t / (nu * k))) ** (n / 2)


def t_boundary(n: int, alpha: float = ALPHA, prior_scale: float = PRIOR_SCALE) -> float:
    """t*_n: the |t| at which B_n reaches 1/alpha (inf while no t can: the interval is the whole line)."""
    if n < 2:
        return math.inf
    k = 1 + n * prior_scale ** 2
    r = (math.sqrt(k) / alpha) ** (2 / n)
    if r >= k:
        return math.inf
    return math.sqrt((n - 1) * (r - 1) / (1 - r / k))


@dataclass(frozen=True)
class ConfidenceSequence(Interval):
    """CS_n over the first `n` paired differences: mean ± half_width (inf while it cannot exclude anything
    yet)."""

    sd: float  # of the differences (n - 1 in the divisor); NaN below 2

    def text(self, digits: int = 3) -> str:
        """`+0.093 (+0.041 to +0.145)`, or `+0.093 (no interval yet)`."""
        if math.isinf(self.half_width):
            return f"{self.mean:+.{digits}f} (no interval yet)"
        return f"{self.mean:+.{digits}f} ({self.low:+.{digits}f} to {self.high:+.{digits}f})"


def confidence_sequence(diffs: list[float], alpha: float = ALPHA,
                        prior_scale: float = PRIOR_SCALE) -> ConfidenceSequence:
    """CS_n of the mean of `diffs` (n = len(diffs) >= 1)."""
    n = len(diffs)
    if n == 0:
        raise ValueError("no differences")
    mean = math.fsum(diffs) / n
    if n < 2:
        return ConfidenceSequence(mean, math.inf, 1, math.nan)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    return ConfidenceSequence(mean, t_boundary(n, alpha, prior_scale) * sd / math.sqrt(n), n, sd)


@dataclass(frozen=True)
class Verdict:
    """The state of a comparison after its last look: `kind` is better, worse, equivalent, undecided (at the
    cap) or running (below the cap, nothing decided yet)."""

    kind: str
    sequence: ConfidenceSequence
    min_effect: float
    max_pairs: int

    @property
    def decided(self) -> bool:
        return self.kind in ("better", "worse", "equivalent")

    def text(self, unit: str = "") -> str:
        """One sentence: what was decided after how many pairs, with CS_n."""
        cs, m, unit = self.sequence, self.min_effect, f" {unit}" if unit else ""
        pairs = f"{cs.n} pair" + ("s" if cs.n != 1 else "")
        interval = f"mean difference {cs.text()}{unit}"
        if self.kind in ("better", "worse"):
            size = ""
            if (self.kind == "better" and cs.high < -m) or (self.kind == "worse" and cs.low > m):
                size = f" by at least min_effect={m:g}"
            elif abs(cs.mean) + cs.half_width < m:
                size = f" by less than min_effect={m:g}"
            return f"{self.kind}{size} after {pairs}: {interval}"
        if self.kind == "equivalent":
            return f"equivalent within ±{m:g}{unit} after {pairs}: {interval}"
        if self.kind == "undecided":
            could = ("nothing" if math.isinf(cs.half_width)
                     else f"differences beyond ±{cs.half_width:.3g}{unit}")
            return (f"undecided at the cap of {pairs}: {interval}; these pairs could tell {could} from 0, "
                    f"not min_effect={m:g}")
        return f"running after {pairs} of at most {self.max_pairs}: {interval}"


def decide(diffs: list[float], min_effect: float, max_pairs: int, alpha: float = ALPHA,
           prior_scale: float = PRIOR_SCALE) -> Verdict:
    """The verdict on the paired differences `diffs` (candidate - baseline, lower is better) at this look."""
    cs = confidence_sequence(diffs, alpha, prior_scale)
    if cs.high < 0:
        kind = "better"
    elif cs.low > 0:
        kind = "worse"
    elif -min_effect < cs.low and cs.high < min_effect:
        kind = "equivalent"
    else:
        kind = "undecided" if cs.n >= max_pairs else "running"
    return Verdict(kind, cs, min_effect, max_pairs)


# ------------------------------------------------------------------------------------------- the simulation


@dataclass(frozen=True)
class Simulated:
    """What `repeats` comparisons of normal paired differences with mean `effect` (in units of their sd,
    with min_effect = `min_effect` sds) decided within `max_pairs`, looking every `pairs_per_look` pairs."""

    effect: float
    min_effect: float
    max_pairs: int
    pairs_per_look: int
    repeats: int
    better: float  # shares of the repeats
    worse: float
    equivalent: float
    undecided: float
    mean_pairs: float  # pairs trained, on average (the cap for the undecided)

    def to_dict(self) -> dict:
        return asdict(self)


def simulate(effect: float, min_effect: float, max_pairs: int, repeats: int, rng: np.random.Generator,
             pairs_per_look: int = 1, alpha: float = ALPHA, prior_scale: float = PRIOR_SCALE) -> Simulated:
    """Run `repeats` comparisons at once on N(effect, 1) differences with `decide`'s rule (vectorised).
    The sd is 1 without loss of generality: CS_n scales with the data, so only effect/sd and min_effect/sd
    matter."""
    d = rng.normal(effect, 1.0, size=(repeats, max_pairs))
    n = np.arange(1, max_pairs + 1)
    total, squares = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
    mean = total / n
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(np.maximum(squares - n * mean ** 2, 0.0) / (n - 1))
    half = np.array([t_boundary(int(k), alpha, prior_scale) for k in n]) * sd / np.sqrt(n)
    low, high = mean - half, mean + half
    looks = (n % pairs_per_look == 0) | (n == max_pairs)
    verdicts = np.zeros((repeats, max_pairs), dtype=np.int8)  # 0 running, 1 better, 2 worse, 3 equivalent
    verdicts[(-min_effect < low) & (high < min_effect)] = 3
    verdicts[low > 0] = 2
    verdicts[high < 0] = 1
    verdicts[:, ~looks] = 0
    stopped = verdicts > 0
    first = np.where(stopped.any(axis=1), stopped.argmax(axis=1), max_pairs - 1)
    final = verdicts[np.arange(repeats), first]
    share = [float((final == k).mean()) for k in (1, 2, 3, 0)]
    return Simulated(effect, min_effect, max_pairs, pairs_per_look, repeats, *share,
                     mean_pairs=float((first + 1).mean()))
