"""The loss as a function of model size and data, L(N, D) = E + A / N^alpha + B / D^beta: fit and bootstrap.

N is the model's non-embedding parameters (GPT.num_params: the N of its 6N FLOPs per token, the untied output
head included), D the training tokens, L the val loss in nats per token. E is the loss no model reaches (the
entropy of the text, as far as this tokenizer sees it); A/N^alpha is what a finite model leaves, B/D^beta
what finite data leaves. This is the parametric form of Chinchilla (Hoffmann et al. 2022, "approach 3"),
fitted their way: with a = log A, b = log B, e = log E,

    minimise  sum_i Huber_delta( LSE(a - alpha log N_i, b - beta log D_i, e) - log L_i ),   delta = 1e-3,

where LSE is log-sum-exp (so the fit compares log L, and every parameter stays positive), by L-BFGS (the
analytic gradient is written out in `_loss`). The Huber loss is quadratic for residuals below delta and
linear above, so one odd run cannot drag the fit. The objective has many local minima, so the fit starts
from several points: for each (alpha, beta) of a grid, L is linear in E, A and B, whose nonnegative least
squares solution (scipy's nnls) is a start; the `POLISHED` starts with the lowest objective are run to
convergence and the best end wins.

**Intervals** come from the bootstrap: resample the runs with replacement (as many as there are), refit,
repeat; the 2.5th and 97.5th percentiles of a quantity over the refits are its 95% interval. Each refit
also starts from the fit's own solution. A re-analysis of Chinchilla
(Besiroglu et al. 2024, "Chinchilla scaling: a replication attempt") found its published intervals far too
narrow for the number of runs behind them: with 20-30 runs here, expect wide ones, and read them.

**Compute-optimal.** With C = 6 N D (Chinchilla's convention; minigpt's own FLOPs count adds attention,
GPT.flops_per_token), minimising L at fixed C gives

    N_opt = G (C/6)^(beta/(alpha+beta)),   D_opt = (C/6)^(alpha/(alpha+beta)) / G,
    G = (alpha A / (beta B))^(1/(alpha+beta)),

so the compute-optimal tokens per parameter D_opt / N_opt = (C/6)^((alpha-beta)/(alpha+beta)) / G^2, a
constant only where alpha = beta (Chinchilla's ~20).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize

HUBER_DELTA = 1e-3
EXPONENTS = (0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.5)  # the (alpha, beta) grid of starting points
POLISHED = 4  # starts run to convergence: the grid's best


@dataclass(frozen=True)
class LossLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def __call__(self, n, d):
        return self.E + self.A / np.power(n, self.alpha) + self.B / np.power(d, self.beta)

    def optimum(self, flops: float) -> tuple[float, float]:
        """(N_opt, D_opt) at C = 6 N D = `flops` (see the module docstring). A fit whose size term vanishes
        (alpha A = 0: size does not matter) puts all compute into data, N -> 0 and D -> inf; one whose data
        term vanishes the other way round; with neither term there is no optimum (nan, nan)."""
        a, b = self.alpha, self.beta
        size_pull, data_pull = a * self.A, b * self.B
        if size_pull == 0 and data_pull == 0:
            return math.nan, math.nan
        if size_pull == 0:
            return 0.0, math.inf
        if data_pull == 0:
            return math.inf, 0.0
        log_g = (math.log(size_pull) - math.log(data_pull)) / (a + b)  # in logs: G can overflow a float
        log_c = math.log(flops / 6)
        with np.errstate(over="ignore"):
            return float(np.exp(log_g + log_c * b / (a + b))), float(np.exp(log_c * a / (a + b) - log_g))

    def tokens_per_param(self, flops: float) -> float:
        n, d = self.optimum(flops)
        return math.inf if n == 0 else d / n  # N -> 0: unbounded; no optimum (nan) stays nan

    def to_dict(self) -> dict:
        return asdict(self)


def _params(x: np.ndarray) -> tuple[float, float, float, float, float]:
    return float(x[0]), float(x[1]), float(x[2]), float(x[3]), float(x[4])  # a, b, e, alpha, beta


def _loss(x: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray) -> tuple[float, np.ndarray]:
    """The Huber objective and its gradient in (a, b, e, alpha, beta)."""
    a, b, e, alpha, beta = _params(x)
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])  # (3, runs)
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    lse = top + np.log(weights.sum(axis=0))
    weights /= weights.sum(axis=0)  # d LSE / d term: the softmax of the three terms
    r = lse - log_l
    small = np.abs(r) <= HUBER_DELTA
    value = np.where(small, 0.5 * r * r, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA)).sum()
    slope = np.where(small, r, HUBER_DELTA * np.sign(r))  # Huber'(r)
    grad = np.array([(slope * weights[0]).sum(), (slope * weights[1]).sum(), (slope * weights[2]).sum(),
                     -(slope * weights[0] * log_n).sum(), -(slope * weights[1] * log_d).sum()])
    return float(value), grad


def grid_starts(log_n: np.ndarray, log_d: np.ndarray, loss: np.ndarray) -> list[np.ndarray]:
    """For each (alpha, beta) of the grid, the nonnegative least squares (E, A, B) as a start (a, b, e,
    alpha, beta), best objective first."""
    starts = []
    for alpha, beta in itertools.product(EXPONENTS, EXPONENTS):
        design = np.stack([np.ones_like(log_n), np.exp(-alpha * log_n), np.exp(-beta * log_d)], axis=1)
        e, a, b = np.maximum(optimize.nnls(design, loss)[0], 1e-6)  # a zero term: a tiny one, for its log
        starts.append(np.array([math.log(a), math.log(b), math.log(e), alpha, beta]))
    return sorted(starts, key=lambda x: _loss(x, log_n, log_d, np.log(loss))[0])


def fit_law(n, d, loss, extra_starts: tuple[np.ndarray, ...] = ()) -> LossLaw:
    """The best of the fits from the grid's `POLISHED` best starts and `extra_starts`."""
    log_n, log_d, loss = np.log(n), np.log(d), np.asarray(loss, dtype=float)
    bounds = [(None, None), (None, None), (None, None), (0.0, 3.0), (0.0, 3.0)]
    best = None
    for x0 in [*extra_starts, *grid_starts(log_n, log_d, loss)[:POLISHED]]:
        res = optimize.minimize(_loss, x0, args=(log_n, log_d, np.log(loss)), jac=True, method="L-BFGS-B",
                                bounds=bounds, options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000})
        if best is None or res.fun < best.fun:
            best = res
    a, b, e, alpha, beta = _params(best.x)
    return LossLaw(E=math.exp(e), A=math.exp(a), alpha=alpha, B=math.exp(b), beta=beta)


