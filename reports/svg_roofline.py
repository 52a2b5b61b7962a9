"""A trace's roofline as an SVG of our own (``reports.svg``), without matplotlib (rendering only).

``roofline_svg(rf, run)`` draws what ``reports.roofline_plot.plot_roofline`` draws for a trace (header kind
"trace"), from the same data: the roofs, ridge and limits of ``reports.roof_geometry.roof_chart``; one point per
traced op and shape (``roof_points.plotted``) at (intensity, achieved FLOP/s), marker shape = phase, colour = op
category (``palette.CATEGORY_COLORS``), area = share of the traced time, p20-p80 error bars; each phase step
(``roof_points.step_markers``) as a large white marker with a black edge; points above their roof circled in red;
the callouts (``roof_points.point_labels``: above-roof points, the headline steps' verdicts) each at the first of
``CALLOUT_SPOTS`` that stays inside the axes and touches no marker and no other text (nor, where a spot is free of
them, a roof line); the ridge label at the first
of ``RIDGE_SPOTS`` clear of the other texts and the legend (and, where one is free of them, of the markers); a
bandwidth roof's label slid along its slope off the markers. The legend sits in the lower right corner.

Every point and step carries a ``<title>`` (the HTML table row's tooltip text, ``tables.tip_text``) and a
``reports.hover.Mark`` at its centre, which ``reports.html`` lays over the chart (beyond ``hover.HOVER_MAX``
ordinary points only the steps and above-roof points). Groups carry the matplotlib figure's gids ("points:decode",
"steps:decode", "above-roof", "errorbars:decode", "ceiling:bandwidth:used", "ridge:bf16", "ridge-label:bf16",
"point-label:...").
"""

from __future__ import annotations

import math

from roofline import units as U
from roofline.analysis import analyze

from . import hover
from .labels import OFFSETS, PAD, busy_line
from .palette import ABOVE_ROOF_COLOR, MEASURED_COLOR, PHASE_MARKER, category_color, category_legend
from .roof_geometry import DASHES, roof_chart
from .roof_points import RIDGE_SPOTS, STEP_SIZE, ceilings_said, plotted, point_labels, ridge_text, step_markers
from .svg import (BOX_PAD, LABEL_SIZE, LEGEND_SIZE, Axes, Entry, LogScale, Svg, fitting_stride, grow, inside, leader,
                  box_quad, covers, legend, legend_size, log_ticks, overlaps, segment_hits_box, text_box, text_extent,
                  text_quad, text_width, tick_band, tick_width, title_height)
from .tables import POINT_COLUMNS, POINT_TIP, STEP_COLUMNS, STEP_TIP, phase_rows, point_rows, tip_text

WIDTH, HEIGHT = 720.0, 460.8      # points: the matplotlib figure's 10 x 6.4 inches
MARGIN = 6.0
ABOVE_SIZE = 150                  # pt^2: the red ring around a point above its roof
ERROR_COLOR = "#9a9a9a"
LABEL_FONT = 7.5
RIDGE_MARKER = 7.0                # points
# where a callout may sit around its point, nearest first: labels.OFFSETS (what the matplotlib roofline tries), then
# two rings further out (a long label beside a crowded point)
CALLOUT_SPOTS = OFFSETS + [(r * math.cos(math.radians(a)), r * math.sin(math.radians(a)))
                           for r in (84, 112) for a in (45, 135, -45, -135, 90, -90, 0, 180)]


def point_area(share: float) -> float:
    """A traced op's marker area (pt^2) for its share of the traced time."""
    return 18 + 900 * share


