"""Rows of the compare report's tables, as (display text, sort key) cells: shared by HTML and markdown.

``step_rows(c)`` one row per matched step, ``op_rows(c)`` one per matched op (both in the
comparison's order: largest time saved or lost per step first), ``latency_rows(c)`` one per
configuration, metric and percentile. Every number comes from ``roofline.verdicts.comparison`` (which takes
them from ``roofline.analysis``); text is plain here, the HTML writer escapes it.
"""

from __future__ import annotations

import math

from roofline import units as U
from roofline.verdicts.change_rules import step_outcome

from .tables import dtype_text

STEP_COLUMNS = ("phase", "batch", "context", "backend", "before", "after", "saved per step", "speed-up", "range",
                "verdict", "bytes down", "predicted", "vs prediction", "roof %", "label", "ops differ")
OP_COLUMNS = ("phase", "op", "batch", "context", "backend", "dtype", "count", "before", "after", "saved per step",
              "speed-up", "range", "verdict", "median before", "median after", "roof %", "label")
LATENCY_COLUMNS = ("configuration", "metric", "percentile", "before", "after", "speed-up", "range", "verdict",
                   "requests")

OP_TIP = ("{op} · {phase} · {backend}\nbatch {batch} · context {context} · {dtype} · count {count}\n"
          "per step {before} -> {after} (saved {saved per step})\nspeed-up {speed-up} (range {range}) · {verdict}\n"
          "median {median before} -> {median after}\nroof {roof %} · {label}")
STEP_TIP = ("{phase} step · {backend} (its ops summed)\nbatch {batch} · context {context}\n"
            "step time {before} -> {after} (saved {saved per step})\nspeed-up {speed-up} (range {range}) · {verdict}\n"
            "bytes down {bytes down}; the roofline predicted {predicted}: {vs prediction}\nroof {roof %} · {label}\n"
            "ops differ: {ops differ}")


def _x(v: float) -> tuple:
    return ("n/a", -math.inf) if v is None or math.isnan(v) else (f"{v:.2f}x", v)


def _range(ch) -> tuple:
    lo, hi = ch.interval
    if not ch.bounded:
        return ("unbounded", math.inf)
    return (f"{lo:.2f}-{hi:.2f}x", lo)


def _arrow(a: str, b: str) -> str:
    return a if a == b else f"{a} -> {b}"


def _saved(ch) -> tuple:
    """Time saved per step; negative when lost ('-534 us')."""
    return (U.seconds(ch.saved) if ch.saved else "0", ch.saved)


def step_rows(c):
    for s in c.steps:
        k, ch = s.after.key, s.time
        v = c.verdict_of(ch) if s.comparable else s.verdict      # "not judged" on a busy side, as the chart says
        diff = "; ".join(x for x in ((f"only before: {', '.join(s.only_before)}" if s.only_before else ""),
                                     (f"only after: {', '.join(s.only_after)}" if s.only_after else "")) if x)
        yield [(k.phase, k.phase), (f"{k.batch:,}", k.batch), (f"{k.context:,}", k.context),
               (_arrow(s.before.backend, k.backend), k.backend),
               (U.seconds(ch.before), ch.before), (U.seconds(ch.after), ch.after), _saved(ch), _x(ch.speedup),
               _range(ch), (v, v), _x(s.bytes_ratio), _x(s.predicted_speedup),
               (step_outcome(s), step_outcome(s)),
               (_arrow(U.percent(s.before.roof_fraction), U.percent(s.after.roof_fraction)), s.after.roof_fraction),
               (_arrow(s.before.label, s.after.label), s.after.label), (diff, diff)]


def op_rows(c):
    for o in c.ops:
        b, a, ch = o.before, o.after, o.time
        p = a.point
        dt = _arrow(dtype_text(b.point), dtype_text(p))
        count = _arrow(f"{b.count:g}", f"{a.count:g}")
        yield [(p.phase, p.phase), (p.op, p.op), (f"{p.batch:,}", p.batch), (f"{p.context:,}", p.context),
               (_arrow(b.point.backend, p.backend), p.backend), (dt, dt), (count, a.count),
               (U.seconds(ch.before), ch.before), (U.seconds(ch.after), ch.after), _saved(ch), _x(ch.speedup),
               _range(ch), (c.verdict_of(ch), c.verdict_of(ch)), (U.seconds(b.instance_s), b.instance_s),
               (U.seconds(a.instance_s), a.instance_s),
               (_arrow(U.percent(b.roof_fraction), U.percent(a.roof_fraction)), _num(a.roof_fraction)),
               (_arrow(b.label, a.label), a.label)]


def latency_rows(c):
    for x in c.latency:
        ch = x.change
        yield [(x.config, x.config), (x.metric, x.metric), (x.pct, x.pct), (U.ms(ch.before), ch.before),
               (U.ms(ch.after), ch.after), _x(ch.speedup), _range(ch), (c.verdict_of(ch), c.verdict_of(ch)),
               (f"{x.n_before} -> {x.n_after}", x.n_after)]


def _num(x) -> float:
    return -math.inf if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def unmatched_lines(c) -> list:
    """Plain sentences: points only in one file, points skipped on one side, steps only in one file."""
    out = []
    for what, rs in (("only before", c.only_before), ("only after", c.only_after)):
        if rs:
            out.append(f"{len(rs)} point(s) {what}: " + ", ".join(
                f"{r.point.phase} {r.op} b{r.point.batch} c{r.point.context} {r.point.backend}" for r in rs[:40])
                + (" ..." if len(rs) > 40 else ""))
    if c.skipped:
        out.append(f"{len(c.skipped)} point(s) skipped on one side, not compared: " + ", ".join(
            f"{b.point.phase} {b.op} b{b.point.batch} c{b.point.context} (skipped "
            f"{'before' if not b.ok else 'after'}: {(b if not b.ok else a).m.reason or 'skipped'})"
            for _, b, a in c.skipped[:20]))
    for what, ss in (("only before", c.steps_only_before), ("only after", c.steps_only_after)):
        if ss:
            out.append(f"{len(ss)} step(s) {what}: " + ", ".join(f"{s.phase} {s.where}" for s in ss[:20]))
    return out
