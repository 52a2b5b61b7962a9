"""Which figures a result file's report holds, asked without drawing (rendering only; no matplotlib).

``has_collectives`` (measured collectives with their sizes: the interconnect figure), ``has_context_curve`` (a
model with linear-attention or sparse layers: decode against context beside its dense counterpart) and
``has_idle_timeline`` (a GPU trace's idle gaps): ``reports.figures.figure_builders`` and the trace report's own
SVG figures (``reports.svg_figures``) ask the same questions.
"""

from __future__ import annotations

from roofline.analysis import COMMUNICATION, analyze
from roofline.context_curve import linear_kind

from .idle_data import has_idle_timeline  # noqa: F401


def collective_points(rf) -> list:
    """(message bytes, bus bandwidth, op, rank) of every ok collective measurement with its sizes recorded."""
    out = []
    for r in analyze(rf).results:
        if not (r.ok and r.off_roof == COMMUNICATION):
            continue
        d = r.m.config.get("detail", {})
        msg, wire = d.get("message_bytes"), d.get("wire_bytes")
        if msg and wire and r.instance_s > 0:
            out.append((float(msg), wire / r.instance_s, r.op, r.m.rank))
    return out


def has_collectives(rf) -> bool:
    return bool(collective_points(rf))


def has_context_curve(rf) -> bool:
    """Whether the header's model has layers a dense counterpart is drawn against."""
    m = getattr(rf.header, "model", None)
    return m is not None and bool(linear_kind(m))


def trace_figure_keys(rf) -> list:
    """The figures of a trace's report, in report order (as ``reports.figures.figure_builders`` builds them):
    the roofline and, with a costed op to compare, predicted against measured; then the context curve, the idle
    timeline and the interconnect where the file has them."""
    from .roof_points import predicted

    a = analyze(rf)
    out = ["roofline"] + (["predicted"] if predicted(a) else []) if a.ok else []
    return out + [k for k, has in (("context", has_context_curve), ("idle", has_idle_timeline),
                                   ("interconnect", has_collectives)) if has(rf)]
