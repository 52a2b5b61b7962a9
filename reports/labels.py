"""Point labels that never overlap each other, the markers or the chart's other text (rendering only).

``place_labels(ax, wanted, markers)`` tries each label at ``OFFSETS`` around its point (nearest
first), measures the drawn text box, and keeps the first spot that stays inside the axes and
touches no marker, no label placed before it and no other text or legend on the axes; a leader
line joins label and point. A label with no free spot is left out (the point keeps its marker
and its row in the table): never drawn on top of something. Labels carry gid "point-label:<name>"
and stay out of the layout engine, so placing them cannot move the axes they were measured on.

Call it last, after everything else is on the axes, with marker boxes measured once the layout
is final (it runs the layout engine first unless told it just ran): the positions measured are
the ones drawn.

``run_labels(result_files)``: one distinct name per file of a report (its sections, its side-by-side legend).

``busy_line(analysis, steps)``: the second title line a chart of a run measured on a busy host carries (the
table's WARNING, short): how many of its steps have their verdict withheld.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from roofline.verdicts.comparison import differing_settings, setting_text

PAD = 2.0   # pixels kept clear around every label
OFFSETS = [(r * math.cos(math.radians(a)), r * math.sin(math.radians(a)))
           for r in (12, 24, 40, 60) for a in (45, 135, -45, -135, 90, -90, 0, 180)]   # points, nearest first


def boxes_hit(box, boxes: np.ndarray) -> bool:
    """Does ``box`` (x0, y0, x1, y1) intersect any row of ``boxes``?"""
    if not len(boxes):
        return False
    x0, y0, x1, y1 = box
    return bool(np.any((boxes[:, 0] < x1) & (boxes[:, 2] > x0) & (boxes[:, 1] < y1) & (boxes[:, 3] > y0)))


def marker_boxes(ax, xs, ys, area_pt2) -> np.ndarray:
    """Pixel boxes (x0, y0, x1, y1) of scatter markers at data (xs, ys) with areas in pt^2."""
    if not len(xs):
        return np.zeros((0, 4))
    px = ax.transData.transform(np.column_stack([xs, ys]))
    half = np.sqrt(np.broadcast_to(np.asarray(area_pt2, dtype=float), (len(px),))) / 2 * ax.figure.dpi / 72
    return np.column_stack([px[:, 0] - half, px[:, 1] - half, px[:, 0] + half, px[:, 1] + half])


def label_box(a, renderer) -> tuple:
    """Pixel extents of an annotation's text (its leader line left out)."""
    from matplotlib.text import Text

    a.update_positions(renderer)
    return tuple(Text.get_window_extent(a, renderer).extents)


def _text_boxes(ax, renderer) -> list:
    out = []
    for t in ax.texts:
        if t.get_visible() and t.get_text().strip():
            out.append(label_box(t, renderer) if hasattr(t, "update_positions") else
                       t.get_window_extent(renderer).extents)
    leg = ax.get_legend()
    if leg is not None and leg.get_visible():
        out.append(leg.get_window_extent(renderer).extents)
    return out


def place_labels(ax, wanted, markers, *, fontsize: float = 7.5, relayout: bool = True) -> list:
    """Place ``wanted`` = [(name, (x, y) data, text, color)] in order; returns the Annotations drawn.

    ``markers``: every marker the labels must avoid, as [(xs, ys, area pt^2)] in data coordinates
    (measured here, once the layout is final); ``relayout=False`` when the caller has just run the
    layout engine itself."""
    if not wanted:
        return []
    from .style import freeze_layout    # matplotlib: this module's other helpers need none

    fig = ax.figure
    if relayout:
        freeze_layout(fig)        # the labels are measured on this layout: solved once, kept for the save
    renderer = fig.canvas.get_renderer()
    area = ax.get_window_extent(renderer)
    taken = [np.asarray(b) for b in _text_boxes(ax, renderer)]
    boxes = [marker_boxes(ax, xs, ys, area) for xs, ys, area in markers]
    markers = np.vstack(boxes) if boxes else np.zeros((0, 4))
    placed = []
    for name, xy, text, color in wanted:
        for dx, dy in OFFSETS:
            ha = "left" if dx > 1 else "right" if dx < -1 else "center"
            va = "bottom" if dy > 1 else "top" if dy < -1 else "center"
            a = ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=fontsize,
                            color=color, zorder=7, gid=f"point-label:{name}",
                            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
                            arrowprops=dict(arrowstyle="-", color=color, lw=0.6, shrinkA=0, shrinkB=3))
            a.set_in_layout(False)
            x0, y0, x1, y1 = label_box(a, renderer)
            box = (x0 - PAD, y0 - PAD, x1 + PAD, y1 + PAD)
            inside = area.x0 <= box[0] and area.y0 <= box[1] and box[2] <= area.x1 and box[3] <= area.y1
            if inside and not boxes_hit(box, markers) and not boxes_hit(box, np.array(taken).reshape(-1, 4)):
                taken.append(np.array(box))
                placed.append(a)
                break
            a.remove()
    return placed


def busy_line(a, steps) -> str:
    """A second title line for a chart of ``steps`` when the run was measured on a busy host (``a.noisy``, the gate
    the table's WARNING reads): how many of them have their verdict withheld; "" on a quiet run."""
    if not a.noisy:
        return ""
    held = sum(not s.reliable for s in steps)
    return f"\nWARNING: busy machine (host-busy): {held} of {len(steps)} steps unreliable"


def run_labels(result_files) -> list[str]:
    """One legend label per file, all distinct: "device (results.jsonl)"; files that would share one are told
    apart by their folder ("device (run-a/results.jsonl)"), then by the recorded settings their headers differ in
    (``roofline.verdicts.comparison.differing_settings``: "threads=2"), then by their place in the list."""
    def base(rf, folder: bool) -> str:
        p = rf.path
        return f"{rf.header.device.name} ({p.parent.name + '/' if folder and p.parent.name else ''}{p.name})"
    out = [base(rf, False) for rf in result_files]
    for rule in ("folder", "settings", "index"):
        counts = Counter(out)
        dup = [i for i, x in enumerate(out) if counts[x] > 1]
        if not dup:
            break
        if rule == "folder":
            for i in dup:
                out[i] = base(result_files[i], True)
        elif rule == "settings":
            diff = differing_settings([result_files[i].header.settings for i in dup])
            for i in dup:
                st = result_files[i].header.settings
                if diff:
                    out[i] += " " + ", ".join(f"{k}={setting_text(st.get(k))}" for k in diff)
        else:
            for n, i in enumerate(dup):
                out[i] += f" #{n + 1}"
    return out
