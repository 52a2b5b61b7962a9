"""One figure of a report: its file stem, title, matplotlib figure and caption.

Every figure builder returns these (``reports.figures``, ``reports.idle_plot``, ``reports.compare_report``);
``reports.style.save`` writes the figure, the HTML and markdown pages show the title and caption.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReportFigure:
    key: str        # file stem: "roofline", "time_decode", ...
    title: str
    figure: object  # matplotlib Figure
    caption: str
