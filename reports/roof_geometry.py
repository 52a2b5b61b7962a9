"""Where a roofline's roofs, ridge and axis limits go, in data coordinates (rendering only; no matplotlib).

``roof_chart(header, dtypes, xs, ys)`` gives a ``RoofChart``: the log-log limits that hold the points (xs, ys),
every elbow and the highest peak; one ``Roof`` per line to draw (ceilings used for classification solid,
datasheet ceilings dashed, the device's cache levels dash-dotted, as in Nsight Compute's hierarchical roofline),
each with its label's text, anchor and alignment; and the ridge of the run's dtype (peak / bandwidth). Both the
matplotlib roofline (``reports.roofline_plot.draw_ceilings``) and the trace report's own SVG
(``reports.svg_roofline``) draw from it, so the two agree line for line.

* every bandwidth roof runs up to its elbow with the group's highest peak; every peak from its own elbow to the
  right edge; a datasheet ceiling the run also classifies with is drawn once, solid;
* of two close lines of one kind and dtype the upper one is labelled above it, the lower one below;
* a cache level's roof runs to its elbow with the highest used peak, then along that peak to the DRAM roof's
  elbow; the fastest level's label sits above its line, the others' below and further along their slope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roofline import units as U
from roofline.analysis import cache_ceilings, ceilings

from .palette import DATASHEET_COLOR, MEASURED_COLOR

CACHE_ROOF_COLOR = "#6a51a3"   # the cache levels' roofs: apart from the DRAM roof's colour
# dash patterns in units of the line's width (matplotlib's convention): datasheet dashed, cache levels dash-dotted
DASHES = {"solid": (), "datasheet": (5, 3), "cache": (6, 2, 1, 2)}
USED_WIDTH, SHEET_WIDTH, CACHE_WIDTH = 1.6, 1.1, 1.2


@dataclass(frozen=True)
class Roof:
    gid: str                 # "ceiling:bandwidth:used", "ceiling:peak:bf16:datasheet", "ceiling:cache:L3"
    xs: tuple                # data coordinates of the line's vertices
    ys: tuple
    color: str
    style: str               # a key of DASHES
    width: float             # points
    label: str
    label_gid: str
    label_xy: tuple          # data coordinates of the label's anchor
    ha: str                  # "left" / "right"
    va: str                  # "bottom" / "top"
    along_slope: bool        # turned along its (slope 1) line; else horizontal on a white box


@dataclass(frozen=True)
class RoofChart:
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    roofs: tuple             # Roof, in drawing order
    sheet: tuple             # the datasheet ceilings drawn (those the run does not also classify with)
    ridge: tuple | None      # (intensity, peak FLOP/s, dtype) of the run's dtype, None without one


def roof_chart(header, dtypes, xs, ys) -> RoofChart:
    """The roofs of ``header``'s device for ``dtypes`` on axes that hold the points (xs, ys) (see the docstring)."""
    dev = header.device
    used, sheet = ceilings(header, dtypes)
    xs = [float(x) for x in xs] or [1.0]
    ys = [float(y) for y in ys] or [1e12]
    levels = cache_ceilings(header)
    peaks = [c.value for c in used + sheet if c.kind == "peak"]
    bws = [c.value for c in used + sheet + levels if c.kind == "bandwidth" and c.value > 0]
    elbows = [p / b for p in peaks for b in bws] or [1.0]
    x_lo = 10 ** math.floor(math.log10(min(min(xs), min(elbows)) / 2))
    x_hi = 10 ** math.ceil(math.log10(max(max(xs), max(elbows)) * 3))
    y_hi = 10 ** math.ceil(math.log10(max(peaks + [max(ys)]) * 2))
    y_lo = 10 ** math.floor(math.log10(max(min(min(ys), x_lo * min(bws or [1.0])), 1.0)))

    # a datasheet ceiling the run also classifies with is drawn once, solid, labelled "datasheet"
    sheet = [c for c in sheet if not any(u.kind == c.kind and u.dtype == c.dtype and
                                         math.isclose(u.value, c.value, rel_tol=1e-9) for u in used)]
    roofs = []

    def higher(c):  # the upper of two close lines is labelled above it, the lower one below
        rivals = [o.value for o in used + sheet if o.kind == c.kind and o.dtype == c.dtype and o is not c]
        return all(c.value >= v for v in rivals)

    for group, solid in ((sheet, False), (used, True)):
        color = MEASURED_COLOR if solid else DATASHEET_COLOR
        style, width, which = ("solid", USED_WIDTH, "used") if solid else ("datasheet", SHEET_WIDTH, "datasheet")
        top = max((c.value for c in group if c.kind == "peak"), default=None)
        for c in group:
            if c.kind == "bandwidth":
                if c.value <= 0 or top is None:
                    continue
                lx = max(x_lo * 2.5, y_lo * 3 / c.value)
                roofs.append(Roof(f"ceiling:bandwidth:{which}", (x_lo, top / c.value), (x_lo * c.value, top), color,
                                  style, width, f"  {U.si(c.value, 'B/s')} ({c.source})",
                                  f"ceiling-label:bandwidth:{which}", (lx, lx * c.value), "left",
                                  "bottom" if higher(c) else "top", True))
            else:
                bw = next((b.value for b in group if b.kind == "bandwidth" and b.value > 0), None)
                start = c.value / bw if bw else x_lo
                up = higher(c)
                roofs.append(Roof(f"ceiling:peak:{c.dtype}:{which}", (start, x_hi), (c.value, c.value), color, style,
                                  width, f"{c.dtype} {U.si(c.value, 'FLOP/s')} ({c.source})",
                                  f"ceiling-label:peak:{c.dtype}:{which}",
                                  (x_hi / 1.15, c.value * (1.12 if up else 0.9)), "right", "bottom" if up else "top",
                                  False))
    roofs += cache_roofs(levels, max((c.value for c in used if c.kind == "peak"), default=None), dev.bandwidth,
                         x_lo, y_lo)
    ridge = None
    if dev.bandwidth > 0 and header.dtype in dev.peak_flops:
        peak = dev.peak_flops[header.dtype]
        ridge = (peak / dev.bandwidth, peak, header.dtype)
    return RoofChart(x_lo, x_hi, y_lo, y_hi, tuple(roofs), tuple(sheet), ridge)


def cache_roofs(levels, top, dram, x_lo, y_lo) -> list:
    """One ``Roof`` per cache level (``analysis.cache_ceilings``) under the highest peak ``top`` (see the module
    docstring); labelled "L3 180 GB/s (measured, 33.6 MB)"."""
    out = []
    if top is None:
        return out
    fastest = max((c.value for c in levels), default=0.0)
    for i, c in enumerate(levels):
        elbow = top / c.value
        xs, ys = [x_lo, elbow], [x_lo * c.value, top]
        if dram > 0 and top / dram > elbow:
            xs.append(top / dram)
            ys.append(top)
        up = c.value >= fastest
        lx = max(x_lo * 2.5, y_lo * 3 / c.value)
        if not up:   # further along its slope, short of its elbow: apart from the faster level's label
            lx = max(lx, min(lx * 4 ** (i + 1), elbow / 8))
        out.append(Roof(f"ceiling:cache:{c.level}", tuple(xs), tuple(ys), CACHE_ROOF_COLOR, "cache", CACHE_WIDTH,
                        f"  {c.level} {U.si(c.value, 'B/s')} ({c.source}, {U.nbytes(c.size_bytes)})",
                        f"ceiling-label:cache:{c.level}", (lx, lx * c.value), "left", "bottom" if up else "top", True))
    return out
