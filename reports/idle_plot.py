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
from roofline.traces.idle import CAUSES, MAX_GAPS, NO_OP

from .report_figure import ReportFigure
from .style import new_figure, styled

BUSY_COLOR = "#555555"
CAUSE_COLORS = {"host-bound": "#E69F00", "synchronisation": "#CC79A7", "other": "#56B4E9"}   # Okabe-Ito
PHASE_COLORS = {"prefill": "#b8b8b8", "decode": "#e2e2e2", "forward": "#cfcfcf"}
ANNOTATED = 3            # the largest gaps named on the strip (the HTML lists ten)
APART = 0.04            # ... and no two closer than this share of the window (their labels would collide)
LABEL_CHARS = 34
HAIRLINE, HAIRLINE_UP_TO = 0.4, 200   # gap edge width (points), drawn while there are at most this many gaps
MAX_PHASE_LINES = 50    # phase boundaries drawn across the strip up to this many phase ranges
STRIP = (0.0, 1.0)       # y extent of the strip
BAND = (1.12, 0.28)      # y extent of the phase band above it
KERNEL_SHADES = ("#555555", "#8c8c8c")   # neighbouring kernels on the zoom alternate, so each one shows
ZOOM_MARK = "#000000"


def timeline_of(rf) -> dict:
    """The idle timeline a result file holds, {} when it holds none (a CPU trace, an older file)."""
    st = rf.header.settings if isinstance(rf.header.settings, dict) else {}
    line = (st.get("idle") or {}).get("timeline") or {}
    return line if line.get("window_s") else {}


def has_idle_timeline(rf) -> bool:
    return rf.header.kind == "trace" and bool(timeline_of(rf))


def annotated(idle: dict, window: float) -> list:
    """The largest gaps to name on the strip: at most ANNOTATED, none within APART of the window of another."""
    out: list = []
    for gap in idle.get("largest") or []:
        x = gap["at_s"] + gap["gap_s"] / 2
        if all(abs(x - (g["at_s"] + g["gap_s"] / 2)) > APART * window for g in out):
            out.append(gap)
        if len(out) == ANNOTATED:
            break
    return out


def _label(gap: dict) -> str:
    op = gap.get("cpu_op") or ""
    what = "CPU between ops (Python)" if op == NO_OP else f"CPU in {op}" if op else gap["cause"]
    if len(what) > LABEL_CHARS:
        what = what[:LABEL_CHARS - 3] + "..."
    return f"{what}\n{U.seconds(gap['gap_s'])}"


def merged_text(line: dict) -> str:
    """'simplified: 1,234 gap(s) shorter than 80 us (2.1 ms idle: ...) are drawn as busy; ...' or ''."""
    n, dropped = line.get("merged_gaps", 0), line.get("phases_dropped", 0)
    out = []
    if n:
        shortest = min((e - s for s, e, _ in line["gaps"]), default=0.0)
        by = line.get("merged_by_cause_s") or {}
        parts = ", ".join(f"{c} {U.seconds(by[c])}" for c in CAUSES if by.get(c))
        out.append(f"{n:,} gap(s) shorter than {U.seconds(shortest)} ({U.seconds(line['merged_s'])} idle"
                   + (f": {parts}" if parts else "") + ") are drawn as busy; the legend's totals include them")
    if dropped:
        out.append(f"{dropped:,} phase range(s) narrower than a pixel are not shaded")
    return ("simplified: " + "; ".join(out)) if out else ""


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
    by = idle.get("by_cause_s") or {}
    total = idle.get("idle_s") or 0.0
    busy_total = busy_s if busy_s is not None else max(window - total, 0.0)
    handles = [Patch(color=BUSY_COLOR, label=f"busy: {U.seconds(busy_total)}")]
    handles += [Patch(color=CAUSE_COLORS[c], label=f"{c}: {U.seconds(by.get(c, 0.0))}"
                      + (f" ({U.percent(by.get(c, 0.0) / total)} of idle)" if total else "")) for c in CAUSES]
    widest: dict = {}
    for s, e, p in line.get("phases", []):
        widest[p] = max(widest.get(p, 0.0), e - s)
    handles += [Patch(color=PHASE_COLORS.get(p, "#d0d0d0"), label=f"phase: {p}"
                      + (" (under a pixel here)" if w < window / MAX_GAPS else "")) for p, w in widest.items()]
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
    head = f"GPU idle {U.seconds(total)} of a {U.seconds(window)} window"
    ax.set_title(title or (head + (f" ({U.percent(total / window)})" if window else "") + ", each gap by its cause"))
    return ax


def zoom_title(zoom: dict) -> str:
    """'Zoom: decode steps 1,499-1,501 (the median step by GPU time and its neighbours): idle 120 us of 1.2 ms (10%)'."""
    steps = zoom.get("steps") or []
    span = zoom["end_s"] - zoom["start_s"]
    idle = sum(e - s for s, e, _ in zoom["gaps"])
    if steps:
        phases = list(dict.fromkeys(p for _, _, p, _ in steps))
        nums = [n for *_, n in steps]
        what = (f"{phases[0]} steps {nums[0]:,}-{nums[-1]:,}" if len(phases) == 1
                else ", ".join(f"{p} {n:,}" for _, _, p, n in steps))
        why = "the median step by GPU time and its neighbours"
    else:
        what, why = f"{len(zoom['gaps'])} gaps", "around the middle of the trace; no annotation marks a step"
    return (f"Zoom: {what} ({why}): idle {U.seconds(idle)} of {U.seconds(span)}"
            + (f" ({U.percent(idle / span)})" if span else ""))


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
    handles = [Patch(facecolor=KERNEL_SHADES[0], label=f"kernel / copy ({len(kernels):,}, shades alternate)")]
    handles += [Patch(color=CAUSE_COLORS[c], label=f"{c}: " + U.seconds(sum(e - s for s, e, k in zoom["gaps"]
                                                                            if k == c))) for c in CAUSES]
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


def idle_caption(idle: dict) -> str:
    line = idle["timeline"]
    cap = ("The GPU's timeline from its first activity to its last: grey is busy (the union of kernels and copies on "
           "every stream), each gap is coloured by why the GPU waited. Host-bound: the next launch call started "
           "after the GPU went idle (the GPU waited for the CPU; the label names the CPU op it was in). "
           "Synchronisation: a blocking host call (stream/device/event sync, a synchronous copy) overlapped the gap. "
           "Other: the next work was already queued (another stream, an event, launch latency). The legend's totals "
           "are the whole trace's.")
    if 0 < len(line["gaps"]) <= HAIRLINE_UP_TO:
        cap += " Every gap is drawn at least a hairline wide."
    if line.get("phases"):
        cap += (" The band above the strip: where the GPU ran the work launched inside the prefill/decode annotations "
                "(consecutive steps of one phase joined).")
    note = merged_text(line)
    if note:
        cap += f" {note[0].upper()}{note[1:]} (at most {len(line['gaps']):,} gaps are drawn, the longest)."
    if line.get("zoom"):
        how = ("the median step by GPU time (of the phase with the most steps) and its neighbours"
               if line["zoom"].get("steps") else "the gaps around the middle of the trace (no annotation marks a step)")
        cap += (f" Below: a zoom on {how}, boxed on the strip: every kernel and copy (neighbours in alternating "
                "greys) and every gap at its true width, nothing folded; the label names the window's largest gap.")
    return cap


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