def roofline_svg(rf, run: str) -> tuple:
    """(SVG text, [hover.Mark]) of a trace's roofline; ``run`` names the run as the points table does."""
    a = analyze(rf)
    header, dev = rf.header, rf.header.device
    ms = plotted(rf)
    dtypes = sorted({r.point.compute_dtype for r in ms} | {header.dtype})
    chart = roof_chart(header, dtypes, [r.m.intensity for r in ms], [r.m.achieved_flops for r in ms])
    svg = Svg(WIDTH, HEIGHT)
    title = f"Roofline: {header.model_name} on {dev.name}" + busy_line(a, a.steps)

    # the layout: margins from the texts around the plot area, measured with our metrics
    top = MARGIN + title_height(title)
    bottom = HEIGHT - MARGIN - text_extent("x", LABEL_SIZE)[1] - 4 - tick_band(["1"])
    ydec, _ = log_ticks(chart.y_lo, chart.y_hi)
    yscale = LogScale(chart.y_lo, chart.y_hi, bottom, top)
    ystride = fitting_stride(ydec, [U.si(v, "FLOP/s") for v in ydec], yscale, 8.0, vertical=True)
    ymaj, ymin = log_ticks(chart.y_lo, chart.y_hi, ystride)
    ylabels = [U.si(v, "FLOP/s") for v in ymaj]
    left = MARGIN + text_extent("x", LABEL_SIZE)[1] + 4 + tick_width(ylabels)
    xdec, _ = log_ticks(chart.x_lo, chart.x_hi)
    right = WIDTH - MARGIN - max(4.0, text_width(f"{xdec[-1]:g}", 8.0) / 2)
    xscale = LogScale(chart.x_lo, chart.x_hi, left, right)
    xstride = fitting_stride(xdec, [f"{v:g}" for v in xdec], xscale, 8.0, vertical=False)
    xmaj, xmin = log_ticks(chart.x_lo, chart.x_hi, xstride)
    ax = Axes(svg, (left, top, right, bottom), xscale, yscale)
    area = ax.box
    slope = math.degrees(math.atan2(-yscale.per_decade, xscale.per_decade))   # a slope-1 roof on screen

    ax.grid(xmaj, ymaj)
    with svg.group("roofs", clip=ax.clip):
        for roof in chart.roofs:
            svg.polyline([ax.px(x, y) for x, y in zip(roof.xs, roof.ys)], roof.color, roof.width,
                         DASHES[roof.style], gid=roof.gid)
        if chart.ridge is not None:
            rx, ry = ax.px(chart.ridge[0], chart.ridge[1])
            svg.line(rx, ry, rx, bottom, MEASURED_COLOR, 0.7, (1, 1.65), gid="ridge-line")

    # the points: (x, y, area) of every marker, for the labels to avoid
    index = hover.result_index(a)
    rows = list(point_rows(a, run))
    total = sum(r.time_s for r in ms) or 1.0
    bounded = len(ms) > hover.HOVER_MAX
    marks, markers = [], []
    for phase, shape in PHASE_MARKER.items():
        sel = [r for r in ms if r.point.phase == phase]
        if not sel:
            continue
        with svg.group(f"errorbars:{phase}", clip=ax.clip):
            for r in sel:
                if r.m.p20_s <= 0 or r.m.p80_s <= 0:
                    continue
                x = xscale(r.m.intensity)
                svg.line(x, yscale(r.point.cost.flops / r.m.p80_s), x, yscale(r.point.cost.flops / r.m.p20_s),
                         ERROR_COLOR, 0.6)
        with svg.group(f"points:{phase}", clip=ax.clip):
            for r in sel:
                x, y = ax.px(r.m.intensity, r.m.achieved_flops)
                s = point_area(r.time_s / total)
                i = index[id(r)]
                titled = not bounded or r.above_roof
                svg.marker(shape, x, y, math.sqrt(s), category_color(r.m.config.get("category", "")), "#ffffff", 0.4,
                           0.85, title=tip_text(POINT_TIP, POINT_COLUMNS, rows[i]) if titled else None)
                markers.append((x, y, s))
                if titled and ax.holds(x, y):
                    marks.append(hover.Mark("p", i, round(x, 2), round(y, 2), _radius(s), bounded))
    above = [r for r in ms if r.above_roof]
    if above:
        with svg.group("above-roof", clip=ax.clip):
            for r in above:
                x, y = ax.px(r.m.intensity, r.m.achieved_flops)
                svg.marker("o", x, y, math.sqrt(ABOVE_SIZE), "none", ABOVE_ROOF_COLOR, 1.4)
                markers.append((x, y, ABOVE_SIZE))
    shown = step_markers(a)
    step_index = {id(s): j for j, s in enumerate(a.steps)}
    for phase, shape in PHASE_MARKER.items():
        sel = [s for s in shown if s.phase == phase]
        if not sel:
            continue
        with svg.group(f"steps:{phase}", clip=ax.clip):
            for s in sel:
                x, y = ax.px(s.intensity, s.achieved_flops)
                tip = tip_text(STEP_TIP, STEP_COLUMNS, phase_rows([s], STEP_COLUMNS)[0])
                svg.marker(shape, x, y, math.sqrt(STEP_SIZE), "#ffffff", MEASURED_COLOR, 1.8, title=tip)
                markers.append((x, y, STEP_SIZE))
                if ax.holds(x, y):
                    marks.append(hover.Mark("s", step_index[id(s)], round(x, 2), round(y, 2), _radius(STEP_SIZE),
                                            True))
    if chart.ridge is not None:
        with svg.group(f"ridge:{chart.ridge[2]}"):
            svg.marker("D", rx, ry, RIDGE_MARKER, MEASURED_COLOR)
        markers.append((rx, ry, RIDGE_MARKER ** 2))

    # texts: the legend, the roofs' labels, the ridge's, then the callouts, each clear of what came before
    entries = legend_entries(rf, ms, shown, above, chart)
    lw, lh = legend_size(entries)
    pad = 0.5 * LEGEND_SIZE
    taken = [box_quad(legend(svg, entries, right - pad - lw, bottom - pad - lh))]   # the texts' corners, turned ones too
    marker_boxes = [(x - math.sqrt(s) / 2, y - math.sqrt(s) / 2, x + math.sqrt(s) / 2, y + math.sqrt(s) / 2)
                    for x, y, s in markers]
    for roof in chart.roofs:
        if roof.along_slope:
            taken.append(_slope_label(svg, ax, roof, slope, [box_quad(b) for b in marker_boxes], taken))
        else:
            x, y = ax.px(*roof.label_xy)
            taken.append(box_quad(svg.text(x, y, roof.label, LABEL_FONT, roof.color, roof.ha, roof.va,
                                        gid=roof.label_gid, boxed=True)))
    if chart.ridge is not None:
        taken.append(box_quad(_ridge_label(svg, area, (rx, ry), chart.ridge, marker_boxes, taken)))
    lines = [(ax.px(*p), ax.px(*q)) for roof in chart.roofs for p, q in zip(zip(roof.xs, roof.ys),
                                                                              list(zip(roof.xs, roof.ys))[1:])]
    for name, (x, y), text, color in point_labels(a, shown, above):
        box = _callout(svg, area, ax.px(x, y), name, text, color, marker_boxes, taken, lines)
        if box is not None:
            taken.append(box_quad(box))
    ax.xticks(xmaj, [f"{v:g}" for v in xmaj], xmin)
    ax.yticks(ymaj, ylabels, ymin)
    ax.spines()
    ax.xlabel("arithmetic intensity (FLOP/byte)", tick_band(xmaj) + 4)
    ax.ylabel("achieved FLOP/s", MARGIN)
    ax.title(title)
    return svg.to_string(), hover.bounded(marks)


