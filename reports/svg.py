"""A small SVG writer for the trace report's figures, without matplotlib (rendering only).

``Svg(width, height)`` is one document in points (1 user unit = 1 pt, ``viewBox="0 0 W H"`` as matplotlib writes
it, so ``reports.hover`` marks and the HTML overlay use the same units), y growing down. It draws primitives
(lines, polylines, rectangles, markers of the report's shapes, text with a white box behind it), groups with an
``id`` (the gids the matplotlib figures carry, so tests read back what was drawn) and ``<title>`` hover text.

Text is measured with our own metrics: ``text_width`` sums DejaVu Sans advance widths (``ADVANCE``, ASCII, in
font units of 2,048 per em; the few other characters the report writes in ``WIDE``), and every text is written
with ``FONT_FAMILY`` (DejaVu Sans first, then the fonts nearest its widths), so the layout computed here is the
one a browser draws. ``Svg.text`` returns the text's box, and ``Svg.texts`` holds every text's corners (gid,
corners), so placement code and tests check that no two overlap (``overlaps`` for boxes, ``quads_overlap`` for
turned texts).

``LogScale`` and ``LinearScale`` map data to points; ``log_ticks`` (decades, minor ticks at 2 and 5, thinned
when the labels would not fit) and ``linear_ticks`` (steps of 1, 2, 2.5, 5 x 10^k) choose ticks; ``Axes`` draws
the grid, the left and bottom spines, ticks, tick labels, axis labels and title around a plot area; ``legend``
draws a legend box of marker, line and patch entries at a given place and returns its box.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

FONT_FAMILY = "'DejaVu Sans', 'Bitstream Vera Sans', Verdana, Geneva, sans-serif"
UNITS_PER_EM = 2048
# DejaVu Sans advance widths (font units) of the ASCII characters 32 (space) to 126 (~), from DejaVuSans.ttf's hmtx
ADVANCE = (651, 821, 942, 1716, 1303, 1946, 1597, 563, 799, 799, 1024, 1716, 651, 739, 651, 690,     # space - /
           1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690, 690, 1716, 1716, 1716, 1087,  # 0 - ?
           2048, 1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604, 604, 1343, 1141, 1767, 1532, 1612,  # @ - O
           1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799, 690, 799, 1716, 1024,   # P - _
           1024, 1255, 1300, 1126, 1300, 1260, 721, 1300, 1298, 569, 569, 1186, 569, 1995, 1298, 1253,    # ` - o
           1300, 1300, 842, 1067, 803, 1298, 1212, 1675, 1212, 1212, 1075, 1303, 690, 1303, 1716)         # p - ~
WIDE = {"µ": 1303, "×": 1716, "·": 651, "–": 1024, "—": 2048, "…": 2048, "≥": 1716, "≤": 1716, "→": 1716,
        "°": 1024, "±": 1716}
OTHER = 1638          # any other character: wider than most, so a label with one is given room
ASCENT, DESCENT = 0.76, 0.24   # of the font size: a line's box above and below its baseline
LINE = 1.2            # line spacing, of the font size

TITLE_SIZE, LABEL_SIZE, TICK_SIZE, LEGEND_SIZE = 10.0, 9.0, 8.0, 8.0   # as reports.style.RC
GRID_COLOR, GRID_WIDTH = "#e6e6e6", 0.6
SPINE_WIDTH, MAJOR_TICK, MINOR_TICK, TICK_PAD = 0.8, 3.5, 2.0, 3.5
TEXT_COLOR = "#000000"
BOX_PAD = 0.15        # a text's white box: this much of its size around it


def text_width(text: str, size: float) -> float:
    """Width in points of one line of ``text`` at ``size`` points in DejaVu Sans (no kerning)."""
    units = 0
    for ch in text:
        o = ord(ch)
        units += ADVANCE[o - 32] if 32 <= o < 127 else WIDE.get(ch, OTHER)
    return units * size / UNITS_PER_EM


def text_extent(text: str, size: float) -> tuple:
    """(width, height) of ``text`` (lines split at newlines) at ``size``."""
    lines = str(text).split("\n")
    return max(text_width(s, size) for s in lines), ((len(lines) - 1) * LINE + ASCENT + DESCENT) * size


def overlaps(a, b) -> bool:
    """Do boxes (x0, y0, x1, y1) ``a`` and ``b`` intersect (touching edges do not)?"""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def box_quad(box) -> list:
    """The corners of a box (x0, y0, x1, y1), as ``text_quad`` gives them."""
    return [(box[0], box[1]), (box[2], box[1]), (box[2], box[3]), (box[0], box[3])]


def covers(quad, quads) -> bool:
    """Does ``quad`` touch any of ``quads`` (corner lists)?"""
    return any(quads_overlap(quad, q) for q in quads)


def segment_hits_box(p0, p1, box) -> bool:
    """Does the segment p0-p1 pass through the box (x0, y0, x1, y1)? (Liang-Barsky clipping.)"""
    (ax, ay), (bx, by) = p0, p1
    dx, dy = bx - ax, by - ay
    lo, hi = 0.0, 1.0
    for p, q in ((-dx, ax - box[0]), (dx, box[2] - ax), (-dy, ay - box[1]), (dy, box[3] - ay)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            lo = max(lo, t)
        else:
            hi = min(hi, t)
        if lo > hi:
            return False
    return True


def grow(box, pad: float) -> tuple:
    return (box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad)


def inside(box, area) -> bool:
    return area[0] <= box[0] and area[1] <= box[1] and box[2] <= area[2] and box[3] <= area[3]


def num(v: float) -> str:
    """A coordinate as the SVG holds it: at most 2 decimals, no trailing zeros."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _layout(text, size, ha, va):
    """(line strings, x offset of the anchor's side, first baseline's y offset, width, height) of a text anchored
    at (0, 0) before rotation."""
    lines = str(text).split("\n")
    w, h = text_extent(text, size)
    x0 = {"left": 0.0, "center": -w / 2, "right": -w}[ha]
    top = {"top": 0.0, "center": -h / 2, "bottom": -h, "baseline": -ASCENT * size}[va]
    return lines, x0, top, w, h


