"""One figure of a report: its file stem, title, matplotlib figure and caption; and what is left of it once drawn.

Every matplotlib figure builder returns a ``ReportFigure`` (``reports.figures``, ``reports.idle_plot``,
``reports.compare_report``); ``reports.style.save`` writes the figure. ``Drawn`` is what the HTML and markdown
pages need of a figure on disk (title, caption, hover marks), whoever drew it (``reports.render`` for matplotlib,
``reports.svg_figures`` for the trace report's own SVGs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReportFigure:
    key: str        # file stem: "roofline", "time_decode", ...
    title: str
    figure: object  # matplotlib Figure
    caption: str


@dataclass(frozen=True)
class Drawn:
    """What the HTML and markdown need of a figure once it is on disk."""

    key: str
    title: str
    caption: str
    marks: tuple = ()   # reports.hover.Mark: where its explained points sit in the SVG
