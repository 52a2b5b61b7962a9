"""A trace's measured-against-predicted chart as an SVG of our own (``reports.svg``), without matplotlib.

``predicted_svg(rf, run)`` draws what ``reports.time_plot.plot_predicted_vs_measured`` and
``reports.figures.predicted_figure`` draw for a trace, from the same data (``roof_points.predicted``): each op's
mean instance time against the time its roof allows (``OpResult.predicted_s``), marker shape = phase, colour = op
category; points above their roof circled in red; the y = x line (at the roof) and the line at 1 / 25% of it
(``roofline.bounds.OVERHEAD_FRACTION``: overhead above), their labels along them; both axes over the same whole
decades (``roof_points.EDGE_PAD`` inside the limits), ticks labelled "1 us", "10 us"; the legend of op categories
outside the plot, on the right. Each point carries a ``<title>`` and a ``reports.hover.Mark``. Groups carry the
matplotlib figure's gids ("pred:decode", "pred-above-roof", "pred:roof", "pred:overhead", "pred-label:roof").
"""

from __future__ import annotations

import math

from roofline import units as U
from roofline.analysis import analyze
from roofline.bounds import OVERHEAD_FRACTION

from . import hover
from .palette import ABOVE_ROOF_COLOR, MEASURED_COLOR, PHASE_MARKER, category_color, category_legend
from .roof_points import EDGE_PAD, predicted
from .svg import (LABEL_SIZE, Axes, Entry, LogScale, Svg, box_quad, covers, fitting_stride, inside, legend,
                  legend_size, log_ticks, text_box, text_extent, text_quad, text_width, tick_band, tick_width,
                  title_height)
from .tables import POINT_COLUMNS, POINT_TIP, point_rows, tip_text

WIDTH, HEIGHT = 547.2, 446.4      # points: the matplotlib figure's 7.6 x 6.2 inches
MARGIN = 6.0
POINT_AREA, ABOVE_AREA = 30, 110  # pt^2
OVERHEAD_DASH = (3.7, 1.6)        # matplotlib's "--", in line widths
TITLE = "Measured against predicted time per op"


def limits(ok) -> tuple:
    """Whole decades holding every point, padded by EDGE_PAD: a point at a power of ten stays inside."""
    lo = min(min(r.predicted_s, r.instance_s) for r in ok)
    hi = max(max(r.predicted_s, r.instance_s) for r in ok)
    return 10 ** math.floor(math.log10(lo / EDGE_PAD)), 10 ** math.ceil(math.log10(hi * EDGE_PAD))


def _along(svg, ax, x, ratio, offset, text, color, va, angle, markers, gid) -> None:
    """A diagonal's label along its line (y = ``ratio`` x), starting at data x ``x`` and ``offset`` points off it:
    there, or slid along the line (x 2 a step, up then down) to the nearest place inside the axes where it covers
    no marker (``markers``: corner lists); there when none is free."""
    def at(v):
        px, py = ax.px(v, v * ratio)
        return px + offset[0], py + offset[1]

    for pick in [x] + [x * f for k in range(1, 8) for f in (2 ** k, 2 ** -k)]:
        px, py = at(pick)
        if inside(text_box(px, py, text, 7.5, "left", va, angle), ax.box) and not covers(
                text_quad(px, py, text, 7.5, "left", va, angle), markers):
            break
    else:
        px, py = at(x)
    svg.text(px, py, text, 7.5, color, ha="left", va=va, rotation=angle, gid=gid)


