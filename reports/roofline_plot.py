"""The roofline chart: ceilings, the ridge, and one point per measured op.

``plot_roofline(ax, result_file)`` draws on log-log axes (x: arithmetic intensity in
FLOP/byte, y: FLOP/s):

* ceilings used for classification solid, datasheet ceilings dashed, each labelled with
  value, unit and source; every bandwidth roof runs up to its elbow with the highest peak
  drawn, every peak from its own elbow to the right;
* the ridge of the run's dtype (peak / bandwidth) marked with its FLOP/byte value;
* each ok measurement with FLOPs at (intensity, achieved FLOP/s): marker shape = phase,
  colour = batch (one colour each, in the legend, for up to ``CATEGORICAL_BATCHES`` sizes; a
  log ramp with a colour bar beyond), size = context; error bars from the p20/p80 times. A
  trace (header kind "trace") has one batch and context per phase: its points are coloured by
  op category and sized by their share of the traced time (area);
* each phase's step (``roofline.analysis.Step``: its ops summed) as a larger marker of the
  phase's shape with a black edge at (step intensity, step FLOPs / step time): all steps, or
  the headline ones (smallest and largest per phase) past ``MAX_STEP_MARKERS``; the headline
  steps are labelled with their verdict (``Step.reliable`` false: "unreliable, no verdict", as the table says; a
  busy run's title says how many steps that is);
* a point above its roof circled in red and named: a counting error or cache reuse;
* a point with no batch (batch 0: a forward of unknown phase, a counters run's launches) in one colour, off the
  batch and context legends;
* the legend says which measured ceilings judged the run (``ceilings_said``: cached or measured with it, quiet
  or busy, its threads);
* the device's cache levels (``Device.cache_levels``: a CPU's L2 and L3, a GPU's L2) as extra
  bandwidth roofs, dash-dotted, one per level ("ceiling:cache:L3"), as in Nsight Compute's
  hierarchical roofline: a point judged against a level (``roofline.analysis``: cache-resident)
  sits under that roof, not above the DRAM one.

Labels are placed by ``reports.labels.place_labels``: never over each other, a marker or other
text (one without a free spot is left out). Every point and step is registered with
``reports.hover`` (beyond ``RASTER_ABOVE`` points only the steps and above-roof points), so the
HTML report can explain each on hover.

0-FLOP ops (embedding, kv_append) are left off (``zero_flop_ops`` names them for the
caption). Artists carry gids ("ceiling:bandwidth:measured", "ridge:bf16", "points:decode",
"steps:decode", "above-roof", "point-label:...") so tests read back what was drawn. Rendering
never measures.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.cm import ScalarMappable
from matplotlib.lines import Line2D

from roofline import units as U
from roofline.analysis import analyze, level_points

from . import hover
from .hover import marker_radius
from .labels import boxes_hit, busy_line, label_box, marker_boxes, place_labels
from .roof_geometry import CACHE_ROOF_COLOR, DASHES, roof_chart
from .roof_points import (MAX_ABOVE_LABELS, MAX_STEP_MARKERS, RIDGE_SPOTS, STEP_SIZE, WITHHELD,  # noqa: F401
                          ceilings_said, context_size, plotted, point_labels, ridge_text, step_markers, verdict_text,
                          zero_flop_ops)
from .style import (ABOVE_ROOF_COLOR, BATCH_CMAP, CATEGORY_COLORS, DATASHEET_COLOR, LABEL_ZORDER, MEASURED_COLOR,
                    PHASE_MARKER, RASTER_ABOVE, UNSIZED_COLOR, batch_palette, category_color, freeze_layout, log_log,
                    styled)


BATCH_CMAP_OBJ = matplotlib.colormaps[BATCH_CMAP]
CACHE_ROOF_STYLE = (0, DASHES["cache"])


def _label(ax, x, y, text, color, gid, *, va="bottom", ha="left"):
    t = ax.text(x, y, text, color=color, fontsize=7.5, va=va, ha=ha, gid=gid, zorder=5,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    return t


def _line_style(roof):
    dash = DASHES[roof.style]
    return (0, dash) if dash else "-"


def draw_ceilings(ax, header, dtypes, xs, ys) -> tuple:
    """Log-log axes holding points (xs, ys), the ceilings of ``header``'s device for ``dtypes`` and its ridge
    (``reports.roof_geometry.roof_chart``: where each goes); returns (datasheet ceilings drawn, bandwidth labels to
    align with ``align_to_slope``)."""
    chart = roof_chart(header, dtypes, xs, ys)
    log_log(ax)
    ax.set_xlim(chart.x_lo, chart.x_hi)
    ax.set_ylim(chart.y_lo, chart.y_hi)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(lambda v, _: U.si(v, "FLOP/s"))
    slope_labels = []
    for r in chart.roofs:
        ax.plot(list(r.xs), list(r.ys), color=r.color, ls=_line_style(r), lw=r.width, gid=r.gid)
        if r.along_slope:
            slope_labels.append(ax.text(*r.label_xy, r.label, color=r.color, fontsize=7.5, va=r.va, ha=r.ha,
                                        rotation_mode="anchor", zorder=5, gid=r.label_gid))
        else:
            _label(ax, *r.label_xy, r.label, r.color, r.label_gid, ha=r.ha, va=r.va)
    if chart.ridge is not None:
        ridge, peak, dtype = chart.ridge
        ax.plot([ridge], [peak], marker="D", ms=6, color=MEASURED_COLOR, ls="none", zorder=6, gid=f"ridge:{dtype}")
        ax.plot([ridge, ridge], [chart.y_lo, peak], color=MEASURED_COLOR, lw=0.7, ls=":", zorder=1)
        ax.annotate(ridge_text(chart.ridge), (ridge, peak), xytext=(-8, 6), textcoords="offset points", fontsize=8,
                    color=MEASURED_COLOR, ha="right", gid=f"ridge-label:{dtype}", zorder=LABEL_ZORDER,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    return list(chart.sheet), slope_labels


LEVEL_MARKERS = {"L2": "s", "L1": "D"}   # Nsight Compute's hierarchical roofline: one point per memory level


def _counter_levels(ax, ms, device, boxes) -> list:
    """A counters run (``roofline counters``): each launch's L2 and L1 points beside its DRAM one (the same FLOP/s
    over that level's bytes; ``analysis.level_points``), joined to it by a thin line. Returns legend handles."""
    seen = set()
    for r in ms:
        pts = level_points(r, device)
        dram = next(((x, y) for lv, x, y, _ in pts if lv == "DRAM"), None)
        for lv, x, y, _ in pts:
            if lv == "DRAM" or lv not in LEVEL_MARKERS:
                continue
            ax.scatter([x], [y], marker=LEVEL_MARKERS[lv], s=30, facecolors="none", edgecolors=MEASURED_COLOR,
                       linewidths=0.9, zorder=3.5, gid=f"level:{lv}")
            if dram is not None:
                ax.plot([dram[0], x], [dram[1], y], color=MEASURED_COLOR, lw=0.5, alpha=0.5, zorder=3)
            boxes.append(([x], [y], 30))
            seen.add(lv)
    return [Line2D([], [], marker=LEVEL_MARKERS[lv], ls="none", mfc="none", mec=MEASURED_COLOR, ms=6,
                   label=f"{lv} bytes (counters)") for lv in LEVEL_MARKERS if lv in seen]


