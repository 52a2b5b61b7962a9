"""Rows of the report's tables, as (display text, sort key) cells: shared by HTML and markdown.

``point_rows(analysis, run)`` has one row per measurement (skipped ones included, with
their reason), from ``roofline.analysis.OpResult``; ``phase_rows(steps)`` one per step;
``ceiling_rows(header)`` the ceilings used next to the datasheet's. Text is plain here; the
HTML writer escapes it.
"""

from __future__ import annotations

import math
import re

from roofline import units as U
from roofline.analysis import ceilings

POINT_COLUMNS = ("run", "phase", "op", "batch", "context", "backend", "dtype", "count", "FLOPs", "bytes", "FLOP/byte",
                 "median", "p20", "p80", "FLOP/s", "bytes/s", "predicted", "roof %", "label", "flags")
PHASE_COLUMNS = ("phase", "batch", "context", "backend", "step time", "at the roof", "FLOP/byte", "ridge",
                 "roof %", "label", "by sum", "by mix", "compute-op time")
# the HTML's step table: every number a step's tooltip shows (the markdown keeps PHASE_COLUMNS)
STEP_COLUMNS = PHASE_COLUMNS[:5] + ("p20-p80", "dtype", "FLOPs", "bytes", "FLOP/s", "bytes/s") + PHASE_COLUMNS[5:]

# What a point's tooltip says, from its row's cells ({column}); a line whose cells are all empty is left out.
POINT_TIP = ("{op} · {phase} · {backend}\nbatch {batch} · context {context} · {dtype}\n"
             "{FLOPs} · {bytes} · {FLOP/byte} FLOP/byte\nmedian {median} (p20 {p20}, p80 {p80}) · count {count}\n"
             "{FLOP/s} · {bytes/s}\nroof {roof %} · {label}\nflags: {flags}\n{run}")
STEP_TIP = ("{phase} step · {backend} (its ops summed)\nbatch {batch} · context {context} · {dtype}\n"
            "step time {step time} (p20-p80 {p20-p80}); at the roof {at the roof}\n"
            "{FLOPs} · {bytes} · {FLOP/byte} FLOP/byte (ridge {ridge})\n{FLOP/s} · {bytes/s}\n"
            "roof {roof %} · {label} (by sum {by sum}, by mix {by mix})")


def tip_text(template: str, columns, row) -> str:
    """A tooltip from a row's cells, as the HTML's script writes it: each ``{column}`` of ``template`` replaced by
    its cell's text, a line whose cells are all empty ("", "-", "n/a") left out (the trace report's own SVG
    figures give each point this as its ``<title>``)."""
    cells = dict(zip(columns, (str(text).strip() for text, _ in row)))
    out = []
    for line in template.split("\n"):
        filled = [False]

        def cell(m):
            v = cells.get(m.group(1), "")
            filled[0] = filled[0] or v not in ("", "-", "n/a")
            return v
        text = re.sub(r"\{([^}]+)\}", cell, line)
        if filled[0]:
            out.append(text)
    return "\n".join(out)


def dtype_text(p) -> str:
    """'bf16', or 'bf16 w:int8 kv:fp8' when weights or KV cache differ from the activations."""
    return p.dtype + (f" w:{p.weight_dtype}" if p.weight_dtype != p.dtype else "") + \
        (f" kv:{p.kv_dtype}" if p.kv_dtype != p.dtype else "")


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
            (p.backend, p.backend), (dtype_text(p), dtype_text(p)), (str(r.count), r.count),
            (U.flops(p.cost.flops), p.cost.flops), (U.nbytes(p.cost.bytes), p.cost.bytes),
            (U.intensity(p.cost.intensity), p.cost.intensity),
            (U.seconds(m.median_s), _num(m.median_s)), (U.seconds(m.p20_s), _num(m.p20_s)),
            (U.seconds(m.p80_s), _num(m.p80_s)),
            (U.flops_rate(m.achieved_flops) if ok and p.cost.flops else "-", _num(m.achieved_flops)),
            (U.bandwidth(m.achieved_bytes_per_s) if ok else "-", _num(m.achieved_bytes_per_s)),
            (U.seconds(r.predicted_s), r.predicted_s), (U.percent(r.roof_fraction), _num(r.roof_fraction)),
            (r.label, r.label), (", ".join(flags), ", ".join(flags)),
        ]


def phase_rows(steps, columns=PHASE_COLUMNS) -> list[list[tuple[str, float | str]]]:
    """One row per step, with ``columns`` (PHASE_COLUMNS, or the HTML's STEP_COLUMNS)."""
    rows = []
    spread = "p20-p80" in columns
    for s in steps:
        lo, hi = s.time_range if spread else (math.nan, math.nan)
        flops_rate, bytes_rate = s.achieved_flops, s.achieved_bytes_per_s
        cells = {
            "phase": (s.phase + (f" k={s.drafts}" if s.drafts else ""), s.phase), "batch": (f"{s.batch:,}", s.batch),
            "context": (f"{s.context - s.drafts - 1 if s.drafts else s.context:,}", s.context),
            "backend": (s.backend, s.backend), "step time": (U.seconds(s.time_s), s.time_s),
            "p20-p80": (f"{U.seconds(lo)} - {U.seconds(hi)}", _num(lo)), "dtype": (dtype_text(s.key), dtype_text(s.key)),
            "FLOPs": (U.flops(s.cost.flops), s.cost.flops), "bytes": (U.nbytes(s.cost.bytes), s.cost.bytes),
            "FLOP/s": (U.flops_rate(flops_rate), _num(flops_rate)), "bytes/s": (U.bandwidth(bytes_rate), _num(bytes_rate)),
            "at the roof": (U.seconds(s.predicted_s), s.predicted_s),
            "FLOP/byte": (U.intensity(s.intensity), s.intensity), "ridge": (U.intensity(s.ridge), s.ridge),
            "roof %": (U.percent(s.roof_fraction), s.roof_fraction), "label": (s.verdict, s.verdict),
            "by sum": (s.bound_by_sum, s.bound_by_sum), "by mix": (s.bound_by_mix, s.bound_by_mix),
            "compute-op time": (U.percent(s.compute_time_share), s.compute_time_share),
        }
        rows.append([cells[c] for c in columns])
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
