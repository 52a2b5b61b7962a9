"""A trace's GPU idle timeline as an SVG of our own (``reports.svg``), without matplotlib (rendering only).

``idle_svg(rf)`` draws what ``reports.idle_plot.idle_figure`` draws, from the same data (the result file's
``settings["idle"]``, ``reports.idle_data``): one strip over the GPU window (x: time from the first GPU activity),
busy time grey, each gap in its cause's colour (at least a hairline wide while there are at most
``HAIRLINE_UP_TO``), the phases in a band above it (dashed lines where one hands over), the largest gaps named
under it with a leader line (each at the shallowest of the matplotlib figure's levels where it touches no other
label and no leader crosses a label), the legend with each
cause's total on the right, the note of a simplified timeline under the axis; and, when the timeline holds a
zoom, the zoom under the strip (each kernel in alternating greys, each gap at its true width, the steps in a band
above, the window's largest gap named), boxed on the strip. Each gap carries a ``<title>`` (its cause, length and
start) while there are at most ``HAIRLINE_UP_TO``. Groups carry the matplotlib figure's gids ("idle:busy",
"idle:host-bound", "idle:phase:decode", "idle:largest", "idle:note", "idle:zoom-mark", "zoom:kernels", ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

from roofline import units as U
from roofline.traces.idle import CAUSES

from .idle_data import (BAND, BUSY_COLOR, CAUSE_COLORS, HAIRLINE, HAIRLINE_UP_TO, KERNEL_SHADES, MAX_PHASE_LINES,
                        PHASE_COLORS, STRIP, ZOOM_MARK, annotated, gap_label, merged_text, strip_legend, strip_title,
                        zoom_legend, zoom_title)
from .svg import (LABEL_SIZE, Axes, Entry, LinearScale, Svg, legend, legend_size, leader, linear_ticks,
                  overlaps, text_box, text_extent, text_width, tick_band, title_height)

WIDTH = 864.0                        # points: the matplotlib figure's 12 inches
STRIP_HEIGHT, PHASED_HEIGHT, ZOOM_HEIGHT = 187.2, 208.8, 172.8    # 2.6, 2.9 and 2.4 inches
MARGIN = 6.0
NOTE_COLOR = "#aa0000"
LABEL_FONT = 7.5


def time_label(v: float) -> str:
    return U.seconds(v) if v else "0"


def fitting_ticks(lo: float, hi: float, scale, size: float = 8.0) -> list:
    """Linear ticks over [lo, hi], as many as leave a gap between their labels (at most 11)."""
    for most in range(10, 0, -1):
        ticks = linear_ticks(lo, hi, most)
        xs = [(scale(v), text_width(time_label(v), size)) for v in ticks]
        if all(b[0] - a[0] >= (a[1] + b[1]) / 2 + size for a, b in zip(xs, xs[1:])):
            return ticks
    return [lo, hi]


@dataclass
class Panel:
    """One axes of the figure and the texts around it (drawn by ``_finish`` once its content is in)."""

    gid: str
    ax: Axes
    ticks: list
    entries: list
    legend_title: str
    title: str
    xlabel: str
    note: str


def _panel(svg, gid, box, lo, hi, ylim, entries, legend_title, title, xlabel, note, lw) -> Panel:
    """An axes in ``box`` (the region it and its texts may take) over x [lo, hi] and y ``ylim``, ``lw`` points
    left for the legends on the right (the widest of the figure's: its axes end at one x), its title above, its x
    ticks, label and ``note`` under it."""
    x0, y0, x1, y1 = box
    title_size = 10.0
    note_h = text_extent(note, LABEL_FONT)[1] + 3 if note else 0.0
    top = y0 + MARGIN + title_height(title, title_size)
    bottom = y1 - MARGIN - note_h - text_extent("x", LABEL_SIZE)[1] - 4 - tick_band(["0"])
    right = x1 - MARGIN - lw - 4
    left = x0 + MARGIN + text_width(time_label(lo), 8.0) / 2
    ax = Axes(svg, (left, top, right, bottom), LinearScale(lo, hi, left, right), LinearScale(ylim[0], ylim[1], bottom,
                                                                                          top))
    ticks = fitting_ticks(lo, hi, ax.x)
    ax.grid(ticks, ())
    return Panel(gid, ax, ticks, entries, legend_title, title, xlabel, note)


def _finish(svg, p: Panel) -> None:
    ax, ticks = p.ax, p.ticks
    left, top, right, bottom = ax.box
    ax.xticks(ticks, [time_label(v) for v in ticks])
    ax.spines(left=False)
    xl = ax.xlabel(p.xlabel, tick_band(ticks) + 4)
    if p.note:
        svg.text(left, xl[3] + 3, p.note, LABEL_FONT, NOTE_COLOR, va="top", gid=f"{p.gid}:note")
    svg.text((left + right) / 2, top - 6, p.title, 10.0, ha="center", va="bottom", gid=f"{p.gid}:title")
    legend(svg, p.entries, right + 4, top, title=p.legend_title, frame=False, gid=f"{p.gid}:legend", align="left")


def _bars(svg, ax, spans, gid, color, *, edge=None, width=0.0, band=STRIP, titles=None, colors=None) -> None:
    y0, y1 = ax.y(band[0] + band[1]), ax.y(band[0])
    with svg.group(gid, clip=ax.clip):
        for i, (s, e) in enumerate(spans):
            svg.rect(ax.x(s), y0, ax.x(e), y1, fill=colors[i % len(colors)] if colors else color, stroke=edge,
                     width=width, title=titles[i] if titles else None)


def _gaps(svg, ax, gaps, t0, prefix, edge) -> None:
    titled = len(gaps) <= HAIRLINE_UP_TO
    for cause in CAUSES:
        sel = [(s, e) for s, e, c in gaps if c == cause]
        # edged in its own colour, ``edge`` points wide (a hairline while there are few gaps): a gap narrower than a
        # pixel still shows
        spans = [(s - t0, e - t0) for s, e in sel]
        _bars(svg, ax, spans, f"{prefix}:{cause}", CAUSE_COLORS[cause], edge=CAUSE_COLORS[cause] if edge else None,
              width=edge, titles=[f"{cause} gap: {U.seconds(e - s)} at {U.seconds(s)}" for s, e in sel]
              if titled else None)


def _crosses(a, b) -> bool:
    """Would the leader of one callout cross the other's text? (a, b: (x, box)); the deeper one's leader runs up
    past the shallower one."""
    (xa, ba), (xb, bb) = a, b
    if ba[1] >= bb[3]:                    # a under b: a's leader passes b's row
        return bb[0] <= xa <= bb[2]
    if bb[1] >= ba[3]:
        return ba[0] <= xb <= ba[2]
    return False


def _levels(ax, items, levels):
    """[(x pt, y data, text, ha)]: each item at the first of ``levels`` where it touches no text placed before and no
    leader crosses a text, trying the items in each order (largest gap first, then the others: at most 3! orders)
    until one places them all; else the first order's, an item with no free level at the deepest."""
    best = None
    for order in permutations(items):
        placed, out = [], []
        for x, text, ha in order:
            px = ax.x(x)
            for y in levels:
                box = text_box(px, ax.y(y), text, LABEL_FONT, ha, "top")
                if not any(overlaps(box, b) or _crosses((px, box), (q, b)) for q, b in placed):
                    break
            else:
                y = None
            placed.append((px, box))
            out.append((px, y, text, ha))
        if all(o[1] is not None for o in out):
            return out
        best = best or out
    return [(px, levels[-1] if y is None else y, text, ha) for px, y, text, ha in best]


def _callouts(svg, ax, items, levels, gid) -> None:
    """Texts under the strip, each (x data, text, ha) with a vertical leader from the strip's bottom, placed by
    ``_levels`` (``levels``: y data, shallowest first)."""
    with svg.group(gid):
        for px, y, text, ha in _levels(ax, items, levels):
            box = svg.text(px, ax.y(y), text, LABEL_FONT, ha=ha, va="top")
            leader(svg, (px, box[1] - 1, px, box[1] - 1), px, ax.y(STRIP[0]), "#333333", shrink=0.0, width=0.7)


def idle_svg(rf) -> str:
    """The SVG text of a trace's idle timeline (it has one: ``idle_data.has_idle_timeline``)."""
    st = rf.header.settings
    idle = st["idle"]
    line = idle["timeline"]
    window = line["window_s"]
    zoom = line.get("zoom")
    phases = line.get("phases", [])
    top_h = PHASED_HEIGHT if phases else STRIP_HEIGHT
    svg = Svg(WIDTH, top_h + (ZOOM_HEIGHT if zoom else 0.0))

    marked = annotated(idle, window)
    bottom = STRIP[0] - 0.35 - 0.55 * len(marked) - 0.5
    ylim = (min(bottom, -0.2), BAND[0] + BAND[1] + 0.1 if phases else STRIP[1] + 0.1)
    entries = [Entry(t, "patch", c) for c, t in strip_legend(idle, (st.get("gpu_time") or {}).get("busy_s"))]
    lw = max(legend_size(entries)[0], legend_size(_zoom_entries(zoom), ZOOM_LEGEND)[0] if zoom else 0.0)
    panel = _panel(svg, "idle", (0, 0, WIDTH, top_h), 0.0, window, ylim, entries, "", strip_title(idle),
                   "time from the first GPU activity", merged_text(line), lw)
    ax = panel.ax
    for s, e, phase in phases:
        _bars(svg, ax, [(s, e)], f"idle:phase:{phase}", PHASE_COLORS.get(phase, "#d0d0d0"), edge="#ffffff",
              width=0.5, band=BAND)
        if (e - s) / window > 0.06:
            svg.text(ax.x((s + e) / 2), ax.y(BAND[0] + BAND[1] / 2), phase, 8.0, ha="center", va="center")
    _bars(svg, ax, line.get("busy", []), "idle:busy", BUSY_COLOR)
    gaps = line.get("gaps", [])
    _gaps(svg, ax, gaps, 0.0, "idle", HAIRLINE if len(gaps) <= HAIRLINE_UP_TO else 0.0)
    if 1 < len(phases) <= MAX_PHASE_LINES:
        with svg.group("idle:phase-boundary", clip=ax.clip):
            for s, _, _ in phases[1:]:
                svg.line(ax.x(s), ax.y(STRIP[0]), ax.x(s), ax.y(BAND[0] + BAND[1]), "#333333", 0.6, (2, 2))
    if zoom:
        with svg.group("idle:zoom-mark"):
            svg.rect(ax.x(zoom["start_s"]), ax.y(STRIP[1] + 0.08), ax.x(zoom["end_s"]), ax.y(STRIP[0] - 0.08),
                     stroke=ZOOM_MARK, width=1.5)
        x = (zoom["start_s"] + zoom["end_s"]) / 2
        near_left = x < 0.5 * window
        svg.text(ax.x(x) + (4 if near_left else -4), ax.y(STRIP[1]) - 1, "zoomed below", 7.0,
                 ha="left" if near_left else "right", va="bottom", gid="idle:zoom-text")
    items = []
    for gap in marked:
        x = gap["at_s"] + gap["gap_s"] / 2
        items.append((x, gap_label(gap), "left" if x < 0.25 * window else "right" if x > 0.75 * window else "center"))
    _callouts(svg, ax, items, [STRIP[0] - 0.35 - 0.55 * i for i in range(len(marked))], "idle:largest")
    _finish(svg, panel)
    if zoom:
        _zoom(svg, zoom, (0, top_h, WIDTH, top_h + ZOOM_HEIGHT), lw)
    return svg.to_string()


ZOOM_LEGEND = "in this window"


def _zoom_entries(zoom) -> list:
    return [Entry(t, "patch", c) for c, t in zoom_legend(zoom)]


def _zoom(svg, zoom, region, lw) -> None:
    t0 = zoom["start_s"]
    span = zoom["end_s"] - t0
    steps = zoom.get("steps") or []
    big = zoom.get("largest")
    kernels = zoom.get("kernels") or []
    ylim = (STRIP[0] - 1.0 if big else -0.2, BAND[0] + BAND[1] + 0.1 if steps else STRIP[1] + 0.1)
    note = (f"cut: the window ends after {len(kernels):,} kernels ({zoom['kernels_cut']:,} more in its steps are not "
            "drawn)") if zoom.get("kernels_cut") else ""
    panel = _panel(svg, "zoom", region, 0.0, span, ylim, _zoom_entries(zoom), ZOOM_LEGEND, zoom_title(zoom),
                   f"time from the zoom's start ({U.seconds(t0)} on the strip above)", note, lw)
    ax = panel.ax
    for phase in dict.fromkeys(p for _, _, p, _ in steps):
        _bars(svg, ax, [(s - t0, e - t0) for s, e, p, _ in steps if p == phase], f"zoom:step:{phase}",
              PHASE_COLORS.get(phase, "#d0d0d0"), edge="#ffffff", width=1.0, band=BAND)
    for s, e, phase, n in steps:
        if (min(e, zoom["end_s"]) - max(s, t0)) / span > 0.08:
            svg.text(ax.x((max(s, t0) + min(e, zoom["end_s"])) / 2 - t0), ax.y(BAND[0] + BAND[1] / 2),
                     f"{phase} step {n:,}", LABEL_FONT, ha="center", va="center")
    _bars(svg, ax, [(s - t0, e - t0) for s, e in zoom["busy"]], "zoom:busy", BUSY_COLOR)
    _bars(svg, ax, [(s - t0, e - t0) for s, e in kernels], "zoom:kernels", KERNEL_SHADES[0], edge="#ffffff",
          width=0.3, colors=KERNEL_SHADES)
    _gaps(svg, ax, zoom["gaps"], t0, "zoom", HAIRLINE)
    if big:
        x = big["at_s"] + big["gap_s"] / 2 - t0
        ha = "left" if x < 0.25 * span else "right" if x > 0.75 * span else "center"
        text = (f"largest gap here ({big['cause']}): " if big.get("cpu_op") else "largest gap here: ") + gap_label(big)
        _callouts(svg, ax, [(x, text, ha)], [STRIP[0] - 0.35], "zoom:largest")
    _finish(svg, panel)