@styled
def plot_roofline(ax, result_file, *, colorbar: bool = True, title: str | None = None):
    """Draw ``result_file`` on ``ax`` (see the module docstring); returns ``ax``."""
    header = result_file.header
    dev = header.device
    ms = plotted(result_file)   # OpResult: .m the Measurement, .roof_fraction, .above_roof, .bound
    dtypes = sorted({r.point.compute_dtype for r in ms} | {header.dtype})
    sheet, slope_labels = draw_ceilings(ax, header, dtypes, [r.m.intensity for r in ms],
                                        [r.m.achieved_flops for r in ms])
    raster = len(ms) > RASTER_ABOVE
    a = analyze(result_file)
    index = hover.result_index(a)
    # batch 0 is no batch (a forward of unknown phase: a counters run's launches): not in the colours or legend
    sized = [b for b in {r.point.batch for r in ms} if b > 0]
    batches = sorted(sized) or [1]
    norm = LogNorm(vmin=batches[0], vmax=max(batches[-1], batches[0] * 2))
    trace = header.kind == "trace"
    palette = None if trace or not sized else batch_palette(batches)   # a handful: one colour each, in a legend

    def color(b):
        return UNSIZED_COLOR if b <= 0 else palette[b] if palette else BATCH_CMAP_OBJ(norm(b))
    ctx_lo = max(min((r.point.context for r in ms if r.point.context > 0), default=128), 1)
    total = sum(r.time_s for r in ms) or 1.0
    boxes = []
    for phase, marker in PHASE_MARKER.items():
        sel = [r for r in ms if r.point.phase == phase]
        if not sel:
            continue
        x = np.array([r.m.intensity for r in sel])
        y = np.array([r.m.achieved_flops for r in sel])
        lo = np.array([r.point.cost.flops / r.m.p80_s for r in sel])
        hi = np.array([r.point.cost.flops / r.m.p20_s for r in sel])
        ax.errorbar(x, y, yerr=[np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)], fmt="none",
                    ecolor="#9a9a9a", elinewidth=0.6, capsize=0, zorder=2, gid=f"errorbars:{phase}",
                    rasterized=raster)
        if trace:   # colour: op category; area: share of the traced time
            size = [18 + 900 * r.time_s / total for r in sel]
            ax.scatter(x, y, c=[category_color(r.m.config.get("category", "")) for r in sel], marker=marker,
                       s=size, edgecolors="white", linewidths=0.4, alpha=0.85, zorder=3, gid=f"points:{phase}",
                       rasterized=raster)
        else:
            size = [context_size(r.point.context, ctx_lo) for r in sel]
            ax.scatter(x, y, marker=marker, s=size, edgecolors="white", linewidths=0.4, alpha=0.9, zorder=3,
                       gid=f"points:{phase}", rasterized=raster, c=[color(r.point.batch) for r in sel])
        boxes.append((x, y, size))
        keep = [i for i, r in enumerate(sel) if not raster or r.above_roof]   # a bounded overlay for large files
        hover.register(ax, x[keep], y[keep], [("p", index[id(sel[i])]) for i in keep],
                       marker_radius(np.asarray(size)[keep]), priority=raster)

    shown = step_markers(a)
    step_index = {id(s): j for j, s in enumerate(a.steps)}
    for phase, marker in PHASE_MARKER.items():
        sel = [s for s in shown if s.phase == phase]
        if not sel:
            continue
        x = np.array([s.intensity for s in sel])
        y = np.array([s.achieved_flops for s in sel])
        face = ["#ffffff" if trace else color(s.batch) for s in sel]
        ax.scatter(x, y, marker=marker, s=STEP_SIZE, c=face, edgecolors=MEASURED_COLOR, linewidths=1.8, zorder=4.5,
                   gid=f"steps:{phase}")
        boxes.append((x, y, STEP_SIZE))
        hover.register(ax, x, y, [("s", step_index[id(s)]) for s in sel], marker_radius(STEP_SIZE), priority=True)

    level_handles = _counter_levels(ax, ms, header.device, boxes)

    above = [r for r in ms if r.above_roof]
    if above:
        ax.scatter([r.m.intensity for r in above], [r.m.achieved_flops for r in above], s=150, facecolors="none",
                   edgecolors=ABOVE_ROOF_COLOR, linewidths=1.4, zorder=4, gid="above-roof")
        boxes.append(([r.m.intensity for r in above], [r.m.achieved_flops for r in above], 150))

    legend_out = False
    if colorbar and sized and not trace and not palette:
        cb = ax.figure.colorbar(ScalarMappable(norm=norm, cmap=BATCH_CMAP), ax=ax, pad=0.01, aspect=30)
        cb.set_label("batch")
        cb.set_ticks(batches)
        cb.set_ticklabels([str(b) for b in batches])
        cb.minorticks_off()
    handles = [Line2D([], [], marker=PHASE_MARKER[p], ls="none", color="#555555", label=p, ms=6)
               for p in PHASE_MARKER if any(r.point.phase == p for r in ms)]
    handles += [Line2D([], [], marker=PHASE_MARKER[p], ls="none", mfc="white", mec=MEASURED_COLOR, mew=1.8, ms=10,
                       label=f"{p} step (its ops summed)") for p in PHASE_MARKER if any(s.phase == p for s in shown)]
    handles += level_handles
    ctxs = [] if trace else sorted({r.point.context for r in ms if r.point.context > 0})
    if trace:
        for cat in [c for c in CATEGORY_COLORS if any(r.m.config.get("category") == c for r in ms)]:
            handles.append(Line2D([], [], marker="o", ls="none", color=category_color(cat), ms=6, label=cat))
    if palette and colorbar:
        legend_out = True
        handles += [Line2D([], [], marker="s", ls="none", color=palette[b], ms=7, label=f"batch {b:,}")
                    for b in batches]
    for c in ctxs[:1] + ctxs[-1:] if len(ctxs) > 1 else ctxs:
        handles.append(Line2D([], [], marker="o", ls="none", color="#bbbbbb",
                              ms=math.sqrt(context_size(c, ctx_lo)), label=f"context {c:,}"))
    handles.append(Line2D([], [], color=MEASURED_COLOR, label=f"{dev.source} ceilings{ceilings_said(header)}"))
    if sheet:
        handles.append(Line2D([], [], color=DATASHEET_COLOR, ls=(0, (5, 3)), label="datasheet ceilings"))
    if dev.cache_levels:
        handles.append(Line2D([], [], color=CACHE_ROOF_COLOR, ls=CACHE_ROOF_STYLE,
                              label="cache roofs (" + ", ".join(c.name for c in dev.cache_levels) + ")"))
    if above:
        handles.append(Line2D([], [], marker="o", mfc="none", mec=ABOVE_ROOF_COLOR, ls="none", ms=9,
                              label=f"above its roof ({len(above)})"))
    if legend_out:   # outside the axes: it can cover no point
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    else:
        ax.legend(handles=handles, loc="lower right", frameon=True, framealpha=0.9)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title((title or f"Roofline: {header.model_name} on {dev.name}") + busy_line(a, a.steps))
    align_to_slope(ax, slope_labels)
    clear_ridge_label(ax, boxes, relayout=not slope_labels)     # else align_to_slope laid out
    place_labels(ax, point_labels(a, shown, above), boxes, relayout=False)
    return ax


