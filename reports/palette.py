"""The report's colours, markers and limits: plain values, no matplotlib (rendering only).

Shared by the matplotlib figures (``reports.style`` re-exports every name here) and the trace report's own SVG
figures (``reports.svg`` and the ``svg_*`` modules), so both draw a point, a phase and a verdict tag alike.
"""

from __future__ import annotations

from roofline.analysis import SKIPPED, UNCOSTED, UNRELIABLE
from roofline.bounds import CACHE_RESIDENT, COMMUNICATION, COMPUTE, MEMORY, OVERHEAD

# a forward of unknown phase (a trace that does not tell it, a counters run's launches: no batch or context)
PHASE_MARKER = {"decode": "o", "prefill": "^", "forward": "p", "verify": "s"}   # verify: speculative decoding's
UNSIZED_COLOR = "#4d4d4d"   # a point with no batch (batch 0: a forward of unknown phase) is not coloured by batch
PHASE_LINESTYLE = {"decode": "-", "prefill": "--"}
BATCH_CMAP = "viridis"
DEVICE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
# Beyond this many markers (or bars) in one chart, a vector image is megabytes and seconds to draw: the
# markers are rasterized inside the SVG (axes, roofs and labels stay vector) and per-bar labels are thinned.
RASTER_ABOVE = 2000
MAX_BAR_LABELS = 48
MEASURED_COLOR = "#222222"
DATASHEET_COLOR = "#888888"
ABOVE_ROOF_COLOR = "#d62728"
LABEL_ZORDER = 6   # a ridge's label is drawn above every marker (points 3, steps 4.5, stars 5)

# the HTML report's verdict tags (white text on these): every label a step or op can be told, and the words that
# stand in for a verdict (roofline.analysis.UNRELIABLE, SKIPPED, ...); a label not named here gets TAG_DEFAULT
TAG_COLORS = {MEMORY: "#1f77b4", COMPUTE: "#d62728", OVERHEAD: "#7f7f7f", CACHE_RESIDENT: "#6a51a3",
              COMMUNICATION: "#8c564b", UNRELIABLE: "#b8860b", SKIPPED: "#9a9a9a", UNCOSTED: "#5f6f7f"}
TAG_DEFAULT = "#555555"


def tag_css() -> str:
    """CSS classes for the HTML verdict tags: one background per ``TAG_COLORS`` label, ``TAG_DEFAULT`` for any
    other, so no tag is white on white."""
    return (f".tag{{background:{TAG_DEFAULT}}}"
            + "".join(f".tag.{name}{{background:{color}}}" for name, color in TAG_COLORS.items()))


# a trace's ops are coloured by what they are (roofline.traces.cost categories)
CATEGORY_COLORS = {"gemm": "#1f77b4", "attention": "#d62728", "norm": "#2ca02c", "activation": "#9467bd",
                   "rope": "#8c564b", "kv_write": "#e377c2", "elementwise": "#ff7f0e", "reduction": "#bcbd22",
                   "softmax": "#17becf", "copy": "#7f7f7f", "cast": "#aaaaaa", "gather": "#98df8a",
                   "scatter": "#c5b0d5", "fill": "#c7c7c7", "moe": "#393b79", "quantize": "#dbdb8d"}
OTHER_CATEGORY_COLOR = "#555555"


def category_color(category: str):
    return CATEGORY_COLORS.get(category, OTHER_CATEGORY_COLOR)


def category_legend(categories) -> list:
    """[(category, colour)] for a legend of the ``categories`` drawn: those with a colour in ``CATEGORY_COLORS``'s
    order, then any other (a rule of your own's) in grey, by name."""
    cats = set(categories)
    return ([(c, col) for c, col in CATEGORY_COLORS.items() if c in cats]
            + [(c or "uncategorised", OTHER_CATEGORY_COLOR) for c in sorted(cats - set(CATEGORY_COLORS))])


# A handful of batch sizes reads best as distinct colours in a legend; a colour ramp only past this many.
CATEGORICAL_BATCHES = 8
BATCH_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")  # tab10,
#                                                                 less its red (above-roof) and grey (ceilings)


def batch_palette(batches) -> dict | None:
    """{batch: colour} for up to CATEGORICAL_BATCHES distinct batch sizes (in order), else None (use the ramp)."""
    bs = sorted(set(batches))
    if len(bs) > CATEGORICAL_BATCHES:
        return None
    return {b: BATCH_COLORS[i] for i, b in enumerate(bs)}


def device_color(i: int) -> str:
    return DEVICE_COLORS[i % len(DEVICE_COLORS)]


# minor ticks of a log axis at 2 and 5 of each decade (matplotlib's default: 2..9): a roofline spans ten decades
# or more, and each minor tick is four artists to build, lay out and draw (a trace report 25% less CPU)
MINOR_LOG_SUBS = (2.0, 5.0)
