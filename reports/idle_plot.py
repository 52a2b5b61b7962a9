"""A trace's GPU timeline: busy time and every idle gap coloured by its cause.

``plot_idle(ax, idle, busy_s)`` draws one horizontal strip over the GPU window (x: time from the
first GPU activity): busy time in one colour, each gap in its cause's (host-bound, synchronisation,
other: Okabe-Ito colours, safe for colour-blind readers), the legend giving each cause's total idle
time; the phases the trace's annotations mark shaded in a band above the strip (dashed lines where one hands over);
the largest gaps annotated with the CPU op the host was in (or their cause). ``idle_figure(rf)``
wraps it for a report.

``plot_zoom(ax, idle)`` draws the timeline's ``zoom`` (a few consecutive steps, nothing folded) under the strip:
each kernel in alternating greys, each gap in its cause's colour at its true width, the steps in a band above, the
window's largest gap named with its CPU op; the strip marks where the zoom lies. A long trace's figure holds both.

Rendering never measures: everything comes from the result file's ``settings["idle"]`` (what
``roofline.traces.idle.idle_causes`` wrote, its ``timeline`` included). A file with no timeline (a CPU
trace, or one written before the timeline existed) gets no figure. When the timeline folded short
gaps into busy time (``merged_gaps``) the figure says so under the strip, and the caption repeats it.
Artists carry gids ("idle:busy", "idle:host-bound", ..., "idle:phase:decode", "idle:note", "idle:zoom-mark";
on the zoom "zoom:busy", "zoom:kernels", "zoom:host-bound", ..., "zoom:step:decode", "zoom:largest") so tests read
back what was drawn.
"""

from __future__ import annotations

from matplotlib.patches import Patch

from roofline import units as U
from roofline.traces.idle import CAUSES

from .idle_data import (ANNOTATED, APART, BAND, BUSY_COLOR, CAUSE_COLORS, HAIRLINE, HAIRLINE_UP_TO,  # noqa: F401
                        KERNEL_SHADES, LABEL_CHARS, MAX_PHASE_LINES, PHASE_COLORS, STRIP, ZOOM_MARK, annotated,
                        has_idle_timeline, idle_caption, merged_text, strip_legend, strip_title, timeline_of,
                        zoom_legend, zoom_title)
from .idle_data import gap_label as _label
from .report_figure import ReportFigure
from .style import new_figure, styled

@styled
def plot_idle(ax, idle: dict, busy_s: float | None = None, *, title: str | None = None):
    """Draw the idle timeline of ``idle`` (a result file's ``settings["idle"]``); returns ``ax``."""
    line = idle["timeline"]
    window = line["window_s"]
    h0, h = STRIP
    phases = line.get("phases", [])
    for s, e, phase in phases:
        color = PHASE_COLORS.get(phase, "#d0d0d0")
        ax.broken_barh([(s, e - s)], BAND, facecolors=color, edgecolors="white", linewidths=0.5, zorder=1,
                       gid=f"idle:phase:{phase}")
        if (e - s) / window > 0.06:
            ax.text((s + e) / 2, BAND[0] + BAND[1] / 2, phase, ha="center", va="center", fontsize=8, zorder=2)
    if 1 < len(phases) <= MAX_PHASE_LINES:         # where one phase hands over to the next, across the strip
        ax.vlines([s for s, _, _ in phases[1:]], h0, BAND[0] + BAND[1], colors="#333333", linewidths=0.6,
                  linestyles=(0, (2, 2)), zorder=4, gid="idle:phase-boundary")
    busy = line.get("busy", [])
    ax.broken_barh([(s, e - s) for s, e in busy], STRIP, facecolors=BUSY_COLOR, linewidths=0, zorder=2,
                   gid="idle:busy")
    gaps = line.get("gaps", [])
    # a few gaps: each at least a hairline wide (a gap narrower than a pixel still shows); many: their true width
    # (a hairline each would paint a dense strip as all idle)
    edge = HAIRLINE if len(gaps) <= HAIRLINE_UP_TO else 0.0
    for cause in CAUSES:
        bars = [(s, e - s) for s, e, c in gaps if c == cause]
        ax.broken_barh(bars, STRIP, facecolors=CAUSE_COLORS[cause], edgecolors=CAUSE_COLORS[cause], linewidths=edge,
                       zorder=3, gid=f"idle:{cause}")
    zoom = line.get("zoom")
    if zoom:                                          # where the zoom below lies: a line at least 1.5 points wide
        ax.broken_barh([(zoom["start_s"], zoom["end_s"] - zoom["start_s"])], (h0 - 0.08, h + 0.16), facecolors="none",
                       edgecolors=ZOOM_MARK, linewidths=1.5, zorder=5, gid="idle:zoom-mark")
        x = (zoom["start_s"] + zoom["end_s"]) / 2
        left = x < 0.5 * window
        ax.annotate("zoomed below", (x, h0 + h), xytext=(4 if left else -4, 1), textcoords="offset points",
                    ha="left" if left else "right", va="bottom", fontsize=7, zorder=5, gid="idle:zoom-text")
    for i, gap in enumerate(annotated(idle, window)):
        x = gap["at_s"] + gap["gap_s"] / 2
        y = h0 - 0.35 - 0.55 * i                      # stagger under the strip so neighbours do not overlap
        ha = "left" if x < 0.25 * window else "right" if x > 0.75 * window else "center"
        ax.annotate(_label(gap), xy=(x, h0), xytext=(x, y), ha=ha, va="top", fontsize=7.5, zorder=4,
                    arrowprops={"arrowstyle": "-", "color": "#333333", "lw": 0.7}, gid="idle:largest")
    handles = [Patch(color=c, label=t) for c, t in strip_legend(idle, busy_s)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, borderaxespad=0)
    note = merged_text(line)
    if note:
        ax.text(0.0, -0.30, note, transform=ax.transAxes, ha="left", va="top", fontsize=7.5, color="#aa0000",
                gid="idle:note")
    bottom = h0 - 0.35 - 0.55 * len(annotated(idle, window)) - 0.5
    ax.set_ylim(min(bottom, -0.2), BAND[0] + BAND[1] + 0.1 if line.get("phases") else h + 0.1)
    ax.set_xlim(0.0, window)
    ax.set_yticks([])
    ax.grid(False, axis="y")
    ax.spines["left"].set_visible(False)
    ax.xaxis.set_major_formatter(lambda v, _: U.seconds(v) if v else "0")
    ax.set_xlabel("time from the first GPU activity")
    ax.set_title(title or strip_title(idle))
    return ax


