"""What a roofline marks and says, apart from how it is drawn (rendering only; no matplotlib).

``plotted(rf)``: the op results that belong on a FLOP/s roofline; ``step_markers(a)``: the steps drawn as their
own marker; ``point_labels(a, shown, above)``: the callouts (points above their roof, the headline steps'
verdicts) in the order they are placed; ``verdict_text``, ``ceilings_said``, ``ridge_text``: the words;
``predicted(a)``: the points of the predicted-vs-measured chart. The matplotlib figures (``reports.roofline_plot``,
``reports.time_plot``) and the trace report's own SVGs (``reports.svg_roofline``, ``reports.svg_predicted``) share
them, with the marker sizes (pt^2) and the ridge label's spots.
"""

from __future__ import annotations

import math

from roofline import units as U
from roofline.analysis import CACHE_RESIDENT, HOST_BUSY, UNRELIABLE, analyze

from .palette import ABOVE_ROOF_COLOR, MEASURED_COLOR


def plotted(result_file) -> list:
    """``OpResult``s that belong on a FLOP/s roofline: ok and with FLOPs."""
    return [r for r in analyze(result_file).results if r.ok and r.point.cost.flops > 0]


def zero_flop_ops(result_file) -> list[str]:
    """Names of measured ops that do no FLOPs (kept off the chart)."""
    return sorted({r.op for r in analyze(result_file).results if r.ok and r.point.cost.flops == 0
                   and not r.off_roof})


def context_size(context, lo: float = 128) -> float:
    """Marker area for a context length: grows with log2(context)."""
    return 16 + 9 * max(0.0, math.log2(max(context, 1) / lo))


def ceilings_said(header) -> str:
    """Which measured ceilings judge the run, as its header records them (``RunHeader.ceilings``): " (cached,
    quiet, 1 thread)", " (measured with the run, on a busy host, 2 threads)"; "" for a datasheet's."""
    c = header.ceilings or {}
    if not c or header.device.source != "measured":
        return ""
    parts = ["cached" if c.get("cached") else "measured with the run",
             "on a busy host" if HOST_BUSY in c.get("flags", ()) else "quiet"]
    threads = (c.get("cache_key") or {}).get("threads")
    if threads:
        parts.append(f"{threads} thread{'s' if threads > 1 else ''}")
    return " (" + ", ".join(parts) + ")"


WITHHELD = f"{UNRELIABLE}, no verdict (host-busy)"   # the table's word for a step whose verdict is withheld


def verdict_text(s) -> str:
    """A step's verdict in a few words: 'memory-bound', 'cache-resident (L3)', 'compute-bound (L3 roof)'; the
    withheld verdict of a step timed on a busy host (``Step.reliable``) is withheld here too."""
    if not s.reliable:
        return WITHHELD
    if s.label == CACHE_RESIDENT:
        return f"cache-resident ({s.roof.level_name})"
    return f"{s.label}-bound" + (f" ({s.roof.level_name} roof)" if s.roof.level_name else "")


STEP_SIZE = 190        # pt^2: a step's marker, well above any op's
MAX_STEP_MARKERS = 24  # more steps than this: only the headline steps (smallest and largest per phase) are marked
MAX_ABOVE_LABELS = 3   # points above their roof named on the chart (all are circled, and listed in the notes)


def step_markers(a) -> list:
    """The steps drawn as their own marker: all of them, or the headline steps of a large sweep."""
    ok = [s for s in a.steps if s.cost.flops > 0 and s.time_s > 0]
    if len(ok) <= MAX_STEP_MARKERS:
        return ok
    head = {id(s) for s in a.headline()}
    return [s for s in ok if id(s) in head]


def point_labels(a, shown, above) -> list:
    """[(name, (x, y), text, colour)] in the order they are placed: above-roof points (worst first), then the
    headline steps' verdicts."""
    out = []
    for r in sorted(above, key=lambda r: -r.roof_fraction)[:MAX_ABOVE_LABELS]:
        p = r.point
        out.append((f"above:{p.phase}:{p.op}:{p.batch}:{p.context}", (r.m.intensity, r.m.achieved_flops),
                    f"{p.op} b{p.batch} c{p.context}: {U.percent(r.roof_fraction)} of roof\n"
                    "(above roof: byte count or cache reuse)", ABOVE_ROOF_COLOR))
    head = {id(s) for s in a.headline()}
    several = len(a.backends) > 1
    for s in shown:
        if id(s) in head:
            on = f" {s.backend}" if several else ""
            q = "".join(f":{n}-{v}" for n, v in (("w", s.key.weight_dtype), ("kv", s.key.kv_dtype)) if v != s.dtype)
            out.append((f"step:{s.phase}:{s.backend}:{s.batch}:{s.context}{q}", (s.intensity, s.achieved_flops),
                        f"{s.phase} step{_where(s)}{on}: {verdict_text(s)}"
                        + (f", {U.percent(s.roof_fraction)}" if s.reliable else ""),
                        MEASURED_COLOR))
    return out


def _where(s) -> str:
    """' b8/ctx1024' after a step's phase; nothing for a forward of unknown phase (its ``where`` is its phase)."""
    rest = s.where[len(s.phase):] if s.where.startswith(s.phase) else " " + s.where
    return rest.rstrip()


# where the ridge label may sit, nearest first: (dx, dy) points from the ridge, ha, va. Above-left of the ridge is
# the usual spot; a ridge near the right edge puts it on the peak's label, so under the flat roof, right of the
# ridge, comes next (the slope runs below-left, where no spot is offered: the label would cross it)
RIDGE_SPOTS = ((-8, 6, "right", "bottom"), (8, -6, "left", "top"), (-8, 22, "right", "bottom"),
               (8, -22, "left", "top"), (-8, 38, "right", "bottom"))


def ridge_text(ridge) -> str:
    """'ridge 295 FLOP/byte (bf16)' for a ``RoofChart.ridge`` (intensity, peak, dtype)."""
    return f"ridge {U.intensity(ridge[0])} FLOP/byte ({ridge[2]})"


EDGE_PAD = 1.5   # a point stays at least this factor (0.18 decade) inside the predicted-vs-measured limits


def predicted(a) -> list:
    """The op results with a prediction to compare with (on the roofline, moving something)."""
    return [r for r in a.ok if not r.off_roof and r.predicted_s > 0]