def _radius(area: float) -> float:
    return round(max(math.sqrt(area) / 2, hover.MIN_RADIUS), 1)


def legend_entries(rf, ms, shown, above, chart) -> list:
    """The legend's rows: the phases drawn, their steps, the op categories, the ceilings, the red rings."""
    dev = rf.header.device
    out = [Entry(p, "marker", "#555555", PHASE_MARKER[p]) for p in PHASE_MARKER if any(r.point.phase == p for r in ms)]
    out += [Entry(f"{p} step (its ops summed)", "marker", "#ffffff", PHASE_MARKER[p], MEASURED_COLOR, 1.8, 10.0)
            for p in PHASE_MARKER if any(s.phase == p for s in shown)]
    out += [Entry(c, "marker", col) for c, col in category_legend(r.m.config.get("category", "") for r in ms)]
    out.append(Entry(f"{dev.source} ceilings{ceilings_said(rf.header)}", "line", MEASURED_COLOR))
    if chart.sheet:
        out.append(Entry("datasheet ceilings", "line", "#888888", dash=DASHES["datasheet"]))
    if dev.cache_levels:
        out.append(Entry("cache roofs (" + ", ".join(c.name for c in dev.cache_levels) + ")", "line",
                         next(r.color for r in chart.roofs if r.style == "cache") if any(
                             r.style == "cache" for r in chart.roofs) else "#6a51a3", dash=DASHES["cache"]))
    if above:
        out.append(Entry(f"above its roof ({len(above)})", "marker", "none", "o", ABOVE_ROOF_COLOR, 1.0, 9.0))
    return out


