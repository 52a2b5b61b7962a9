"""Points that explain themselves: where each drawn point sits in its figure's SVG (rendering only).

A plot function that draws points it wants explained calls ``register(ax, xs, ys, keys, radius)``
with the same data coordinates it drew them at, and a key per point: ``("p", i)`` for
``analysis.results[i]`` (an op), ``("s", j)`` for ``analysis.steps[j]`` (a step), ``("c", k)`` for
a comparison's k-th matched op. Nothing is drawn. Once the figure's layout is final (after
``reports.style.save``), ``marks(fig)`` turns them into ``Mark``s in the SVG's own user units
(points, origin top left: matplotlib writes ``viewBox="0 0 W H"`` with W, H the figure size
x 72), which ``reports.html`` lays over the chart as focusable, invisible targets linked to the
table row that holds the point's numbers.

The trace report's own SVG figures (``reports.svg_roofline``, ``reports.svg_predicted``) know where they draw each
point and make their ``Mark``s directly (``bounded`` applies the same limit); the HTML lays both kinds over alike.

Large files: every point is registered, but beyond ``HOVER_MAX`` ordinary points in one figure
only the ``priority`` ones keep a mark (step markers, points above their roof): the table still
lists every point. Marks outside their axes (clipped points) are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .palette import RASTER_ABOVE

HOVER_MAX = RASTER_ABOVE   # beyond this many ordinary points in one figure, only priority points get a mark
MIN_RADIUS = 4.0           # points: a target smaller than this is hard to hit with a mouse
_ATTR = "_roofline_hover"


@dataclass(frozen=True)
class Mark:
    kind: str       # "p" (an op of analysis.results), "s" (a step), "c" (a compared op)
    index: int
    x: float        # SVG user units (pt), from the left
    y: float        # from the top
    r: float        # hit radius (pt)
    priority: bool = False


def register(ax, xs, ys, keys, radius=MIN_RADIUS, *, priority: bool = False) -> None:
    """Note points drawn on ``ax`` at data (xs, ys), one key (kind, index) each; ``radius`` in points
    (a number, or one per point)."""
    keys = list(keys)
    if not keys:
        return
    entries = getattr(ax.figure, _ATTR, None)
    if entries is None:
        entries = []
        setattr(ax.figure, _ATTR, entries)
    r = np.broadcast_to(np.asarray(radius, dtype=float), (len(keys),))
    entries.append((ax, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), keys, r, priority))


def result_index(analysis) -> dict:
    """{id(OpResult): its position in ``analysis.results``}, built once per analysis (kept on it)."""
    idx = getattr(analysis, "_hover_index", None)
    if idx is None:
        idx = {id(r): i for i, r in enumerate(analysis.results)}
        analysis._hover_index = idx
    return idx


def marker_radius(area) -> np.ndarray:
    """Hit radius (pt) of scatter markers of ``area`` (pt^2): half their width, at least MIN_RADIUS."""
    return np.maximum(np.sqrt(np.asarray(area, dtype=float)) / 2, MIN_RADIUS)


def marks(fig) -> list:
    """Every registered point as a ``Mark`` in SVG user units; call once the layout is final."""
    entries = getattr(fig, _ATTR, None) or []
    height_pt = float(fig.get_figheight()) * 72
    scale = 72 / fig.dpi
    out = []
    for ax, xs, ys, keys, radius, priority in entries:
        if not len(xs):
            continue
        px = ax.transData.transform(np.column_stack([xs, ys]))
        bb = ax.bbox
        for (kind, index), (x, y), r in zip(keys, px, radius):
            if not (math.isfinite(x) and math.isfinite(y)) or not (bb.x0 - 1 <= x <= bb.x1 + 1
                                                                    and bb.y0 - 1 <= y <= bb.y1 + 1):
                continue
            out.append(Mark(kind, int(index), round(float(x) * scale, 2), round(height_pt - float(y) * scale, 2),
                            round(float(r), 1), priority))
    return bounded(out)


def bounded(marks: list) -> list:
    """``marks``, or only their priority ones when the ordinary ones number over ``HOVER_MAX``."""
    if sum(not m.priority for m in marks) > HOVER_MAX:
        return [m for m in marks if m.priority]
    return marks