def turn(pts, x: float, y: float, rotation: float) -> list:
    """Points (offsets from (x, y)) turned ``rotation`` degrees counter-clockwise on screen about (x, y)."""
    a = math.radians(rotation)
    c, s = math.cos(a), math.sin(a)
    return [(x + px * c + py * s, y - px * s + py * c) for px, py in pts]


def text_quad(x, y, text, size, ha="left", va="baseline", rotation=0.0) -> list:
    """The four corners of the rectangle ``Svg.text`` draws ``text`` in, turned with it."""
    _, x0, top, w, h = _layout(text, size, ha, va)
    return turn([(x0, top), (x0 + w, top), (x0 + w, top + h), (x0, top + h)], x, y, rotation)


def text_box(x, y, text, size, ha="left", va="baseline", rotation=0.0) -> tuple:
    """The box (x0, y0, x1, y1) ``Svg.text`` would draw ``text`` in (rotated: the box around the turned text)."""
    q = text_quad(x, y, text, size, ha, va, rotation)
    return (min(p[0] for p in q), min(p[1] for p in q), max(p[0] for p in q), max(p[1] for p in q))


def quads_overlap(a, b) -> bool:
    """Do the convex polygons ``a`` and ``b`` (corner lists) intersect? (No separating axis among their edges'
    normals; touching edges do not count.)"""
    for poly in (a, b):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y1 - y0, x0 - x1
            pa = [nx * px + ny * py for px, py in a]
            pb = [nx * px + ny * py for px, py in b]
            if max(pa) <= min(pb) + 1e-9 or max(pb) <= min(pa) + 1e-9:
                return False
    return True