def predicted_svg(rf, run: str) -> tuple:
    """(SVG text, [hover.Mark]) of a trace's predicted-vs-measured chart (it has points: ``predicted(a)``)."""
    a = analyze(rf)
    ok = predicted(a)
    lo, hi = limits(ok)
    svg = Svg(WIDTH, HEIGHT)
    entries = [Entry(c, "patch", col) for c, col in category_legend(r.m.config.get("category", "") for r in ok)]
    lw, lh = legend_size(entries, "op category")

    top = MARGIN + title_height(TITLE)
    bottom = HEIGHT - MARGIN - text_extent("x", LABEL_SIZE)[1] - 4 - tick_band(["1"])
    dec, _ = log_ticks(lo, hi)
    yscale = LogScale(lo, hi, bottom, top)
    ystride = fitting_stride(dec, [U.seconds(v) for v in dec], yscale, 8.0, vertical=True)
    ymaj, ymin = log_ticks(lo, hi, ystride)
    left = MARGIN + text_extent("x", LABEL_SIZE)[1] + 4 + tick_width([U.seconds(v) for v in ymaj])
    right = WIDTH - MARGIN - lw - 8 - text_width(U.seconds(dec[-1]), 8.0) / 2
    xscale = LogScale(lo, hi, left, right)
    xstride = fitting_stride(dec, [U.seconds(v) for v in dec], xscale, 8.0, vertical=False)
    xmaj, xmin = log_ticks(lo, hi, xstride)
    ax = Axes(svg, (left, top, right, bottom), xscale, yscale)
    angle = math.degrees(math.atan2(-yscale.per_decade, xscale.per_decade))

    ax.grid(xmaj, ymaj)
    with svg.group("diagonals", clip=ax.clip):
        svg.line(*ax.px(lo, lo), *ax.px(hi, hi), MEASURED_COLOR, 1.2, gid="pred:roof")
        svg.line(*ax.px(lo, lo / OVERHEAD_FRACTION), *ax.px(hi, hi / OVERHEAD_FRACTION), "#999999", 1.0,
                 OVERHEAD_DASH, gid="pred:overhead")
    index = hover.result_index(a)
    rows = list(point_rows(a, run))
    bounded = len(ok) > hover.HOVER_MAX
    marks, markers = [], []          # markers: (x, y, radius) for the diagonals' labels to keep off
    for phase, shape in PHASE_MARKER.items():
        sel = [r for r in ok if r.point.phase == phase]
        if not sel:
            continue
        with svg.group(f"pred:{phase}", clip=ax.clip):
            for r in sel:
                x, y = ax.px(r.predicted_s, r.instance_s)
                i = index[id(r)]
                titled = not bounded or r.above_roof
                svg.marker(shape, x, y, math.sqrt(POINT_AREA), category_color(r.m.config.get("category", "")),
                           "#ffffff", 0.3, 0.9, title=tip_text(POINT_TIP, POINT_COLUMNS, rows[i]) if titled else None)
                markers.append((x, y, math.sqrt(POINT_AREA) / 2))
                if titled and ax.holds(x, y):
                    marks.append(hover.Mark("p", i, round(x, 2), round(y, 2), hover.MIN_RADIUS, bounded))
    above = [r for r in ok if r.above_roof]
    if above:
        with svg.group("pred-above-roof", clip=ax.clip):
            for r in above:
                x, y = ax.px(r.predicted_s, r.instance_s)
                svg.marker("o", x, y, math.sqrt(ABOVE_AREA), "none", ABOVE_ROOF_COLOR, 1.3)
                markers.append((x, y, math.sqrt(ABOVE_AREA) / 2))
    quads = [box_quad((x - r, y - r, x + r, y + r)) for x, y, r in markers]
    _along(svg, ax, lo * 30, 1.0, (3, 3), "at the roof: measured = predicted", MEASURED_COLOR, "top", angle, quads,
           "pred-label:roof")
    _along(svg, ax, lo * 3, 1 / OVERHEAD_FRACTION, (-3, -3), f"{U.percent(OVERHEAD_FRACTION)} of roof: overhead above",
           "#808080", "bottom", angle, quads, "pred-label:overhead")
    ax.xticks(xmaj, [U.seconds(v) for v in xmaj], xmin)
    ax.yticks(ymaj, [U.seconds(v) for v in ymaj], ymin)
    ax.spines()
    ax.xlabel("predicted time at the roof (per instance)", tick_band(xmaj) + 4)
    ax.ylabel("measured median time (per instance)", MARGIN)
    ax.title(TITLE)
    legend(svg, entries, WIDTH - MARGIN - lw, (top + bottom) / 2 - lh / 2, title="op category", frame=False)
    return svg.to_string(), hover.bounded(marks)
