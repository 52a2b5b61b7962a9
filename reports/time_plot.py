"""Where the time goes, and measured against predicted time.

* ``plot_time_breakdown(ax, rf, phase)``: one bar per step of the sweep
  (``roofline.analysis.Step``), each op's share of the measured step time stacked (count x
  median; the ``layer`` op is left out unless it stands in for the step), the step's total
  written above the bar; a step timed on a busy host is marked "unreliable" under its bar and a
  busy run's title carries the table's warning (``reports.labels.busy_line``).
* ``plot_predicted_vs_measured(ax, rf)``: each op instance's median time against the time
  the roofline allows with the file's ceilings (``OpResult.predicted_s``); the diagonal is
  the roof, the line at 4x is the overhead threshold (25% of roof); their labels follow the lines
  as laid out (``align_diagonals``: no fixed aspect, which the constrained layout cuts the y label for).

``rf`` is a ``ResultFile`` or its ``roofline.analysis.RunAnalysis``.
"""

from __future__ import annotations

import math
import numpy as np
from matplotlib.collections import PolyCollection

from roofline import units as U
from roofline.analysis import analyze
from roofline.bounds import OVERHEAD_FRACTION

from . import hover
from .labels import busy_line
from .roof_points import EDGE_PAD, predicted  # noqa: F401
from .roofline_plot import align_to_slope
from .style import (ABOVE_ROOF_COLOR, MAX_BAR_LABELS, PHASE_MARKER, RASTER_ABOVE, category_color, log_log, op_color,
                    op_names, run_model, styled)


def step_times(result_file, phase: str) -> tuple[list, dict]:
    """(the phase's steps in table order, {step: {op: count x median seconds}})."""
    steps = analyze(result_file).phase_steps(phase)
    per = {s: {r.op: r.time_s for r in s.ops} for s in steps}
    return steps, per


def step_label(s, several_backends: bool) -> str:
    k = s.key
    return (f"b{k.batch}\n{k.context:,}" + (f"+{k.cached:,}" if k.cached else "")
            + (f"\n{k.backend}" if several_backends else "") + (f"\ntp{k.tp}" if k.tp > 1 else "")
            + (f" ep{k.ep}" if k.ep > 1 else "") + "".join(f"\n{n}:{v}" for n, v in (("w", k.weight_dtype), ("kv", k.kv_dtype)) if v != k.dtype)
            + ("" if s.reliable else "\nunreliable"))   # its verdict withheld, as in the table


