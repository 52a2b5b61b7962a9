"""Unit formatting at the edge: everything inside is SI base units (FLOP, byte, second)."""

from __future__ import annotations

import math

_PREFIX = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]


def si(x: float, unit: str, digits: int = 3) -> str:
    """si(3.35e12, 'B/s') -> '3.35 TB/s'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == math.inf:
        return "inf"
    ax = abs(x)
    for scale, p in _PREFIX:
        if ax >= scale:
            return f"{x / scale:.{digits}g} {p}{unit}"
    return f"{x:.{digits}g} {unit}"


def flops(x: float) -> str:
    return si(x, "FLOP")


def flops_rate(x: float) -> str:
    return si(x, "FLOP/s")


def nbytes(x: float) -> str:
    return si(x, "B")


def bandwidth(x: float) -> str:
    return si(x, "B/s")


def seconds(x: float) -> str:
    """seconds(0.000123) -> '123 us'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    ax = abs(x)
    if ax >= 1:
        return f"{x:.3g} s"
    if ax >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    if ax >= 1e-6:
        return f"{x * 1e6:.3g} us"
    return f"{x * 1e9:.3g} ns"


def intensity(x: float) -> str:
    if x == math.inf:
        return "inf"
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def percent(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def ms(x: float) -> str:
    """Seconds as milliseconds for latency tables: '105.0 ms', '0.250 ms'; 'undefined' for NaN/None."""
    if x is None or math.isnan(x):
        return "undefined"
    return f"{x * 1e3:.3f} ms" if 0 < abs(x) < 1e-3 else f"{x * 1e3:.1f} ms"