def marker_path(shape: str, x: float, y: float, size: float) -> str:
    """Path data of a marker of ``size`` points (matplotlib's markersize: a circle's diameter) at (x, y):
    "o" circle, "^" triangle, "s" square, "D" diamond, "p" pentagon."""
    r = size / 2
    if shape == "o":
        return (f"M{num(x - r)} {num(y)}a{num(r)} {num(r)} 0 1 0 {num(2 * r)} 0"
                f"a{num(r)} {num(r)} 0 1 0 {num(-2 * r)} 0Z")
    if shape == "^":
        pts = [(x, y - r), (x - r, y + r), (x + r, y + r)]
    elif shape == "s":
        pts = [(x - r, y - r), (x + r, y - r), (x + r, y + r), (x - r, y + r)]
    elif shape == "D":
        d = r * math.sqrt(2) * 0.85
        pts = [(x, y - d), (x + d * 0.75, y), (x, y + d), (x - d * 0.75, y)]
    elif shape == "p":
        pts = [(x + r * math.sin(2 * math.pi * k / 5), y - r * math.cos(2 * math.pi * k / 5)) for k in range(5)]
    else:
        raise ValueError(f"marker {shape!r}: one of o ^ s D p")
    return "M" + "L".join(f"{num(a)} {num(b)}" for a, b in pts) + "Z"


def dash_attr(dash, width: float) -> str:
    """stroke-dasharray of a dash pattern given in line widths (matplotlib's convention)."""
    return f' stroke-dasharray="{",".join(num(d * width) for d in dash)}"' if dash else ""


class Svg:
    """One SVG document being written (see the module docstring)."""

    def __init__(self, width: float, height: float):
        self.width, self.height = width, height
        self.parts: list = []
        self.defs: list = []
        self.texts: list = []      # (gid, corners) of every text drawn (``text_quad``)
        self._clips = 0

    def add(self, element: str) -> None:
        self.parts.append(element)

    @contextmanager
    def group(self, gid: str | None = None, clip: str | None = None, **attrs):
        a = (f" id={quoteattr(gid)}" if gid else "") + (f' clip-path="url(#{clip})"' if clip else "")
        a += "".join(f" {k.replace('_', '-')}={quoteattr(str(v))}" for k, v in attrs.items())
        self.add(f"<g{a}>")
        yield
        self.add("</g>")

    def clip_rect(self, box) -> str:
        """A clip path of the rectangle ``box``; returns its id."""
        self._clips += 1
        cid = f"clip{self._clips}"
        self.defs.append(f'<clipPath id="{cid}"><rect x="{num(box[0])}" y="{num(box[1])}" '
                         f'width="{num(box[2] - box[0])}" height="{num(box[3] - box[1])}"/></clipPath>')
        return cid

    def polyline(self, pts, color, width=1.0, dash=(), opacity=None, gid=None) -> None:
        d = "M" + "L".join(f"{num(x)} {num(y)}" for x, y in pts)
        self.add(f'<path{_id(gid)} d="{d}" fill="none" stroke="{color}" stroke-width="{num(width)}"'
                 f'{dash_attr(dash, width)}{_op("stroke-opacity", opacity)} stroke-linecap="butt"/>')

    def line(self, x0, y0, x1, y1, color, width=1.0, dash=(), opacity=None, gid=None) -> None:
        self.polyline([(x0, y0), (x1, y1)], color, width, dash, opacity, gid)

    def rect(self, x0, y0, x1, y1, fill="none", stroke=None, width=0.0, opacity=None, rx=0.0, title=None,
             gid=None) -> None:
        s = f' stroke="{stroke}" stroke-width="{num(width)}"' if stroke and width else ""
        body = f"><title>{escape(title)}</title></rect>" if title else "/>"
        self.add(f'<rect{_id(gid)} x="{num(x0)}" y="{num(y0)}" width="{num(max(x1 - x0, 0))}" '
                 f'height="{num(max(y1 - y0, 0))}" fill="{fill}"{s}{_op("fill-opacity", opacity)}'
                 f'{f" rx={quoteattr(num(rx))}" if rx else ""}{body}')

    def marker(self, shape, x, y, size, face, edge="none", width=0.0, alpha=None, title=None) -> None:
        """A marker of ``size`` points (diameter); ``face`` "none" for a ring."""
        s = f' stroke="{edge}" stroke-width="{num(width)}"' if edge != "none" and width else ""
        body = f"><title>{escape(title)}</title></path>" if title else "/>"
        self.add(f'<path d="{marker_path(shape, x, y, size)}" fill="{face}"{s}{_op("opacity", alpha)}{body}')

    def text(self, x, y, text, size, color=TEXT_COLOR, ha="left", va="baseline", rotation=0.0, gid=None,
             boxed=False) -> tuple:
        """Draw ``text`` anchored at (x, y) (``ha`` left/center/right, ``va`` top/center/bottom/baseline), turned
        ``rotation`` degrees counter-clockwise about its anchor; ``boxed``: on a white box. Returns its box."""
        lines, x0, top, w, h = _layout(text, size, ha, va)
        box = text_box(x, y, text, size, ha, va, rotation)
        self.texts.append((gid or str(text), text_quad(x, y, text, size, ha, va, rotation)))
        turn = f' transform="rotate({num(-rotation)} {num(x)} {num(y)})"' if rotation else ""
        out = [f"<g{_id(gid)}{turn}>"]
        if boxed:
            p = BOX_PAD * size
            out.append(f'<rect x="{num(x + x0 - p)}" y="{num(y + top - p)}" width="{num(w + 2 * p)}" '
                       f'height="{num(h + 2 * p)}" rx="{num(p)}" fill="#ffffff" fill-opacity="0.85"/>')
        base = y + top + ASCENT * size
        for i, s in enumerate(lines):
            lx = x + x0 + {"left": 0.0, "center": (w - text_width(s, size)) / 2,
                           "right": w - text_width(s, size)}[ha]
            out.append(f'<text x="{num(lx)}" y="{num(base + i * LINE * size)}" font-size="{num(size)}" '
                       f'fill="{color}">{escape(s)}</text>')
        out.append("</g>")
        self.add("".join(out))
        return box

    def to_string(self) -> str:
        w, h = num(self.width), num(self.height)
        defs = f"<defs>{''.join(self.defs)}</defs>" if self.defs else ""
        return (f'<?xml version="1.0" encoding="utf-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="{w}pt" '
                f'height="{h}pt" viewBox="0 0 {w} {h}" version="1.1" font-family="{FONT_FAMILY}">'
                f'<rect width="{w}" height="{h}" fill="#ffffff"/>{defs}' + "\n".join(self.parts) + "</svg>\n")


