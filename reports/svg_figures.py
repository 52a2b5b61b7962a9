"""The trace report's figures drawn by our own SVG writer (rendering only; no matplotlib).

``own_figures(rf, run)`` returns an ``SvgFigure`` (key, title, caption, SVG text, hover marks) for each of a trace's
figures this package draws itself: the roofline (``reports.svg_roofline``), measured against predicted
(``reports.svg_predicted``) and the GPU's idle timeline (``reports.svg_idle``), with the captions the matplotlib
figures carry (``reports.captions``, ``reports.idle_data.idle_caption``). ``reports.write_report`` writes them
as ``figures/<key>.svg``; a trace's other figures (the context curve, the interconnect) and the PNGs of
``roofline trace --png`` are still drawn by matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass

from .captions import predicted_caption, roofline_caption
from .figure_kinds import trace_figure_keys
from .idle_data import idle_caption

OWN = ("roofline", "predicted", "idle")     # the figures drawn here, by key


@dataclass(frozen=True)
class SvgFigure:
    key: str
    title: str
    caption: str
    svg: str
    marks: tuple = ()     # reports.hover.Mark, in the SVG's own units


def _roofline(rf, run):
    from .svg_roofline import roofline_svg

    svg, marks = roofline_svg(rf, run)
    return SvgFigure("roofline", "Roofline", roofline_caption(rf), svg, tuple(marks))


def _predicted(rf, run):
    from .svg_predicted import predicted_svg

    svg, marks = predicted_svg(rf, run)
    return SvgFigure("predicted", "Measured vs predicted", predicted_caption(rf), svg, tuple(marks))


def _idle(rf, run):
    from .svg_idle import idle_svg

    idle = rf.header.settings["idle"]
    return SvgFigure("idle", "GPU idle gaps by cause", idle_caption(idle), idle_svg(rf))


BUILD = {"roofline": _roofline, "predicted": _predicted, "idle": _idle}


def own_figures(rf, run: str) -> list:
    """The SvgFigures of a trace's report this package draws, in report order."""
    return [BUILD[k](rf, run) for k in trace_figure_keys(rf) if k in OWN]
