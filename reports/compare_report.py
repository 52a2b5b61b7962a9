"""``roofline compare`` written out: compare.json, report.html, report.md and the before/after figure.

    from reports.compare_report import write_compare
    w = write_compare("before.jsonl", "after.jsonl", "roofline-compare")
    w.comparison.steps, w.findings, w.paths["html"], w.paths["json"], w.paths["png:change"]

Rendering only: the comparison is ``roofline.verdicts.comparison.compare`` (files read once, through
``roofline.analysis``), its verdicts ``roofline.verdicts.diagnosis.change_findings``. The HTML is one
self-contained file like ``report.html`` (figure inlined, every point of the chart explained on
hover from its table row, sortable and filterable tables, no script or style from the network).
``compare.json`` (``roofline.verdicts.compare_file``) records the two files and the comparison's numbers;
``roofline diagnose compare.json`` re-reads the two files from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape
from pathlib import Path

from roofline.verdicts.compare_file import comparison_dict
from roofline.verdicts.comparison import compare
from roofline.verdicts.diagnosis import change_findings
from roofline.errors import RooflineError
from roofline.records import ResultFile, read_results

from .html import HOVER_HINT, figure_html, filter_controls, html_table, page
from .markdown import cell, md_table, rel_path
from .report_figure import ReportFigure
from .compare_tables import (LATENCY_COLUMNS, OP_COLUMNS, OP_TIP, STEP_COLUMNS, STEP_TIP, latency_rows, op_rows,
                             step_rows, unmatched_lines)

def _e(x) -> str:
    return escape(str(x), quote=True)


def _load(x) -> ResultFile:
    return x if isinstance(x, ResultFile) else read_results(x)


def change_figure(c):
    """The before/after roofline as a ``reports.report_figure.ReportFigure`` (None when nothing has FLOPs)."""
    from .compare_plot import MAX_ARROWS, plot_change   # matplotlib: deferred, reading results needs none
    from .style import new_figure

    if not any(o.after.point.cost.flops > 0 for o in c.ops):
        return None
    fig, ax = new_figure(11, 6.6)
    plot_change(ax, c)
    cap = ("Each matched op at (arithmetic intensity, FLOPs / median time): hollow grey before, filled after, "
           "coloured by its verdict (green faster, red slower, grey no change: inside both files' p20-p80 noise or "
           "under 3%), with an arrow from before to after. Large circles: each phase step (its ops summed). "
           "Ceilings: the after file's device.")
    if len(c.ops) > MAX_ARROWS:
        cap += f" Arrows for the {MAX_ARROWS} largest moves only."
    return ReportFigure("change", "Before and after on the roofline", fig, cap)


@dataclass
class Written:
    comparison: object   # roofline.verdicts.comparison.Comparison
    findings: list       # roofline.verdicts.findings.Finding (roofline.verdicts.change_rules)
    paths: dict          # "html", "markdown", "json", "png:change", "svg:change" -> Path


def write_compare(before, after, out_dir="roofline-compare", *, across_models: bool = False) -> Written:
    """Compare ``after`` against ``before`` and write compare.json, report.html, report.md and the figure."""
    from .render import render   # matplotlib: deferred, reading results needs none

    c = compare(_load(before), _load(after), across_models=across_models)
    findings = change_findings(c)
    out = Path(out_dir)
    paths = {"html": out / "report.html", "markdown": out / "report.md", "json": out / "compare.json"}
    for p in paths.values():
        if p.is_dir():
            raise RooflineError(f"{p} is a folder, so the comparison cannot be written there: give another --out.")
    try:
        (out / "figures").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RooflineError(f"cannot create the output folder {out}: {e.strerror}.") from None
    figs = render([("", lambda: [f for f in (change_figure(c),) if f])], out / "figures")[0]
    for fig, fp in figs:
        paths.update({f"{fmt}:{fig.key}": q for fmt, q in fp.items()})
    try:
        paths["json"].write_text(json.dumps(comparison_dict(c, findings, out, across_models), indent=1,
                                            allow_nan=False) + "\n", encoding="utf-8")
        paths["html"].write_text(render_html(c, findings, figs), encoding="utf-8")
        paths["markdown"].write_text(render_markdown(c, findings, figs, out), encoding="utf-8")
    except OSError as e:
        raise RooflineError(f"cannot write the comparison into {out}: {e.strerror or e}.") from None
    return Written(c, findings, paths)


def _title(c) -> str:
    return f"Before and after: {c.after.header.model_name} on {c.after.header.device.name}"


def render_html(c, findings, figs) -> str:
    def name_of(k):
        if k.kind == "t":
            return f"t-{k.index}", f"{c.steps[k.index].title} (step)"
        return f"c-{k.index}", c.ops[k.index].title

    body = [f"<h1>{_e(_title(c))}</h1>",
            f'<p class="sub">before <code>{_e(c.before.rf.path)}</code> &rarr; after <code>{_e(c.after.rf.path)}'
            f"</code>{(' &middot; changed: ' + _e(c.change_text)) if c.change_text else ''}</p>"]
    body += [f'<div class="note">{_e(n)}</div>' for n in c.notes]
    items = "".join(f"<li><b>{_e(f.claim)}</b><br><span class='sub'>{_e(f.evidence)}</span>"
                    + (f"<br>try: {_e(f.action)}" if f.action else "") + "</li>" for f in findings)
    body.append(f'<div class="card"><h3>Verdicts</h3><ul class="verdicts">{items}</ul></div>')
    if c.steps:
        table = html_table(STEP_COLUMNS, step_rows(c), text_cols=("phase", "backend", "verdict", "vs prediction", "label",
                                                             "ops differ"),
                       row_attrs=lambda j: f' id="t-{j}"', tip=STEP_TIP)
        body.append("<h2>Steps (largest time saved or lost per step first)</h2>"
                    f'<div class="scroll">{table}</div>')
    for fig, fp in figs:
        body.append(f'<h2>{_e(fig.title)}</h2><p class="sub">{_e(HOVER_HINT)}</p>')
        body.append(figure_html(fig, fp, name_of))
    if c.ops:
        verdicts = sorted({c.verdict_of(o.time) for o in c.ops})
        phases = sorted({o.after.point.phase for o in c.ops})
        controls = filter_controls("filter: op, verdict...", phases, verdicts, "verdicts")

        def attrs(k):
            o = c.ops[k]
            cls = {"slower": " class='warn'"}.get(c.verdict_of(o.time), "")
            return f' id="c-{k}" data-phase="{_e(o.after.point.phase)}" data-label="{_e(c.verdict_of(o.time))}"{cls}'
        table = html_table(OP_COLUMNS, op_rows(c), table_id="points", row_attrs=attrs, tip=OP_TIP,
                       text_cols=("phase", "op", "backend", "dtype", "verdict", "label"))
        body.append(f"<h2>Ops ({len(c.ops)} matched; largest time saved or lost per step first)</h2>"
                    f'<p class="sub">Speed-up = before / after time per step; range from both files\' p20-p80 '
                    "samples; a range holding 1x, or a move under 3%, is no change.</p>"
                    f'{controls}<div class="scroll">{table}</div>')
    if c.latency:
        table = html_table(LATENCY_COLUMNS, latency_rows(c), text_cols=("configuration", "metric", "percentile",
                                                                   "verdict"))
        body.append("<h2>Latency percentiles</h2><p class='sub'>Each percentile's range: p20-p80 of where it lies "
                    "given the requests (distribution-free); an upper bound for p90 needs 16 values, for p99 161 "
                    f"(unbounded otherwise).</p><div class='scroll'>{table}</div>")
    lines = unmatched_lines(c)
    if lines:
        body.append("<h2>Not compared</h2>" + "".join(f'<div class="note">{_e(x)}</div>' for x in lines))
    return page(_title(c), body)


def render_markdown(c, findings, figs, out: Path) -> str:
    lines = [f"# {cell(_title(c))}", "", f"Before `{c.before.rf.path}` -> after `{c.after.rf.path}`"
             + (f"; changed: {cell(c.change_text)}" if c.change_text else "") + ".", ""]
    lines += [f"> {cell(n)}" for n in c.notes] + ([""] if c.notes else [])
    lines += ["## Verdicts", ""]
    for f in findings:
        lines.append(f"- **{cell(f.claim)}**  ")
        lines.append(f"  {cell(f.evidence)}" + (f"  \n  try: {cell(f.action)}" if f.action else ""))
    lines.append("")
    if c.steps:
        lines += ["## Steps (largest time saved or lost per step first)", ""]
        lines += md_table(STEP_COLUMNS, [[t for t, _ in r] for r in step_rows(c)]) + [""]
    for fig, fp in figs:
        lines += [f"![{cell(fig.title)}]({rel_path(fp['png'], out)})", "", f"*{cell(fig.caption)}*", ""]
    moved = [i for i, o in enumerate(c.ops) if o.time.verdict != "no change"]
    if c.ops:
        rows = list(op_rows(c))
        lines += [f"## Ops that moved ({len(moved)} of {len(c.ops)} matched; all are in report.html)", ""]
        lines += md_table(OP_COLUMNS, [[t for t, _ in rows[i]] for i in moved]) if moved else ["None beyond the noise."]
        lines.append("")
    if c.latency:
        lines += ["## Latency percentiles", ""]
        lines += md_table(LATENCY_COLUMNS, [[t for t, _ in r] for r in latency_rows(c)]) + [""]
    extra = unmatched_lines(c)
    if extra:
        lines += ["## Not compared", ""] + [f"- {cell(x)}" for x in extra] + [""]
    return "\n".join(lines)