def _id(gid) -> str:
    return f" id={quoteattr(gid)}" if gid else ""


def _op(name, v) -> str:
    return f' {name}="{num(v)}"' if v is not None and v < 1 else ""


# ------------------------------------------------------------------------------------------------ scales, ticks

@dataclass(frozen=True)
class LogScale:
    lo: float
    hi: float
    a: float        # point coordinate of lo
    b: float        # ... and of hi

    def __call__(self, v: float) -> float:
        v = max(v, 1e-300)
        return self.a + (self.b - self.a) * (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) -
                                                                                   math.log10(self.lo))

    @property
    def per_decade(self) -> float:
        """Points per decade (signed: negative for a y axis that grows up)."""
        return (self.b - self.a) / (math.log10(self.hi) - math.log10(self.lo))


@dataclass(frozen=True)
class LinearScale:
    lo: float
    hi: float
    a: float
    b: float

    def __call__(self, v: float) -> float:
        return self.a + (self.b - self.a) * (v - self.lo) / ((self.hi - self.lo) or 1.0)


def log_ticks(lo: float, hi: float, stride: int = 1) -> tuple:
    """(major, minor) ticks of a log axis over [lo, hi]: a major tick every ``stride`` decades; minor ticks at 2 and
    5 of each decade (``reports.palette.MINOR_LOG_SUBS``), or at the decades left unlabelled when ``stride`` > 1."""
    from .palette import MINOR_LOG_SUBS

    k0, k1 = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    decades = list(range(k0, k1 + 1))
    major = [10.0 ** k for k in decades if (k - k0) % stride == 0]
    if stride > 1:
        minor = [10.0 ** k for k in decades if (k - k0) % stride]
    else:
        minor = [m * 10.0 ** k for k in range(k0 - 1, k1 + 1) for m in MINOR_LOG_SUBS if lo <= m * 10.0 ** k <= hi]
    return major, minor


