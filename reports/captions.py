"""The captions under the roofline and the predicted-vs-measured figures (rendering only; no matplotlib).

One text per figure, whichever draws it: the matplotlib figures (``reports.figures``) and the trace report's own
SVG figures (``reports.svg_figures``) put the same words under the same chart.
"""

from __future__ import annotations

from roofline.analysis import analyze

from .palette import RASTER_ABOVE
from .roof_points import plotted, step_markers, zero_flop_ops

# past RASTER_ABOVE points a chart's markers are raster and its hover targets bounded (reports.hover)
BOUNDED_NOTE = (f" Over {RASTER_ABOVE:,} points: in the HTML report only the steps and the points above their roof "
                "explain themselves on hover; the points table lists every one.")


def roofline_caption(rf) -> str:
    dev = rf.header.device
    zero = zero_flop_ops(rf)
    above = [r for r in plotted(rf) if r.above_roof]
    trace = rf.header.kind == "trace"
    if not trace:
        cap = (f"{len(plotted(rf))} measured points at (arithmetic intensity, achieved FLOP/s = FLOPs / median time); "
               "error bars span the p20-p80 times. Marker shape: phase; colour: batch; size: context. ")
    else:
        cap = (f"{len(plotted(rf))} traced ops (one point per op and shape) at (arithmetic intensity, achieved FLOP/s = "
               "FLOPs / mean instance time); error bars span the p20-p80 instance times. Marker shape: phase; colour: "
               "op category; area: share of the traced time. Uncosted ops and collectives are not on the chart. ")
    cap += (f"Solid: the ceilings used to classify ({dev.source}; a dtype it did not measure keeps its datasheet "
            "figure); dashed: the datasheet's. "
            "Vector ops (norms, rope, residuals, swiglu) compute in fp32 and sit under the fp32 roof.")
    steps = step_markers(analyze(rf))
    if steps:
        n_all = sum(1 for s in analyze(rf).steps if s.cost.flops > 0)
        cap += (" Large black-edged markers: each phase step (its ops summed: the step's intensity and FLOPs / step "
                "time), " + ("every step" if len(steps) == n_all else f"the {len(steps)} headline steps of {n_all}")
                + "; the smallest and largest per phase carry their verdict (\"no verdict\" for a step timed on a "
                "busy host).")
    if zero:
        cap += (f" {', '.join(zero)} do no FLOPs, so they cannot sit on a FLOP/s roofline: they are left off "
                "this chart and appear in the table with their bytes/s.")
    if above:
        cap += (f" {len(above)} point(s) circled in red run above their roof: that is a counting error or cache "
                "reuse (e.g. data served from L2), not a win.")
    if len(plotted(rf)) > RASTER_ABOVE:
        cap += BOUNDED_NOTE
    note = analyze(rf).noise_note       # the table's WARNING first: what to do for numbers to trust
    return (f"WARNING: {note} " if note else "") + cap


def predicted_caption(rf) -> str:
    cap = ("Each op instance's median time against the roofline's prediction with this file's ceilings: "
           "max(FLOPs / peak, bytes / bandwidth). On the diagonal an op runs at its roof; above the dashed "
           "line it runs under a quarter of it. Points below the diagonal beat the roof (circled): check "
           "the byte count or cache reuse. Circles: decode; triangles: prefill"
           + ("; pentagons: a forward of unknown phase (a counters run's kernel launches, a trace's forward)."
              if any(r.point.phase == "forward" for r in analyze(rf).ok) else "."))
    if len(analyze(rf).ok) > RASTER_ABOVE:
        cap += BOUNDED_NOTE
    return cap
