"""Latency before and after: TTFT, TPOT and ITL percentiles of matched configurations (pure).

``latency_changes(before_rf, after_rf, notes)`` pairs the configurations of two latency files
(``roofline.latency.latency_runs``: the one reading of requests) by name; when each file holds
one configuration and their names differ (``chunk=16`` against ``chunk=64``), those two are the
change under test and are paired, with a note. Per metric and percentile (p50, p90, p99) it
returns a ``roofline.verdicts.change.Change``: the percentile from each run's summary, and its range
from ``roofline.stats.quantile_interval`` over the run's own requests (p20-p80 of where that
percentile lies: few requests give a wide range, and a p99 of eight requests cannot be told
apart from its neighbours). The same noise rule as kernel times then says faster, slower or
no change. Speed-up = before / after, so a TTFT that halves is 2.00x faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..latency import QUANTILES, latency_runs
from ..stats import quantile_interval
from .change import Change

METRICS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"))


@dataclass(frozen=True)
class LatencyChange:
    config: str       # the configuration ("before -> after" when the names differ)
    metric: str       # "TTFT" | "TPOT" | "ITL"
    pct: str          # "p50" | "p90" | "p99"
    change: Change    # before and after, with their ranges
    n_before: int     # values the percentile is taken over (requests; gaps for ITL)
    n_after: int


def metric_values(run, name: str) -> list:
    """The values behind a run's summary statistic ``name`` (the ok requests', as ``summarize`` takes them)."""
    ok = [t for t in run.timelines if t.ok]
    if name == "ttft":
        xs = [t.ttft for t in ok]
    elif name == "tpot":
        xs = [t.tpot for t in ok]
    else:
        xs = [g for t in ok for g in t.itls]
    return sorted(x for x in xs if not math.isnan(x))


def pair_configs(before_runs, after_runs, notes: list) -> list:
    """[(label, before run, after run)] by configuration name; see the module docstring."""
    after = {r.config: r for r in after_runs}
    pairs = [(r.config, r, after[r.config]) for r in before_runs if r.config in after]
    if not pairs and len(before_runs) == 1 and len(after_runs) == 1:
        b, a = before_runs[0], after_runs[0]
        notes.append(f"The latency configurations differ ({b.config} -> {a.config}): compared as the change under "
                     "test.")
        return [(f"{b.config} -> {a.config}", b, a)]
    names = {c for c, _, _ in pairs}
    lone_b = [r.config for r in before_runs if r.config not in names]
    lone_a = [r.config for r in after_runs if r.config not in names]
    if lone_b:
        notes.append(f"Latency configuration(s) only before: {', '.join(lone_b)}.")
    if lone_a:
        notes.append(f"Latency configuration(s) only after: {', '.join(lone_a)}.")
    return pairs


def latency_changes(before_rf, after_rf, notes: list) -> list:
    """[LatencyChange] for every paired configuration, metric and percentile with values on both sides."""
    out = []
    for label, b, a in pair_configs(latency_runs(before_rf), latency_runs(after_rf), notes):
        for metric, name in METRICS:
            xb, xa = metric_values(b, name), metric_values(a, name)
            if not xb or not xa:
                continue
            sb, sa = getattr(b.summary, name), getattr(a.summary, name)
            for pct, q in QUANTILES:
                ch = Change(sb[pct], sa[pct], quantile_interval(xb, q, is_sorted=True),
                            quantile_interval(xa, q, is_sorted=True))
                out.append(LatencyChange(label, metric, pct, ch, len(xb), len(xa)))
    return out
