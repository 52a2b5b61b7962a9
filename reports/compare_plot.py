"""The before/after roofline: an arrow from each op's and step's before point to its after point.

``plot_change(ax, comparison)`` draws, on the after file's ceilings (``roofline_plot.draw_ceilings``;
the before device's are added dashed when the files ran on different devices):

* each matched op with FLOPs, before as a hollow grey circle and after as a filled marker of its
  phase's shape coloured by its verdict (``roofline.verdicts.change``: faster green, slower red, no
  change grey), joined by an arrow of that colour; the ``MAX_ARROWS`` largest moves get arrows
  (all of a usual sweep), the rest keep their markers;
* each comparable step the same way, larger, with a thick arrow;
* the two largest step moves and the two largest op moves beyond the noise labelled with their
  speed-up (``reports.labels``).

A comparison with a side measured on a busy host (``Comparison.judged`` false) is not judged here either, as its
tables and findings say: every after marker grey, no speed-up labelled, "not judged" in the title and legend.

Every after point and step is registered with ``reports.hover`` as ("c", k) for
``comparison.ops[k]`` and ("t", j) for ``comparison.steps[j]``, so the compare report explains
each on hover from its table rows. Gids: "change:before", "change:after:<phase>", "arrows" and
"step-arrows" (annotations), "steps:before", "steps:after", "point-label:...".
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.lines import Line2D

from roofline.verdicts.change import FASTER, NOT_JUDGED, SLOWER

from . import hover
from .labels import place_labels
from .roofline_plot import STEP_SIZE, align_to_slope, clear_ridge_label, draw_ceilings
from .style import MEASURED_COLOR, PHASE_MARKER, styled

VERDICT_COLORS = {FASTER: "#2ca02c", SLOWER: "#d62728"}
SAME_COLOR = "#9a9a9a"
MAX_ARROWS = 400      # arrows are one artist each: past this many moves, the largest only
MAX_LABELS = 4
OP_SIZE = 26


def verdict_color(v: str) -> str:
    return VERDICT_COLORS.get(v, SAME_COLOR)


def _xy(r) -> tuple:
    """An op's roofline position: (intensity, FLOPs / instance time)."""
    return (r.m.intensity, r.m.achieved_flops)


def _step_xy(s) -> tuple:
    return (s.intensity, s.achieved_flops)


def _apart(b, a, dex: float = 0.01) -> bool:
    """Did a point move visibly (over ``dex`` decades on either log axis)?"""
    return any(abs(math.log10(y / x)) > dex for x, y in zip(b, a) if x > 0 and y > 0)


def _arrows(ax, pairs, colors, lw, gid):
    """An arrow from each before point to its after point (points of data coordinates)."""
    for (b, a), c in zip(pairs, colors):
        ax.annotate("", xy=a, xytext=b, gid=gid, zorder=3.5, annotation_clip=False,
                    arrowprops=dict(arrowstyle="-|>", color=c, lw=lw, mutation_scale=6 + 3 * lw, shrinkA=0,
                                    shrinkB=0)).set_in_layout(False)


