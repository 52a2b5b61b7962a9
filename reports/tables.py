"""Rows of the report's tables, as (display text, sort key) cells: shared by HTML and markdown.

``point_rows(analysis, run)`` has one row per measurement (skipped ones included, with
their reason), from ``roofline.analysis.OpResult``; ``phase_rows(steps)`` one per step;
``ceiling_rows(header)`` the ceilings used next to the datasheet's. Text is plain here; the
HTML writer escapes it.
"""

from __future__ import annotations

import math

from roofline import units as U
from roofline.analysis import ceilings

POINT_COLUMNS = ("run", "phase", "op", "batch", "context", "backend", "count", "FLOPs", "bytes", "FLOP/byte",
                 "median", "p20", "p80", "FLOP/s", "bytes/s", "predicted", "roof %", "label", "flags")
PHASE_COLUMNS = ("phase", "batch", "context", "backend", "step time", "at the roof", "FLOP/byte", "ridge",
                 "roof %", "label", "by sum", "by mix", "compute-op time")


def _num(x) -> float:
    return -math.inf if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def point_rows(analysis, run: str):
    """Yield one row per measurement, in file order (a generator: a 20,000-point file's rows are
    rendered as they are made, never all held at once)."""
    for r in analysis.results:
        p, m = r.point, r.m
        ok = r.ok
        flags = list(r.flags)
        if not ok:
            flags.append(f"{m.status}: {m.reason}" if m.reason else m.status)
        yield [
            (run, run), (p.phase, p.phase), (p.op, p.op), (f"{p.batch:,}", p.batch), (f"{p.context:,}", p.context),
            (p.backend, p.backend), (str(r.count), r.count),
            (U.flops(p.cost.flops), p.cost.flops), (U.nbytes(p.cost.bytes), p.cost.bytes),
            (U.intensity(p.cost.intensity), p.cost.intensity),
            (U.seconds(m.median_s), _num(m.median_s)), (U.seconds(m.p20_s), _num(m.p20_s)),
            (U.seconds(m.p80_s), _num(m.p80_s)),
            (U.flops_rate(m.achieved_flops) if ok and p.cost.flops else "-", _num(m.achieved_flops)),
            (U.bandwidth(m.achieved_bytes_per_s) if ok else "-", _num(m.achieved_bytes_per_s)),
            (U.seconds(r.predicted_s), r.predicted_s), (U.percent(r.roof_fraction), _num(r.roof_fraction)),
            (r.label, r.label), (", ".join(flags), ", ".join(flags)),
        ]


def phase_rows(steps) -> list[list[tuple[str, float | str]]]:
    rows = []
    for s in steps:
        rows.append([
            (s.phase, s.phase), (f"{s.batch:,}", s.batch), (f"{s.context:,}", s.context), (s.backend, s.backend),
            (U.seconds(s.time_s), s.time_s), (U.seconds(s.predicted_s), s.predicted_s),
            (U.intensity(s.intensity), s.intensity), (U.intensity(s.ridge), s.ridge),
            (U.percent(s.roof_fraction), s.roof_fraction), (s.label, s.label), (s.bound_by_sum, s.bound_by_sum),
            (s.bound_by_mix, s.bound_by_mix), (U.percent(s.compute_time_share), s.compute_time_share),
        ])
    return rows


def ceiling_rows(header, dtypes=None) -> list[tuple[str, str, str, str]]:
    """(ceiling, used with its source, datasheet, used / datasheet) per bandwidth and peak
    (peaks of ``dtypes`` only, when given)."""
    used, sheet = ceilings(header, dtypes)
    ref = {(c.kind, c.dtype): c for c in sheet}
    out = []
    for c in used:
        name = "memory bandwidth" if c.kind == "bandwidth" else f"{c.dtype} peak"
        d = ref.get((c.kind, c.dtype))
        ratio = U.percent(c.value / d.value) if d and d.value else "-"
        out.append((name, f"{U.si(c.value, c.unit)} ({c.source})", U.si(d.value, d.unit) if d else "-", ratio))
    return out