def clear_ridge_label(ax, markers=(), *, relayout: bool = True):
    """Move the ridge label to the first of ``RIDGE_SPOTS`` inside the axes that touches no other text, no legend
    and (where one is free of them) no marker of ``markers`` [(xs, ys, area pt^2)]; measured once the layout is
    final (run here unless ``relayout`` is False: the caller just ran it). Returns the label (None: no ridge)."""
    label = next((t for t in ax.texts if (t.get_gid() or "").startswith("ridge-label:")), None)
    if label is not None:
        label.set_in_layout(False)       # placing it cannot move the axes it was measured on
    fig = ax.figure
    if relayout:
        freeze_layout(fig)               # what is placed from here on is measured on this layout: solved once
    if label is None:
        return None
    renderer = fig.canvas.get_renderer()
    area = ax.get_window_extent(renderer)
    others = [label_box(t, renderer) if hasattr(t, "update_positions") else t.get_window_extent(renderer).extents
              for t in ax.texts if t is not label and t.get_visible() and t.get_text().strip()]
    leg = ax.get_legend()
    if leg is not None and leg.get_visible():
        others.append(leg.get_window_extent(renderer).extents)
    others = np.array(others, dtype=float).reshape(-1, 4)
    marks = [marker_boxes(ax, xs, ys, a) for xs, ys, a in markers]
    marks = np.vstack(marks) if marks else np.zeros((0, 4))

    def fits(spot, avoid_markers) -> bool:
        dx, dy, ha, va = spot
        label.xyann = (dx, dy)
        label.set_ha(ha)
        label.set_va(va)
        x0, y0, x1, y1 = label_box(label, renderer)
        inside = area.x0 <= x0 and area.y0 <= y0 and x1 <= area.x1 and y1 <= area.y1
        return inside and not boxes_hit((x0, y0, x1, y1), others) and not (avoid_markers and boxes_hit(
            (x0, y0, x1, y1), marks))

    for avoid_markers in (True, False):
        for spot in RIDGE_SPOTS:
            if fits(spot, avoid_markers):
                return label
    fits(RIDGE_SPOTS[0], False)          # nowhere clear: the usual spot
    return label


def align_to_slope(ax, texts, *, final: bool = True):
    """Rotate bandwidth labels to lie along their (slope 1, log-log) roof on screen, on the figure's layout solved
    here: kept (``style.freeze_layout``, no second solve when it is saved) unless ``final`` is False (the caller
    adds what moves the axes, then aligns again)."""
    if not texts:
        return
    fig = ax.figure
    engine = fig.get_layout_engine()
    if final:
        freeze_layout(fig)
    elif engine is not None:
        engine.execute(fig)
    (x0, y0), (x1, y1) = ax.transData.transform([(1.0, 1.0), (10.0, 10.0)])
    angle = math.degrees(math.atan2(y1 - y0, x1 - x0))
    for t in texts:
        t.set_rotation(angle)