@styled
def plot_time_breakdown(ax, result_file, phase: str):
    """Stacked share of step time per op across the sweep; returns ``ax``."""
    keys, per = step_times(result_file, phase)
    model = run_model(result_file)
    ops = [o for o in op_names(model) if any(o in per[k] for k in keys)]
    x = np.arange(len(keys))
    bottom = np.zeros(len(keys))
    totals = np.array([sum(per[k].values()) for k in keys])
    raster = len(keys) * len(ops) > RASTER_ABOVE
    for op in ops:
        share = np.array([per[k].get(op, 0.0) for k in keys]) / np.where(totals > 0, totals, 1)
        # one PolyCollection per op (not a Rectangle per bar): 100 steps x 18 ops stay fast
        verts = [[(xi - 0.4, b), (xi + 0.4, b), (xi + 0.4, b + h), (xi - 0.4, b + h)]
                 for xi, b, h in zip(x, bottom, share)]
        ax.add_collection(PolyCollection(verts, facecolors=[op_color(op, model)], edgecolors="white", linewidths=0.3,
                                         label=op, gid=f"time:{phase}:{op}", rasterized=raster))
        bottom += share
    every = max(1, -(-len(keys) // MAX_BAR_LABELS))     # too many bars to label each: every n-th one
    for xi, t in list(zip(x, totals))[::every]:
        ax.text(xi, 1.01, U.seconds(t), ha="center", va="bottom", fontsize=7, rotation=90 if len(keys) > 12 else 0)
    several = len({k.backend for k in keys}) > 1
    ax.set_xticks(x[::every])
    ax.set_xticklabels([step_label(k, several) for k in keys[::every]], fontsize=7)
    ax.set_xlim(-0.6, len(keys) - 0.4)
    ax.set_ylim(0, 1.12 if len(keys) <= 12 else 1.25)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}" if v <= 1.0001 else "")
    ax.set_ylabel("share of measured step time")
    ax.set_xlabel("batch, context" if phase == "decode" else "batch, prompt tokens")
    ax.set_title(f"{phase}: where the step time goes (total above "
                 + ("each bar)" if every == 1 else f"every {every}th bar; {len(keys)} steps)")
                 + busy_line(analyze(result_file), keys))
    ax.grid(axis="x", visible=False)
    return ax


@styled
def plot_predicted_vs_measured(ax, result_file, *, align: bool = True):
    """Measured (median; a trace's mean) vs roofline-predicted time per op instance; returns ``ax``. ``align``
    False: the caller adds what moves the axes (a legend) and aligns the diagonals' labels itself
    (``align_diagonals``), so the layout is solved once.

    Ops kept off the roofline (uncosted, collectives) and ops that move nothing (a view: 0 s at
    the roof) have no prediction to compare with and are left out."""
    a = analyze(result_file)
    index = hover.result_index(a)
    ok = predicted(a)
    trace = a.header.kind == "trace"     # a trace's ops are coloured by category, as on its roofline
    raster = len(ok) > RASTER_ABOVE
    lo, hi = math.inf, 0.0
    for phase, marker in PHASE_MARKER.items():
        sel = [r for r in ok if r.point.phase == phase]
        if not sel:
            continue
        xs = np.array([r.predicted_s for r in sel])
        ys = np.array([r.instance_s for r in sel])
        color = (lambda r: category_color(r.m.config.get("category", ""))) if trace else (lambda r: op_color(r.op, run_model(result_file)))
        ax.scatter(xs, ys, c=[color(r) for r in sel], marker=marker, s=18 if not trace else 30, edgecolors="white",
                   linewidths=0.3, alpha=0.9, zorder=3, gid=f"pred:{phase}", rasterized=raster)
        keep = [i for i, r in enumerate(sel) if not raster or r.above_roof]   # bounded for large files
        hover.register(ax, xs[keep], ys[keep], [("p", index[id(sel[i])]) for i in keep], priority=raster)
        lo, hi = min(lo, xs.min(), ys.min()), max(hi, xs.max(), ys.max())
    above = [r for r in ok if r.above_roof]
    if above:
        ax.scatter([r.predicted_s for r in above], [r.instance_s for r in above], s=110, facecolors="none",
                   edgecolors=ABOVE_ROOF_COLOR, linewidths=1.3, zorder=4, gid="pred-above-roof")
    if hi == 0:
        return ax
    # whole decades, padded: a point at exactly a power of ten stays inside the axes, its marker whole
    lo, hi = 10 ** math.floor(math.log10(lo / EDGE_PAD)), 10 ** math.ceil(math.log10(hi * EDGE_PAD))
    ref = np.array([lo, hi])
    ax.plot(ref, ref, color="#222222", lw=1.2, gid="pred:roof")
    ax.plot(ref, ref / OVERHEAD_FRACTION, color="#999999", lw=1.0, ls="--", gid="pred:overhead")
    ax.annotate("at the roof: measured = predicted", (lo * 30, lo * 30), rotation=45, fontsize=7.5, ha="left",
                va="top", rotation_mode="anchor", xytext=(3, -3), textcoords="offset points", gid="pred-label:roof")
    ax.annotate(f"{U.percent(OVERHEAD_FRACTION)} of roof: overhead above", (lo * 3, lo * 3 / OVERHEAD_FRACTION),
                rotation=45, fontsize=7.5, color="#808080", ha="left", va="bottom", rotation_mode="anchor",
                xytext=(-3, 3), textcoords="offset points", gid="pred-label:overhead")
    log_log(ax)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(lambda v, _: U.seconds(v))
    ax.set_xlabel("predicted time at the roof (per instance)")
    ax.set_ylabel("measured median time (per instance)")
    ax.set_title("Measured against predicted time per op")
    # no fixed aspect (the constrained layout cuts a fixed-aspect axes' y label off the figure): the labels are
    # turned along their diagonals as drawn (again by the caller once it adds a legend: ``align_diagonals``)
    if align:
        align_diagonals(ax, final=False)
    return ax


def align_diagonals(ax, *, final: bool = True):
    """Turn the predicted-vs-measured diagonals' labels (gid "pred-label:...") along their lines as laid out (the
    layout kept unless ``final`` is False: ``roofline_plot.align_to_slope``)."""
    align_to_slope(ax, [t for t in ax.texts if (t.get_gid() or "").startswith("pred-label:")], final=final)
