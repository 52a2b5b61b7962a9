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