def _hits(box, boxes) -> bool:
    return any(overlaps(box, b) for b in boxes)


def _slope_label(svg, ax, roof, angle, markers, taken) -> tuple:
    """A bandwidth roof's label along its line: at its anchor, or slid along the slope (x 1.6 a step, up to short of
    the elbow, then down) to the nearest place inside the axes whose turned text covers no marker and no text drawn
    before (then: no text); at its anchor when there is none. Returns its corners."""
    x0, y0 = roof.label_xy
    elbow = roof.xs[1]
    tries = [x0] + [x0 * 1.6 ** k for k in range(1, 12) if x0 * 1.6 ** k * 4 <= elbow] + [x0 / 1.6 ** k
                                                                                        for k in range(1, 12)]
    for avoid_markers in (True, False):
        for lx in tries:
            px, py = ax.px(lx, lx * y0 / x0)
            quad = text_quad(px, py, roof.label, LABEL_FONT, roof.ha, roof.va, angle)
            clear = not (avoid_markers and covers(quad, markers)) and not covers(quad, taken)
            if clear and inside(text_box(px, py, roof.label, LABEL_FONT, roof.ha, roof.va, angle), ax.box):
                svg.text(px, py, roof.label, LABEL_FONT, roof.color, roof.ha, roof.va, angle, gid=roof.label_gid)
                return quad
    px, py = ax.px(x0, y0)
    svg.text(px, py, roof.label, LABEL_FONT, roof.color, roof.ha, roof.va, angle, gid=roof.label_gid)
    return text_quad(px, py, roof.label, LABEL_FONT, roof.ha, roof.va, angle)


def _ridge_label(svg, area, at, ridge, markers, taken) -> tuple:
    """The ridge's label at the first of RIDGE_SPOTS inside the axes clear of the texts (and of the markers where a
    spot is); else at the first spot."""
    text = ridge_text(ridge)
    for avoid in (True, False):
        for dx, dy, ha, va in RIDGE_SPOTS:
            x, y = at[0] + dx, at[1] - dy
            box = text_box(x, y, text, 8.0, ha, va)
            if inside(box, area) and not covers(box_quad(box), taken) and not (avoid and _hits(box, markers)):
                return svg.text(x, y, text, 8.0, MEASURED_COLOR, ha, va, gid=f"ridge-label:{ridge[2]}", boxed=True)
    dx, dy, ha, va = RIDGE_SPOTS[0]
    return svg.text(at[0] + dx, at[1] - dy, text, 8.0, MEASURED_COLOR, ha, va, gid=f"ridge-label:{ridge[2]}",
                    boxed=True)


def _callout(svg, area, at, name, text, color, markers, taken, lines=()):
    """A callout at the first of CALLOUT_SPOTS around ``at`` that stays inside the axes and touches no marker, no
    text (PAD kept clear) and, where a spot is free of them, no roof line (``lines``: segments); a leader line joins
    it to its point. None when no spot is free (left out)."""
    for avoid_lines in (True, False):
        for dx, dy in CALLOUT_SPOTS:
            ha = "left" if dx > 1 else "right" if dx < -1 else "center"
            va = "bottom" if dy > 1 else "top" if dy < -1 else "center"
            x, y = at[0] + dx, at[1] - dy
            box = grow(text_box(x, y, text, LABEL_FONT, ha, va), PAD)
            if not inside(box, area) or _hits(box, markers) or covers(box_quad(box), taken):
                continue
            if avoid_lines and any(segment_hits_box(p, q, box) for p, q in lines):
                continue
            drawn = svg.text(x, y, text, LABEL_FONT, color, ha, va, gid=f"point-label:{name}", boxed=True)
            leader(svg, grow(drawn, BOX_PAD * LABEL_FONT), at[0], at[1], color)
            return box
    return None
