"""Statistics for comparing allocations over seeds and for the novelty analysis (no scipy).

- `summary`: mean and sample standard deviation (ddof = 1) over seeds (a `Summary`).
- `paired_difference`: per-seed differences a_s - b_s over the seeds both have (same seed = same
  data order and init seed), their mean, sample std and the two-sided Student-t confidence
  interval mean ± t_{1-alpha/2, n-1} * std / sqrt(n) (a `PairedDifference`).
- `t_quantile`: the Student t quantile, by bisection on the CDF; the CDF is written with the
  regularized incomplete beta function, evaluated by its continued fraction (modified Lentz).
- `confidence_sequence`: an anytime-valid confidence sequence for the mean of paired
  differences with unknown variance (a scale-invariant Gaussian-mixture t-test martingale, Lai
  1976; Wang & Ramdas 2023), for deciding as seeds arrive (`taperlm.compare.statistics`).
- `pearson`: the correlation of two sequences (nan when undefined); `spearman` and
  `pairwise_agreement`: how well an ordering matches a reference ordering.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The records below are frozen dataclasses whose `to_json` is the JSON object report.json and
# the other reports hold (keys in that order) and whose `from_json` reads it back: the files'
# layout is the records', so a report written before the records were typed reads the same.


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def std(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1); None for fewer than two values."""
    n = len(xs)
    if n < 2:
        return None
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1))


@dataclass(frozen=True)
class Summary:
    """Values over seeds and their mean and sample standard deviation (`summary`)."""

    mean: float | None  # None: no values
    std: float | None  # sample std (n - 1); None: fewer than two values
    n: int  # how many values
    values: tuple[float, ...]  # the values, in the order given

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "n": self.n, "values": list(self.values)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        return cls(data["mean"], data["std"], data["n"], tuple(data["values"]))


def summary(xs: Sequence[float]) -> Summary:
    vals = [float(x) for x in xs]
    return Summary(mean(vals) if vals else None, std(vals), len(vals), tuple(vals))


# ----------------------------------------------------------------------------------------------
# Student t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (e.g. t_quantile(0.975, 2) = 4.302653)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------------------------
# paired differences


@dataclass(frozen=True)
class PairedDifference:
    """Per-seed differences of two series over the seeds both have, with a Student-t interval
    (`paired_difference`)."""

    seeds: tuple[int, ...]  # the seeds both series have, ascending
    per_seed: tuple[float, ...]  # a[s] - b[s] per seed, in that order
    n: int  # how many seeds
    mean: float | None  # None: no common seed
    std: float | None  # sample std; None: n < 2
    confidence: float  # the interval's coverage, e.g. 0.95
    t: float | None  # the t quantile used; None: n < 2
    ci: tuple[float, float] | None  # [lo, hi]; None: n < 2
    excludes_zero: bool | None  # whether the interval excludes 0; None: n < 2

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": list(self.seeds),
            "per_seed": list(self.per_seed),
            "n": self.n,
            "mean": self.mean,
            "std": self.std,
            "confidence": self.confidence,
            "t": self.t,
            "ci": None if self.ci is None else list(self.ci),
            "excludes_zero": self.excludes_zero,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PairedDifference:
        ci = data["ci"]
        return cls(
            seeds=tuple(data["seeds"]),
            per_seed=tuple(data["per_seed"]),
            n=data["n"],
            mean=data["mean"],
            std=data["std"],
            confidence=data["confidence"],
            t=data["t"],
            ci=None if ci is None else (ci[0], ci[1]),
            excludes_zero=data["excludes_zero"],
        )


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = 0.95
) -> PairedDifference:
    """Differences a[s] - b[s] over the seeds s present in both, with a t confidence interval
    (None, as are t and excludes_zero, when n < 2)."""
    seeds = sorted(set(a) & set(b))
    diffs = [float(a[s]) - float(b[s]) for s in seeds]
    m, sd = (mean(diffs) if diffs else None), std(diffs)
    t = ci = excludes_zero = None
    if len(diffs) >= 2:
        t = t_quantile(0.5 + confidence / 2.0, len(diffs) - 1)
        half = t * sd / math.sqrt(len(diffs))
        ci = (m - half, m + half)
        excludes_zero = bool(m - half > 0 or m + half < 0)
    return PairedDifference(
        tuple(seeds), tuple(diffs), len(diffs), m, sd, confidence, t, ci, excludes_zero
    )


