"""The markdown summary written beside the HTML report: verdicts, ceilings, step table,
notes, links to the figures (the PNGs; a trace report's own SVGs, ``ReportData.link``), run metadata and the
cost conventions.

``render(report, out_dir) -> str``; figure links are relative to ``out_dir``.
"""

from __future__ import annotations

from pathlib import Path

from . import trace_section
from .html import conventions_text, latency_only, used_dtypes
from .tables import PHASE_COLUMNS, ceiling_rows, phase_rows


def cell(text: str) -> str:
    """Table-safe and HTML-safe: markdown viewers render inline HTML, so a ``<`` could open a
    tag; escaping it alone keeps ">= ridge" readable as plain text. Pipes would split cells."""
    return str(text).replace("<", "&lt;").replace("|", "\\|").replace("\n", " ")


def md_table(columns, rows) -> list[str]:
    out = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def rel_path(p: Path, out_dir: Path) -> str:
    try:
        return p.relative_to(out_dir).as_posix()
    except ValueError:
        return p.as_posix()


def _linked(paths: dict, fmt: str) -> Path:
    """The file of a figure report.md links: ``fmt`` ("png", or "svg" for a trace's own SVGs) where it was written."""
    return paths.get(fmt) or paths.get("svg") or paths["png"]


def render(report, out_dir: Path) -> str:
    lines = ["# Roofline report", ""]
    lines += [f"> {cell(n)}" for n in report.notes] + ([""] if report.notes else [])
    for run in report.runs:
        h = run.rf.header
        lines += [f"## {cell(run.name)}", "",
                  f"{cell(h.model_name)} on {cell(h.device.name)} ({h.dtype}); {len(run.rf.measurements)} "
                  f"measurements from {cell(run.rf.path)}.", ""]
        if not latency_only(run.rf):
            lines += md_table(("ceiling", "used to classify", "datasheet", "used / datasheet"),
                            ceiling_rows(h, used_dtypes(run.rf))) + [""]
        if trace_section.is_trace(run.rf):
            lines += ["**Where the traced time went**", ""]
            lines += [f"- {cell(f)}" for f in trace_section.trace_facts(run.analysis)] + [""]
            lines += md_table(trace_section.TOP_COLUMNS, [[t for t, _ in r] for r in
                                                        trace_section.top_rows(run.analysis)]) + [""]
        if run.steps:
            lines += ["**Verdicts**", ""] + [f"- **{s.verdict}**: {cell(s.sentence)}" for s in run.analysis.headline()]
            lines += ["", "<details><summary>Every step of the sweep</summary>", ""]
            cols = PHASE_COLUMNS                    # a file with quantized steps: their dtypes beside each row
            if any(s.quant for s in run.steps):
                cols = PHASE_COLUMNS[:4] + ("dtype",) + PHASE_COLUMNS[4:]
            lines += md_table(cols, [[t for t, _ in r] for r in phase_rows(run.steps, cols)])
            lines += ["", "</details>", ""]
        lines += [f"- {cell(n)}" for n in run.notes] + ([""] if run.notes else [])
        for fig, paths in run.figures:
            lines += [f"![{cell(fig.title)}]({rel_path(_linked(paths, report.link), out_dir)})", "",
                      f"*{cell(fig.caption)}*", ""]
        lines += [f"Command: {cell(h.command) or '-'}  ", f"Started: {cell(h.started) or '-'}, git "
                  f"{cell(h.git_sha[:12]) or '-'}; versions: "
                  f"{cell(', '.join(f'{k} {v}' for k, v in h.versions.items())) or '-'}", ""]
    for fig, paths in report.compare:
        link = rel_path(_linked(paths, report.link), out_dir)
        lines += ["## Runs side by side", "", f"![{cell(fig.title)}]({link})", "",
                  f"*{cell(fig.caption)}*", ""]
    lines += ["## Cost conventions", "", "```", conventions_text(), "```", ""]
    if any(trace_section.is_trace(r.rf) for r in report.runs):
        lines += ["### How a trace's ops are costed", "", "```", trace_section.conventions(), "```", ""]
    return "\n".join(lines)