@styled
def plot_change(ax, comparison, *, title: str | None = None):
    """Draw ``comparison`` (``roofline.verdicts.comparison.Comparison``) on ``ax``; returns ``ax``."""
    c = comparison
    verdict = c.verdict_of         # "not judged" throughout when a side ran on a busy host, as the tables say
    ops = [(k, o) for k, o in enumerate(c.ops) if o.before.point.cost.flops > 0 and o.after.point.cost.flops > 0
           and o.before.instance_s > 0 and o.after.instance_s > 0]
    steps = [(j, s) for j, s in enumerate(c.steps) if s.comparable and s.before.cost.flops > 0
             and s.after.cost.flops > 0 and s.before.time_s > 0 and s.after.time_s > 0]
    pts = [_xy(o.before) for _, o in ops] + [_xy(o.after) for _, o in ops] + \
        [_step_xy(s.before) for _, s in steps] + [_step_xy(s.after) for _, s in steps]
    header = c.after.header
    dtypes = sorted({o.after.point.compute_dtype for _, o in ops} | {header.dtype})
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    _, slope_labels = draw_ceilings(ax, header, dtypes, xs, ys)
    if c.before.header.device.name != header.device.name:
        bdev = c.before.header.device
        for d in dtypes:
            if d in bdev.peak_flops and bdev.bandwidth > 0:
                peak = bdev.peak_flops[d]
                lo = ax.get_xlim()[0]
                ax.plot([lo, peak / bdev.bandwidth, ax.get_xlim()[1]], [lo * bdev.bandwidth, peak, peak],
                        color="#bbbbbb", ls=":", lw=1.1, gid=f"ceiling:before:{d}")

    boxes = []
    moved = [ko for ko in ops if _apart(_xy(ko[1].before), _xy(ko[1].after))]   # a point that stayed: no arrow
    moved = sorted(moved, key=lambda ko: -abs(ko[1].time.saved))[:MAX_ARROWS]
    _arrows(ax, [(_xy(o.before), _xy(o.after)) for _, o in moved],
            [verdict_color(verdict(o.time)) for _, o in moved], 0.8, "arrows")
    if ops:
        b = np.array([_xy(o.before) for _, o in ops])
        ax.scatter(b[:, 0], b[:, 1], s=OP_SIZE, facecolors="none", edgecolors="#8a8a8a", linewidths=0.8, zorder=3,
                   gid="change:before")
        boxes.append((b[:, 0], b[:, 1], OP_SIZE))
    for phase, marker in PHASE_MARKER.items():
        sel = [(k, o) for k, o in ops if o.after.point.phase == phase]
        if not sel:
            continue
        a = np.array([_xy(o.after) for _, o in sel])
        ax.scatter(a[:, 0], a[:, 1], s=OP_SIZE, marker=marker, c=[verdict_color(verdict(o.time)) for _, o in sel],
                   edgecolors="white", linewidths=0.4, zorder=4, gid=f"change:after:{phase}")
        boxes.append((a[:, 0], a[:, 1], OP_SIZE))
        hover.register(ax, a[:, 0], a[:, 1], [("c", k) for k, _ in sel], hover.marker_radius(OP_SIZE))

    if steps:
        sb = np.array([_step_xy(s.before) for _, s in steps])
        sa = np.array([_step_xy(s.after) for _, s in steps])
        colors = [verdict_color(verdict(s.time)) for _, s in steps]
        _arrows(ax, list(zip(map(tuple, sb), map(tuple, sa))), colors, 2.0, "step-arrows")
        ax.scatter(sb[:, 0], sb[:, 1], s=STEP_SIZE, marker="o", facecolors="none", edgecolors="#777777",
                   linewidths=1.6, zorder=4.4, gid="steps:before")
        ax.scatter(sa[:, 0], sa[:, 1], s=STEP_SIZE, marker="o", c=colors, edgecolors=MEASURED_COLOR, linewidths=1.8,
                   zorder=4.5, gid="steps:after")
        boxes += [(sb[:, 0], sb[:, 1], STEP_SIZE), (sa[:, 0], sa[:, 1], STEP_SIZE)]
        hover.register(ax, sa[:, 0], sa[:, 1], [("t", j) for j, _ in steps], hover.marker_radius(STEP_SIZE),
                       priority=True)

    handles = [Line2D([], [], marker="o", ls="none", mfc="none", mec="#8a8a8a", ms=6, label="before")]
    if c.judged:
        handles += [Line2D([], [], marker="o", ls="none", color=verdict_color(FASTER), ms=6, label="after: faster"),
                    Line2D([], [], marker="o", ls="none", color=verdict_color(SLOWER), ms=6, label="after: slower"),
                    Line2D([], [], marker="o", ls="none", color=SAME_COLOR, ms=6, label="after: no change (noise)")]
    else:
        handles.append(Line2D([], [], marker="o", ls="none", color=verdict_color(NOT_JUDGED), ms=6,
                              label="after: not judged (host-busy)"))
    handles += [Line2D([], [], marker=PHASE_MARKER[p], ls="none", color="#555555", ms=6, label=p)
                for p in PHASE_MARKER if any(o.after.point.phase == p for _, o in ops)]
    if steps:
        handles.append(Line2D([], [], marker="o", ls="none", mfc="white", mec=MEASURED_COLOR, mew=1.8, ms=10,
                              label="step (its ops summed)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title((title or f"Before -> after: {c.after.header.model_name} on {header.device.name}")
                 + ("" if c.judged else "\nnot judged: measured on a busy machine (host-busy)"))
    align_to_slope(ax, slope_labels)
    clear_ridge_label(ax, boxes, relayout=not slope_labels)     # the ridge label clear of the peak labels
    labels = []
    by_size = lambda t: -abs(t[0].time.saved)  # noqa: E731
    big = sorted([(s, True) for _, s in steps if verdict(s.time) in (FASTER, SLOWER)], key=by_size)[:MAX_LABELS // 2]
    big += sorted([(o, False) for _, o in ops if verdict(o.time) in (FASTER, SLOWER)], key=by_size)[:MAX_LABELS // 2]
    for x, is_step in big:
        xy = _step_xy(x.after) if is_step else _xy(x.after)
        what = f"{x.phase} step {x.after.where}" if is_step else x.title
        text = f"{what}: {_short(x.time)}"
        labels.append((f"{'step' if is_step else 'op'}:{what}", xy, text, verdict_color(verdict(x.time))))
    place_labels(ax, labels, boxes, relayout=False)
    return ax


def _short(ch) -> str:
    x = ch.speedup
    if math.isnan(x):
        return "n/a"
    return f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower"
