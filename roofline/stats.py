"""The one quantile: linear interpolation between order statistics (numpy's default method).

Every percentile the toolkit prints (a measurement's p20/p80, a latency p50/p90/p99, the
clean ITL baseline) comes from ``quantile`` so two tables never disagree on a median::

    >>> quantile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    >>> quantile([10.0, 20.0, 30.0], 0.9)
    28.0
"""

from __future__ import annotations

import math


def quantile(xs, q: float, *, is_sorted: bool = False) -> float:
    """The ``q`` quantile (0..1) of ``xs``; NaN when ``xs`` is empty.

    Position (n - 1) x q, interpolated linearly between its neighbours: numpy.quantile's
    default ("linear"), so results match ``np.quantile`` exactly.
    """
    s = list(xs) if is_sorted else sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs, *, is_sorted: bool = False) -> float:
    return quantile(xs, 0.5, is_sorted=is_sorted)


# The interval every before/after comparison uses: the middle 60% (p20 to p80), like a measurement's spread.
INTERVAL = (0.2, 0.8)


def quantile_interval(xs, q: float, *, coverage: tuple = INTERVAL, is_sorted: bool = False) -> tuple:
    """(low, high): where the ``q`` quantile of the population behind ``xs`` lies with ``coverage``
    (default p20 to p80 of its sampling distribution), distribution-free.

    The number of samples under the true quantile is Binomial(n, q); the order statistics at
    that binomial's ``coverage`` quantiles bound it (widened to hold ``quantile(xs, q)`` itself).
    A bound that falls outside the samples is unknown: -inf or inf. Few samples cannot bound a
    high percentile: an upper bound for p90 needs 16 samples, for p99 161.

    >>> quantile_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.5)
    (4.0, 7.0)
    """
    s = list(xs) if is_sorted else sorted(xs)
    n = len(s)
    if not n:
        return (math.nan, math.nan)
    lo_p, hi_p = coverage
    lo_k, hi_k = _binomial_ppf(n, q, lo_p), _binomial_ppf(n, q, hi_p) + 1   # 1-based ranks
    est = quantile(s, q, is_sorted=True)
    lo = s[lo_k - 1] if lo_k >= 1 else -math.inf
    hi = s[hi_k - 1] if hi_k <= n else math.inf
    return (min(lo, est), max(hi, est))


def _binomial_ppf(n: int, q: float, p: float) -> int:
    """Smallest k with P(Binomial(n, q) <= k) >= p (summed in log space: n may be many thousands of gaps)."""
    if q <= 0:
        return 0
    if q >= 1:
        return n
    lq, l1q = math.log(q), math.log1p(-q)
    total = 0.0
    for k in range(n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q)
        if total >= p:
            return k
    return n