def law_vector(law: LossLaw) -> np.ndarray:
    return np.array([math.log(law.A), math.log(law.B), math.log(law.E), law.alpha, law.beta])


def bootstrap(n, d, loss, law: LossLaw, repeats: int,
              rng: np.random.Generator) -> list[tuple[LossLaw, np.ndarray]]:
    """`repeats` refits on runs drawn with replacement (each also started from `law`), each with the log
    residuals of the runs it drew."""
    n, d, loss = map(np.asarray, (n, d, loss))
    out = []
    for _ in range(repeats):
        pick = rng.integers(0, len(n), size=len(n))
        refit = fit_law(n[pick], d[pick], loss[pick], (law_vector(law),))
        out.append((refit, np.log(loss[pick]) - np.log(refit(n[pick], d[pick]))))
    return out


def interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile interval of `values` (the bootstrap's), interpolating linearly between the order
    statistics as numpy's default does. An end that reaches an infinite value (a refit whose optimum runs off
    to an edge) is infinite: the runs do not bound it. (numpy's own interpolation gives nan there.)"""
    ordered = np.sort(np.asarray(values, dtype=float))
    tail = (1 - confidence) / 2
    ends = []
    for q in (tail, 1 - tail):
        position = q * (len(ordered) - 1)
        below, above = ordered[math.floor(position)], ordered[math.ceil(position)]
        t = position - math.floor(position)
        ends.append(float(below) if below == above or t == 0 else float(below + t * (above - below)))
    return ends[0], ends[1]
