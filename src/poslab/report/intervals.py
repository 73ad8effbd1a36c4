"""Confidence intervals for results over seeds and over examples.

* `t_interval`: the mean of a few seeds' values with a Student-t interval (n − 1 degrees of
  freedom): what a difference between two schemes, paired by seed, rests on.
* `paired_difference`: scheme − baseline seed by seed (the seeds both ran), else, when they
  share fewer than two seeds, Welch's unpaired interval; None where neither can be had.
* `wilson_interval`: a binomial interval for an accuracy over the evaluated examples (Wilson
  1927: never outside [0, 1], sensible at 0 and 1, unlike the normal approximation).
* `Interval.p` and `holm`: a difference's two-sided p-value (the same t statistic and degrees of
  freedom as its interval) and the Holm–Bonferroni adjustment over a table's differences.

The t quantile is computed here (regularized incomplete beta, bisection) so that the package
needs no scipy; tests check it against scipy where scipy is installed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean (or difference) with its interval; low/high are None for n = 1 (no spread)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    paired: bool = True
    # the standard error and degrees of freedom behind low/high (a t interval): what its p-value
    # needs; None for an interval built otherwise (a ratio's, a one-seed difference)
    se: float | None = None
    df: float | None = None

    @property
    def p(self) -> float | None:
        """The two-sided p-value of "mean = 0" from the t statistic behind the interval, so that
        p < 1 − confidence exactly when the interval excludes 0; None without a standard error.
        A spread of 0 (identical differences) gives 0 for a nonzero mean, 1 for a zero one."""
        if self.se is None or self.df is None:
            return None
        if self.se == 0.0:
            return 0.0 if self.mean != 0.0 else 1.0
        return 2.0 * t_cdf(-abs(self.mean) / self.se, self.df)

    @property
    def distinguishable(self) -> bool | None:
        """False when the interval holds 0, True when it excludes it, None without one."""
        if self.low is None or self.high is None:
            return None
        return not (self.low <= 0.0 <= self.high)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value below which a fraction `p` (0 < p < 1) of Student's t(df) lies."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    low, high = -1e6, 1e6
    for _ in range(200):  # bisection to machine precision: the cdf is monotone
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, abs(mid)):
            break
    return (low + high) / 2.0


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of `values` with its two-sided Student-t interval (None bounds for one value)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, None, None, n)
    sd = statistics.stdev(values)
    se = sd / math.sqrt(n)
    # the bounds as before the p-value was added (t × sd / √n, in that order: same floats)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, se=se, df=n - 1)


def welch_interval(
    values: list[float], baseline: list[float], confidence: float = CONFIDENCE
) -> Interval | None:
    """mean(values) − mean(baseline) with Welch's interval (unequal variances); None unless
    both have at least two values."""
    if len(values) < 2 or len(baseline) < 2:
        return None
    return welch_from_summaries(
        (statistics.fmean(values), statistics.stdev(values), len(values)),
        (statistics.fmean(baseline), statistics.stdev(baseline), len(baseline)),
        confidence,
    )


def welch_from_summaries(
    values: tuple[float, float, int],
    baseline: tuple[float, float, int],
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """Welch's interval from (mean, sample sd, n) of each side (Welch–Satterthwaite degrees of
    freedom): what a table that kept only mean ± sd still supports. None unless n ≥ 2 each."""
    (mean_a, sd_a, n_a), (mean_b, sd_b, n_b) = values, baseline
    if n_a < 2 or n_b < 2:
        return None
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    diff = mean_a - mean_b
    if va + vb == 0.0:
        return Interval(diff, diff, diff, min(n_a, n_b), paired=False, se=0.0, df=n_a + n_b - 2)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    se = math.sqrt(va + vb)
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return Interval(diff, diff - half, diff + half, min(n_a, n_b), paired=False, se=se, df=df)


def paired_difference(
    values: dict[str, float], baseline: dict[str, float], confidence: float = CONFIDENCE
) -> Interval | None:
    """values − baseline over the seeds both have (keys: seeds), with a t interval over the
    per-seed differences; with fewer than two shared seeds, Welch's unpaired interval when each
    side has two or more seeds, else the single shared seed's difference (no interval), else
    None."""
    shared = [seed for seed in values if seed in baseline]
    if len(shared) >= 2:
        return t_interval([values[s] - baseline[s] for s in shared], confidence)
    welch = welch_interval(list(values.values()), list(baseline.values()), confidence)
    if welch is not None:
        return welch
    if shared:
        return Interval(values[shared[0]] - baseline[shared[0]], None, None, 1)
    return None


def wilson_interval(
    successes: float, n: int, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Wilson's score interval for a proportion successes / n (None for n < 1)."""
    if n < 1:
        return None
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = min(max(successes / n, 0.0), 1.0)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at p = 0 or 1 one bound is exactly 0 or 1 (rounding would leave 0.9999999999999999)
    low = 0.0 if p == 0.0 else max(0.0, centre - half)
    high = 1.0 if p == 1.0 else min(1.0, centre + half)
    return low, high


def holm(p_values: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (Holm 1979), in the order given: a step-down
    correction that controls the family-wise error rate over all of `p_values` (the family).
    The k-th smallest p (k = 1..m) is multiplied by m − k + 1; each adjusted value is then the
    running maximum of those products up to it (monotone: a smaller plain p never gets a larger
    adjusted one), capped at 1. Rejecting every hypothesis whose adjusted p is below α is Holm's
    procedure at level α."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p_values[i]))
        adjusted[i] = running
    return adjusted
