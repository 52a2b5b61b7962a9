"""The idle timeline's colours, what it names and the words under it (rendering only; no matplotlib).

Shared by the matplotlib timeline (``reports.idle_plot``) and the trace report's own SVG (``reports.svg_idle``):
``timeline_of(rf)`` the timeline a result file holds, ``annotated`` the gaps named on the strip, ``gap_label``,
``merged_text``, ``zoom_title`` and ``idle_caption`` their words; the colours (Okabe-Ito for the causes, safe
for colour-blind readers) and the strip's geometry in its axes' units.
"""

from __future__ import annotations

from roofline import units as U
from roofline.traces.idle import CAUSES, MAX_GAPS, NO_OP

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


def gap_label(gap: dict) -> str:
    """What a gap's callout says: where the CPU was (or the gap's cause), then its length."""
    op = gap.get("cpu_op") or ""
    what = "CPU between ops (Python)" if op == NO_OP else f"CPU in {op}" if op else gap["cause"]
    if len(what) > LABEL_CHARS:
        what = what[:LABEL_CHARS - 3] + "..."
    return f"{what}\n{U.seconds(gap['gap_s'])}"


def strip_title(idle: dict) -> str:
    """'GPU idle 177 us of a 400 us window (44%), each gap by its cause'."""
    window, total = idle["timeline"]["window_s"], idle.get("idle_s") or 0.0
    head = f"GPU idle {U.seconds(total)} of a {U.seconds(window)} window"
    return head + (f" ({U.percent(total / window)})" if window else "") + ", each gap by its cause"


def strip_legend(idle: dict, busy_s: float | None = None) -> list:
    """[(colour, text)] of the strip's legend: busy time, each cause's idle time (the whole trace's) and share of
    the idle time, each phase shaded ("under a pixel here" when its widest range is narrower than one)."""
    line = idle["timeline"]
    window = line["window_s"]
    by = idle.get("by_cause_s") or {}
    total = idle.get("idle_s") or 0.0
    busy_total = busy_s if busy_s is not None else max(window - total, 0.0)
    out = [(BUSY_COLOR, f"busy: {U.seconds(busy_total)}")]
    out += [(CAUSE_COLORS[c], f"{c}: {U.seconds(by.get(c, 0.0))}"
             + (f" ({U.percent(by.get(c, 0.0) / total)} of idle)" if total else "")) for c in CAUSES]
    widest: dict = {}
    for s, e, p in line.get("phases", []):
        widest[p] = max(widest.get(p, 0.0), e - s)
    out += [(PHASE_COLORS.get(p, "#d0d0d0"), f"phase: {p}" + (" (under a pixel here)" if w < window / MAX_GAPS else ""))
            for p, w in widest.items()]
    return out


def zoom_legend(zoom: dict) -> list:
    """[(colour, text)] of the zoom's legend ("in this window"): its kernels and each cause's idle time there."""
    out = [(KERNEL_SHADES[0], f"kernel / copy ({len(zoom.get('kernels') or []):,}, shades alternate)")]
    out += [(CAUSE_COLORS[c], f"{c}: " + U.seconds(sum(e - s for s, e, k in zoom["gaps"] if k == c))) for c in CAUSES]
    return out


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