@styled
def plot_zoom(ax, idle: dict):
    """Draw the timeline's ``zoom`` (x: time from the zoom's start); returns ``ax``."""
    zoom = idle["timeline"]["zoom"]
    t0 = zoom["start_s"]
    span = zoom["end_s"] - t0
    h0, h = STRIP
    steps = zoom.get("steps") or []
    for phase in dict.fromkeys(p for _, _, p, _ in steps):
        ax.broken_barh([(s - t0, e - s) for s, e, p, _ in steps if p == phase], BAND, edgecolors="white",
                       facecolors=PHASE_COLORS.get(phase, "#d0d0d0"), linewidths=1.0, zorder=1,
                       gid=f"zoom:step:{phase}")
    for s, e, phase, n in steps:
        if (min(e, zoom["end_s"]) - max(s, t0)) / span > 0.08:
            ax.text((max(s, t0) + min(e, zoom["end_s"])) / 2 - t0, BAND[0] + BAND[1] / 2, f"{phase} step {n:,}",
                    ha="center", va="center", fontsize=7.5, zorder=2)
    ax.broken_barh([(s - t0, e - s) for s, e in zoom["busy"]], STRIP, facecolors=BUSY_COLOR, linewidths=0, zorder=2,
                   gid="zoom:busy")
    kernels = zoom.get("kernels") or []
    ax.broken_barh([(s - t0, e - s) for s, e in kernels], STRIP, zorder=3, gid="zoom:kernels",
                   facecolors=[KERNEL_SHADES[i % 2] for i in range(len(kernels))], edgecolors="white",
                   linewidths=0.3)
    for cause in CAUSES:
        bars = [(s - t0, e - s) for s, e, c in zoom["gaps"] if c == cause]
        ax.broken_barh(bars, STRIP, facecolors=CAUSE_COLORS[cause], edgecolors=CAUSE_COLORS[cause],
                       linewidths=HAIRLINE, zorder=4, gid=f"zoom:{cause}")
    big = zoom.get("largest")
    if big:
        x = big["at_s"] + big["gap_s"] / 2 - t0
        ha = "left" if x < 0.25 * span else "right" if x > 0.75 * span else "center"
        text = (f"largest gap here ({big['cause']}): " if big.get("cpu_op") else "largest gap here: ") + _label(big)
        ax.annotate(text, xy=(x, h0), xytext=(x, h0 - 0.35), ha=ha, va="top",
                    fontsize=7.5, zorder=5, arrowprops={"arrowstyle": "-", "color": "#333333", "lw": 0.7},
                    gid="zoom:largest")
    handles = [Patch(color=c, label=t) for c, t in zoom_legend(zoom)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, borderaxespad=0,
              title="in this window", title_fontsize=8, alignment="left")
    if zoom.get("kernels_cut"):
        ax.text(0.0, -0.30, f"cut: the window ends after {len(kernels):,} kernels ({zoom['kernels_cut']:,} more in "
                "its steps are not drawn)", transform=ax.transAxes, ha="left", va="top", fontsize=7.5,
                color="#aa0000", gid="zoom:note")
    ax.set_ylim(h0 - 1.0 if big else -0.2, BAND[0] + BAND[1] + 0.1 if zoom.get("steps") else h + 0.1)
    ax.set_xlim(0.0, span)
    ax.set_yticks([])
    ax.grid(False, axis="y")
    ax.spines["left"].set_visible(False)
    ax.xaxis.set_major_formatter(lambda v, _: U.seconds(v) if v else "0")
    ax.set_xlabel(f"time from the zoom's start ({U.seconds(t0)} on the strip above)")
    ax.set_title(zoom_title(zoom), fontsize=10)
    return ax


def idle_figure(rf) -> ReportFigure:
    st = rf.header.settings
    idle = st["idle"]
    top = 2.9 if idle["timeline"].get("phases") else 2.6
    if idle["timeline"].get("zoom"):
        fig, (ax, zax) = new_figure(12, top + 2.4, nrows=2, height_ratios=[top, 2.4])
        plot_zoom(zax, idle)
    else:
        fig, ax = new_figure(12, top)
    plot_idle(ax, idle, (st.get("gpu_time") or {}).get("busy_s"))
    return ReportFigure("idle", "GPU idle gaps by cause", fig, idle_caption(idle))
