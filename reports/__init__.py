"""Reports: figures (PNG and SVG), one self-contained HTML file and a markdown summary.

Rendering only: takes recorded results, never measures. ::

    from reports import write_report
    paths = write_report(["roofline-out/results.jsonl"], "roofline-report")
    paths["html"], paths["markdown"], paths["png:roofline"]

``roofline trace`` asks ``write_report(..., own_svg=True)``: its roofline, predicted-vs-measured and idle
figures are drawn by our own SVG writer (``reports.svg_figures``) without importing matplotlib, PNGs only with
``png=True``.

Several files are reported side by side (one colour per run/device); files whose models
differ are still reported, with a note saying so. Bad input raises ``RooflineError``
naming the file (and line) at fault.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from roofline.analysis import analyze
from roofline.errors import RooflineError
from roofline.latency import latency_runs
from roofline.records import ResultFile, read_results

from . import html, markdown
from .labels import run_labels

__all__ = ["write_report", "load", "ReportData", "RunData"]


@dataclass
class RunData:
    index: int
    name: str
    rf: ResultFile
    analysis: object                               # roofline.analysis.RunAnalysis: every number comes from it
    figures: list = field(default_factory=list)   # (ReportFigure, {fmt: Path})
    notes: list = field(default_factory=list)

    @property
    def steps(self) -> list:
        return self.analysis.steps


@dataclass
class ReportData:
    runs: list
    compare: list = field(default_factory=list)   # (ReportFigure, {fmt: Path})
    notes: list = field(default_factory=list)
    link: str = "png"                             # the figure files report.md links: "svg" for our own SVGs


def load(paths_or_result_files) -> list[ResultFile]:
    items = [paths_or_result_files] if isinstance(paths_or_result_files, (str, Path, ResultFile)) \
        else list(paths_or_result_files)
    if not items:
        raise RooflineError("no result files given: pass one or more results .jsonl files.")
    return [x if isinstance(x, ResultFile) else read_results(x) for x in items]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "run"


def _points(rs) -> str:
    return ", ".join(f"{r.point.phase} {r.op} b{r.point.batch} c{r.point.context}" for r in rs[:6]) + \
        (" ..." if len(rs) > 6 else "")


def _run_notes(a) -> list[str]:
    rf = a.rf
    dev = rf.header.device
    notes = list(rf.notices) + list(a.notes)
    model = rf.header.model
    if model is not None:   # what the config holds and the model does not implement (e.g. RoPE scaling)
        notes += [f"{model.name}: {n}" for n in model.notes]
    weights = rf.header.settings.get("weights") if isinstance(rf.header.settings, dict) else None
    if isinstance(weights, dict) and weights.get("weights") == "checkpoint":
        notes.append(f"Measured on the checkpoint's real weights: {', '.join(map(str, weights.get('files', [])))} "
                     f"in {weights.get('folder')} (sha256 {str(weights.get('sha256', ''))[:16]}...).")
    precision = rf.header.settings.get("precision") if isinstance(rf.header.settings, dict) else None
    for label, p in (precision.items() if isinstance(precision, dict) else ()):   # each variant, per module
        if isinstance(p, dict):
            lead = f"Points keyed w:{label} ran " if len(precision) > 1 else "Ran "
            notes.append(f"{lead}{p.get('weights', '')}; {p.get('kv', '')}."
                         + "".join(f" {n}." for n in p.get("notes", ()) if isinstance(n, str)))
    skipped = [r for r in a.results if not r.ok]
    if skipped:
        reasons = sorted({r.m.reason or r.m.status for r in skipped})
        notes.append(f"{len(skipped)} point(s) skipped ({'; '.join(reasons)}): {_points(skipped)}.")
    above = [r for r in a.results if r.above_roof]
    if above:
        notes.append(f"{len(above)} point(s) run above their roof, which no kernel can: a byte-count error or "
                     f"cache reuse (a working set served from L2), not a win: {_points(above)}.")
    interp = [r for r in a.results if "triton-interpreter" in r.m.flags]
    if interp:
        notes.append(f"{len(interp)} triton point(s) ran in the Triton interpreter (no GPU): their times measure "
                     "Python running the kernel, not the kernel; compare their FLOPs and bytes, not their speed.")
    wide = [r for r in a.results if r.m.wide_spread]
    if wide:
        notes.append(f"{len(wide)} point(s) have a wide spread (p80 - p20 over 10% of the median): "
                     "treat their roof fraction with care.")
    if dev.source not in ("measured",) and rf.measurements:
        notes.append(f"classified against {dev.source} ceilings (nothing measured): run `roofline ceilings` for "
                     "the ceilings this device actually reaches.")
    for run in latency_runs(rf):
        if not run.complete:
            notes.append(f"configuration {run.config} was interrupted: {len(run.timelines)} request(s) finished "
                         "before it stopped; its figures use only those. Resume the run to complete it.")
    return notes


SOURCES_FILE = ".report-sources.json"   # the result files report.html, report.md and figures/ were made from


def write_report(paths_or_result_files, out_dir="roofline-report", *, own_svg: bool = False,
                 png: bool = True) -> dict[str, Path]:
    """Render figures, ``report.html`` and ``report.md`` into ``out_dir``; returns {name: path}.

    Names: "html", "markdown", and "png:<figure>" / "svg:<figure>" per figure (prefixed by
    the run's slug when there are several runs).

    ``own_svg`` (what ``roofline trace`` asks): a trace's roofline, predicted-vs-measured and idle figures are drawn
    by our own SVG writer (``reports.svg_figures``: matplotlib is not imported), as SVG only unless ``png`` (then
    matplotlib draws their PNGs too); its other figures (a context curve, the interconnect), where it has them,
    are still matplotlib's, as SVG (and PNG with ``png``). Without ``own_svg`` every figure is matplotlib's, as
    PNG and SVG (the profile report's).
    """
    rfs = load(paths_or_result_files)
    analyses = [analyze(rf) for rf in rfs]   # every number below comes from these
    out = Path(out_dir)
    html_path, md_path = out / "report.html", out / "report.md"
    for p in (html_path, md_path):
        if p.is_dir():
            raise RooflineError(f"{p} is a folder, so the report cannot be written there: remove or rename it, "
                                "or give another --out.")
    try:
        (out / "figures").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RooflineError(f"cannot create the report folder {out}: {e.strerror}.") from None
    several = len(rfs) > 1
    runs, written, jobs, owner, own = [], {}, [], [], {}
    names = run_labels(rfs) if several else [rfs[0].header.device.name]   # as the side-by-side legend says
    for i, (rf, a, name) in enumerate(zip(rfs, analyses, names), start=1):
        runs.append(RunData(i, name, rf, a, notes=_run_notes(a)))
        prefix = f"{i}-{_slug(rf.header.device.key or rf.header.device.name)}-" if several else ""
        mine = own_svg and rf.header.kind == "trace"
        if mine:       # our own SVGs, written here; matplotlib only for what they do not draw (and the PNGs)
            own[i] = _own_figures(rf, name, out / "figures", prefix)
            for fig, paths in own[i].values():
                written[f"svg:{prefix}{fig.key}"] = paths["svg"]
        builders = _figure_builders(rf, own.get(i, {}), png) if mine else _matplotlib_builders(rf)
        for key, build, formats in builders:
            jobs.append((prefix, build, formats))
            owner.append((runs[-1], prefix))
    if len(rfs) > 1:
        from .figures import compare_figures

        jobs.append(("", lambda: compare_figures(rfs)))
        owner.append((None, ""))
    report = ReportData(runs, link="svg" if own else "png")
    report.notes += [(f"{run.name}: " if several else "") + run.analysis.noise_note for run in runs
                     if run.analysis.noise_note]          # said first, above every table and figure
    drawn = []
    if jobs:
        from .render import render      # matplotlib: deferred, a trace's own SVGs need none

        drawn = render(jobs, out / "figures")
    for (run, prefix), figs in zip(owner, drawn):
        for fig, paths in figs:
            mine = own.get(run.index, {}) if run is not None else {}
            if fig.key in mine:                     # a PNG of one of our own SVG figures
                mine[fig.key][1].update(paths)
            else:
                (run.figures if run is not None else report.compare).append((fig, paths))
            for fmt, p in paths.items():
                written[f"{fmt}:{prefix}{fig.key}"] = p
    for run in runs:
        if run.index in own:          # in report order: ours and matplotlib's
            order = [k for k in _trace_keys(run.rf)]
            figs = {f.key: (f, p) for f, p in run.figures} | own[run.index]
            run.figures = [figs[k] for k in order if k in figs]
    models = sorted({rf.header.model_name for rf in rfs})
    if len(models) > 1:
        report.notes.append(f"These files profile different models ({', '.join(models)}): they are reported side "
                            "by side, but their step times are not comparable.")
    if len({rf.header.dtype for rf in rfs}) > 1:
        report.notes.append("These files use different dtypes: "
                            + ", ".join(f"{rf.path.name}: {rf.header.dtype}" for rf in rfs) + ".")
    _remove_stale(out / "figures", set(written.values()))
    try:
        html_path.write_text(html.render(report), encoding="utf-8")
        md_path.write_text(markdown.render(report, out), encoding="utf-8")
        # what it was made from: a later run removes this report only when it rewrote one of these files
        (out / SOURCES_FILE).write_text(json.dumps([str(rf.path.resolve()) for rf in rfs]), encoding="utf-8")
    except OSError as e:
        raise RooflineError(f"cannot write the report into {out}: {e.strerror or e}.") from None
    return {"html": html_path, "markdown": md_path, **written}


def _matplotlib_builders(rf) -> list:
    from .figures import figure_builders   # matplotlib: deferred, reading results needs none

    return [(key, build, ("png", "svg")) for key, build in figure_builders(rf)]


def _trace_keys(rf) -> list:
    from .figure_kinds import trace_figure_keys

    return trace_figure_keys(rf)


def _own_figures(rf, name: str, folder: Path, prefix: str) -> dict:
    """{key: (Drawn, {"svg": path})} of a trace's figures our own SVG writer draws, written to ``folder``."""
    from .report_figure import Drawn
    from .svg_figures import own_figures

    out = {}
    for f in own_figures(rf, name):
        p = folder / f"{prefix}{f.key}.svg"
        try:
            p.write_text(f.svg, encoding="utf-8")
        except OSError as e:
            raise RooflineError(f"cannot write the figure {p}: {e.strerror or e}.") from None
        out[f.key] = (Drawn(f.key, f.title, f.caption, f.marks), {"svg": p})
    return out


def _figure_builders(rf, own: dict, png: bool) -> list:
    """The matplotlib jobs a trace's report still needs beside its own SVGs: the PNGs of ours (with ``png``) and
    the figures ours do not draw (SVG, and PNG with ``png``). None: matplotlib is not imported."""
    if not png and all(k in own for k in _trace_keys(rf)):
        return []
    extra = ("png",) if png else ()
    return [(key, build, extra if key in own else ("svg",) + extra)
            for key, build, _ in _matplotlib_builders(rf) if key not in own or png]


def _remove_stale(folder: Path, keep: set) -> None:
    """Figures an earlier report left in ``folder`` that this one did not write (a reused --out)."""
    for p in folder.glob("*"):
        if p.suffix in (".png", ".svg") and p.is_file() and p not in keep:
            p.unlink()