def linear_ticks(lo: float, hi: float, most: int = 10) -> list:
    """At most ``most`` + 1 ticks over [lo, hi] at a step of 1, 2, 2.5 or 5 x 10^k (matplotlib's MaxNLocator)."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / most
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    return [round(i * step, 15) for i in range(first, int(math.floor(hi / step + 1e-9)) + 1)]


def fitting_stride(values, labels, scale, size: float, vertical: bool) -> int:
    """The smallest decade stride at which the tick labels (at ``scale(v)``) leave a gap between neighbours."""
    for stride in range(1, len(values) + 1):
        pts = [(scale(v), t) for i, (v, t) in enumerate(zip(values, labels)) if i % stride == 0]
        need = [(LINE * size if vertical else text_width(t, size)) for _, t in pts]
        if all(abs(pts[i + 1][0] - pts[i][0]) >= (need[i] + need[i + 1]) / 2 + size * 0.5
               for i in range(len(pts) - 1)):
            return stride
    return max(len(values), 1)


# ------------------------------------------------------------------------------------------------ axes

class Axes:
    """A plot area ``box`` (x0, y0, x1, y1 in points) on ``svg`` with an x and a y scale (LogScale/LinearScale)."""

    def __init__(self, svg: Svg, box, xscale, yscale):
        self.svg, self.box, self.x, self.y = svg, box, xscale, yscale
        self.clip = svg.clip_rect(box)

    def px(self, x: float, y: float) -> tuple:
        return self.x(x), self.y(y)

    def holds(self, px: float, py: float, slack: float = 1.0) -> bool:
        x0, y0, x1, y1 = self.box
        return x0 - slack <= px <= x1 + slack and y0 - slack <= py <= y1 + slack

    def grid(self, xs=(), ys=()) -> None:
        x0, y0, x1, y1 = self.box
        with self.svg.group("grid"):
            for v in xs:
                self.svg.line(self.x(v), y0, self.x(v), y1, GRID_COLOR, GRID_WIDTH)
            for v in ys:
                self.svg.line(x0, self.y(v), x1, self.y(v), GRID_COLOR, GRID_WIDTH)

    def spines(self, left: bool = True) -> None:
        x0, y0, x1, y1 = self.box
        with self.svg.group("spines"):
            self.svg.line(x0, y1, x1, y1, TEXT_COLOR, SPINE_WIDTH)
            if left:
                self.svg.line(x0, y0, x0, y1, TEXT_COLOR, SPINE_WIDTH)

    def xticks(self, major, labels, minor=(), gid="xticks") -> None:
        y1 = self.box[3]
        with self.svg.group(gid):
            for v in minor:
                self.svg.line(self.x(v), y1, self.x(v), y1 + MINOR_TICK, TEXT_COLOR, 0.6)
            for v, t in zip(major, labels):
                x = self.x(v)
                self.svg.line(x, y1, x, y1 + MAJOR_TICK, TEXT_COLOR, SPINE_WIDTH)
                self.svg.text(x, y1 + MAJOR_TICK + TICK_PAD, t, TICK_SIZE, ha="center", va="top",
                              gid=f"{gid}:{t}")

    def yticks(self, major, labels, minor=(), gid="yticks") -> None:
        x0 = self.box[0]
        with self.svg.group(gid):
            for v in minor:
                self.svg.line(x0 - MINOR_TICK, self.y(v), x0, self.y(v), TEXT_COLOR, 0.6)
            for v, t in zip(major, labels):
                y = self.y(v)
                self.svg.line(x0 - MAJOR_TICK, y, x0, y, TEXT_COLOR, SPINE_WIDTH)
                self.svg.text(x0 - MAJOR_TICK - TICK_PAD, y, t, TICK_SIZE, ha="right", va="center",
                              gid=f"{gid}:{t}")

    def xlabel(self, text: str, gap: float) -> tuple:
        """The x axis label centred ``gap`` points under the plot area."""
        x0, _, x1, y1 = self.box
        return self.svg.text((x0 + x1) / 2, y1 + gap, text, LABEL_SIZE, ha="center", va="top", gid="xlabel")

    def ylabel(self, text: str, x: float) -> tuple:
        """The y axis label, turned upright, its top at ``x``."""
        _, y0, _, y1 = self.box
        return self.svg.text(x, (y0 + y1) / 2, text, LABEL_SIZE, ha="center", va="top", rotation=90, gid="ylabel")

    def title(self, text: str, size: float = TITLE_SIZE) -> tuple:
        x0, y0, x1, _ = self.box
        return self.svg.text((x0 + x1) / 2, y0 - 6, text, size, ha="center", va="bottom", gid="title")


def tick_band(labels, size: float = TICK_SIZE) -> float:
    """Points the x tick labels take under the plot area (tick, pad, one line of text)."""
    return MAJOR_TICK + TICK_PAD + (ASCENT + DESCENT) * size if labels else MAJOR_TICK


def tick_width(labels, size: float = TICK_SIZE) -> float:
    """Points the y tick labels take left of the plot area."""
    return MAJOR_TICK + TICK_PAD + max((text_width(t, size) for t in labels), default=0.0)


def title_height(text: str, size: float = TITLE_SIZE) -> float:
    return text_extent(text, size)[1] + 6 if text else 0.0


# ------------------------------------------------------------------------------------------------ legend

@dataclass(frozen=True)
class Entry:
    """One legend row: ``kind`` "marker" (shape, face, edge, edge width, size pt), "line" (color, dash, width) or
    "patch" (color)."""

    label: str
    kind: str
    color: str = "#555555"
    shape: str = "o"
    edge: str = "none"
    edge_width: float = 0.0
    size: float = 6.0
    dash: tuple = ()
    width: float = 1.5


HANDLE, HANDLE_PAD, ROW_GAP, BORDER = 2.0, 0.8, 0.5, 0.4   # of the font size, as matplotlib's legend


def legend_size(entries, title: str = "", size: float = LEGEND_SIZE) -> tuple:
    """(width, height) of a legend box of ``entries``."""
    rows = [text_extent(e.label, size) for e in entries]
    w = (HANDLE + HANDLE_PAD) * size + max((r[0] for r in rows), default=0.0)
    if title:
        w = max(w, text_width(title, size))
    h = sum(max(r[1], e.size if e.kind == "marker" else 0) for r, e in zip(rows, entries))
    h += ROW_GAP * size * max(len(rows) - 1, 0) + (text_extent(title, size)[1] + ROW_GAP * size if title else 0)
    return w + 2 * BORDER * size, h + 2 * BORDER * size


def legend(svg: Svg, entries, x: float, y: float, *, title: str = "", frame: bool = True, size: float = LEGEND_SIZE,
           gid: str = "legend", align: str = "center") -> tuple:
    """Draw a legend whose top-left corner is (x, y), its title ``align``ed ("center", "left"); returns its box."""
    w, h = legend_size(entries, title, size)
    with svg.group(gid):
        if frame:
            svg.rect(x, y, x + w, y + h, fill="#ffffff", stroke="#cccccc", width=0.8, opacity=0.9, rx=2.5)
        cy = y + BORDER * size
        left = x + BORDER * size
        if title:
            tx = x + w / 2 if align == "center" else left
            svg.text(tx, cy, title, size, ha=align, va="top", gid=f"{gid}:title")
            cy += text_extent(title, size)[1] + ROW_GAP * size
        for e in entries:
            th = text_extent(e.label, size)[1]
            rh = max(th, e.size if e.kind == "marker" else 0)
            mid = cy + rh / 2
            hx = left + HANDLE * size / 2
            if e.kind == "marker":
                svg.marker(e.shape, hx, mid, e.size, e.color, e.edge, e.edge_width)
            elif e.kind == "line":
                svg.line(left, mid, left + HANDLE * size, mid, e.color, e.width, e.dash)
            else:
                svg.rect(left, mid - 0.35 * size, left + HANDLE * size, mid + 0.35 * size, fill=e.color)
            svg.text(left + (HANDLE + HANDLE_PAD) * size, mid, e.label, size, va="center", gid=f"{gid}:{e.label}")
            cy += rh + ROW_GAP * size
    return (x, y, x + w, y + h)


def leader(svg: Svg, box, px: float, py: float, color: str, shrink: float = 3.0, width: float = 0.6) -> None:
    """A thin line from the nearest point of a label's ``box`` to (px, py), stopped ``shrink`` points short."""
    bx = min(max(px, box[0]), box[2])
    by = min(max(py, box[1]), box[3])
    dx, dy = px - bx, py - by
    d = math.hypot(dx, dy)
    if d <= shrink:
        return
    svg.line(bx, by, px - dx / d * shrink, py - dy / d * shrink, color, width)