# ----------------------------------------------------------------------------------------------
# anytime-valid confidence sequence (sequential paired comparisons)

# The mixture's precision c: the standardized effect theta = mu / sigma gets the prior
# N(0, 1/c), i.e. a prior sd of 1/sqrt(0.1) = 3.2 standard deviations of the paired difference.
# Seed-paired differences of one recipe are tight (the main job's: mean/sd = 5.4), so a wide
# prior is what lets the sequence decide within a handful of seeds: at alpha = 0.05, among c in
# [0.01, 1], c = 0.1 gives the narrowest interval at n = 4 (6.5 s/sqrt(n)) and stays within 11%
# of the narrowest up to n = 15 (3.9 against c = 1's 3.5, which is unbounded until n = 5); it
# is finite from n = 3. It is fixed in advance: a c chosen after seeing the data would void the
# guarantee.
CS_PRECISION = 0.1


def t_mixture_halfwidth(n, q, alpha: float, c: float = CS_PRECISION):
    """The half-width of the confidence sequence after n observations whose sum of squared
    deviations from their mean is q (numpy arrays or floats; inf where the sequence is not yet
    finite). See `confidence_sequence` for the construction."""
    import numpy as np  # lazy: plan stays numpy-free

    n = np.asarray(n, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # M_n(mu) < 1/alpha  <=>  V / (V - S^2/(n+c)) < K, with K below
        k = np.exp((2.0 * np.log(1.0 / alpha) + np.log((n + c) / c)) / n)
        room = 1.0 - k * c / (n + c)  # > 0 once the sequence is finite
        half = np.sqrt((k - 1.0) * q / (n * room))
    return np.where((n >= 2) & (room > 0), half, np.inf)


@dataclass(frozen=True)
class ConfidenceStep:
    """The confidence sequence after the first n observations (`confidence_sequence`)."""

    n: int  # observations so far
    mean: float  # their mean
    half: float  # the half-width (inf while the sequence is unbounded)
    ci: tuple[float, float]  # (mean - half, mean + half); (-inf, inf) while unbounded


def confidence_sequence(
    xs: Sequence[float], alpha: float = 0.05, c: float = CS_PRECISION
) -> list[ConfidenceStep]:
    """The anytime-valid (1 - alpha) confidence sequence for the mean mu of `xs`, in their order:
    one entry per n = 1..len(xs) with n, mean, half (half-width; inf while unbounded) and ci
    [lo, hi]. With probability at least 1 - alpha the interval contains mu at EVERY n at once,
    so it stays valid however often it is looked at and whenever one stops, including "stop as
    soon as it excludes 0" (a fixed-n t interval does not: looked at after every seed its error
    rate grows several-fold; tests/compare/test_sequential.py measures both).

    Assumption: the xs are independent draws from one Gaussian N(mu, sigma^2), sigma unknown —
    here the per-seed paired differences of two allocations (a seed fixes init and data order, so
    seeds are independent replications and the pairing removes what a seed shares).

    Construction (a test martingale in the scale-invariant filtration; Lai 1976, as analysed by
    Wang & Ramdas 2023, "Anytime-valid t-tests and confidence sequences for Gaussian means with
    unknown variance"): for a candidate mean mu let S_n = sum (x_i - mu) and
    V_n = sum (x_i - mu)^2. Integrating the likelihood ratio of N(mu + theta sigma, sigma^2)
    against N(mu, sigma^2) over sigma with the right Haar measure d sigma / sigma (which makes it
    depend on the data only through their ratios: any sigma, no plug-in) and over the
    standardized effect theta ~ N(0, 1/c) gives

        M_n(mu) = sqrt(c / (n + c)) * (V_n / (V_n - S_n^2 / (n + c)))^(n/2),

    a nonnegative martingale with M_1 = 1 when mu is the true mean (the likelihood ratio of the
    maximal invariant x / |x_1|). Ville's inequality: P(exists n: M_n(mu) >= 1/alpha) <= alpha.
    The sequence is {mu : M_n(mu) < 1/alpha}: with xbar the mean and Q = sum (x_i - xbar)^2,
    K = (1/alpha)^(2/n) ((n + c)/c)^(1/n), it is xbar +- sqrt((K - 1) Q / (n (1 - K c/(n + c)))),
    unbounded while K c >= n + c (n = 1, 2 at c = 0.1, alpha = 0.05). Why this one: it needs no
    variance bound (a Hoeffding/Bernstein sequence would) and no large n (asymptotic sequences
    are not valid at 3-15 seeds); its price is a wider interval than the fixed-n t interval at the
    same n (about 1.8x at n = 15, 2x at n = 4), the cost of being allowed to look after every seed."""
    import numpy as np  # lazy: plan stays numpy-free

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if c <= 0:
        raise ValueError(f"the mixture precision c must be positive, got {c}")
    x = np.asarray([float(v) for v in xs], dtype=np.float64)
    out: list[ConfidenceStep] = []
    for n in range(1, len(x) + 1):
        head = x[:n]
        m = mean(head.tolist())
        q = math.fsum((v - m) ** 2 for v in head.tolist())
        half = float(t_mixture_halfwidth(n, q, alpha, c))
        ci = (m - half, m + half) if math.isfinite(half) else (-math.inf, math.inf)
        out.append(ConfidenceStep(n, m, half, ci))
    return out


def running_halfwidths(x, alpha: float, c: float = CS_PRECISION):
    """The confidence sequence of every row of `x` (runs x observations) at once: (means,
    half-widths), each runs x observations (numpy; for simulations)."""
    import numpy as np  # lazy: plan stays numpy-free

    x = np.asarray(x, dtype=np.float64)
    n = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    shifted = x - x[..., :1]  # Q is shift-invariant; shifting keeps the cumulative sums exact
    s1, s2 = np.cumsum(shifted, axis=-1), np.cumsum(shifted**2, axis=-1)
    q = np.maximum(s2 - s1 * s1 / n, 0.0)
    return x[..., :1] + s1 / n, t_mixture_halfwidth(n, q, alpha, c)


# ----------------------------------------------------------------------------------------------
# agreement of orderings


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; nan when either side is constant or has fewer than 2 points."""
    import numpy as np  # lazy: plan stays numpy-free

    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.size < 2 or a.size != b.size:
        return float("nan")
    a, b = a - a.mean(), b - b.mean()
    denom = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else float("nan")


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (Pearson of average ranks); None if undefined."""
    r = pearson(ranks(x), ranks(y))
    return None if math.isnan(r) else r


@dataclass(frozen=True)
class PairwiseAgreement:
    """How many pairs two orderings put the same way (`pairwise_agreement`)."""

    pairs: int  # pairs compared (those not tied in the reference)
    agree: int  # of which ordered as in the reference
    fraction: float | None  # agree / pairs; None: no pair
    ties_in_reference: int  # pairs skipped because the reference ties them
    disagreeing_pairs: tuple[tuple[str, str], ...]  # the pairs ordered differently

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "agree": self.agree,
            "fraction": self.fraction,
            "ties_in_reference": self.ties_in_reference,
            "disagreeing_pairs": [list(p) for p in self.disagreeing_pairs],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PairwiseAgreement:
        return cls(
            pairs=data["pairs"],
            agree=data["agree"],
            fraction=data["fraction"],
            ties_in_reference=data["ties_in_reference"],
            disagreeing_pairs=tuple((p, q) for p, q in data["disagreeing_pairs"]),
        )


def pairwise_agreement(ours: Mapping[str, float], ref: Mapping[str, float]) -> PairwiseAgreement:
    """For every pair of names in both mappings whose reference values differ: does our order
    agree? Pairs tied in the reference are skipped (counted under `ties_in_reference`)."""
    names = [n for n in ref if n in ours]
    agree, disagree, ties = [], [], 0
    for i, p in enumerate(names):
        for q in names[i + 1 :]:
            if ref[p] == ref[q]:
                ties += 1
                continue
            same = (ours[p] - ours[q]) * (ref[p] - ref[q]) > 0
            (agree if same else disagree).append((p, q))
    n = len(agree) + len(disagree)
    return PairwiseAgreement(n, len(agree), len(agree) / n if n else None, ties, tuple(disagree))


def relative_ppl_change(loss_diff: float) -> float:
    """A difference of mean log-losses (nats) as the relative change of perplexity, in percent:
    100 (exp(Δ) − 1), i.e. the ratio of geometric-mean perplexities minus one."""
    return 100.0 * math.expm1(loss_diff)
