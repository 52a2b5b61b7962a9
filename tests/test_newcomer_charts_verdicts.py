"""Issue 33, "Charts and tables that agree": a verdict the table withholds (a step timed on a busy host) is withheld
on every chart; a comparison with a busy side is not judged on its chart or in its tables; every verdict tag of
the HTML report has a colour of its own; a counters report draws its points."""

import json
import re
from pathlib import Path

from matplotlib.colors import to_rgba

from profiler.counters_run import CountersRun, run_counters
from reports.compare_plot import SAME_COLOR, plot_change
from reports.compare_tables import STEP_COLUMNS, step_rows
from reports.html import page
from reports.roofline_plot import plot_roofline
from reports.style import new_figure
from roofline.analysis import UNRELIABLE, analyze
from roofline.bounds import CACHE_RESIDENT, COMMUNICATION, COMPUTE, MEMORY, OVERHEAD
from roofline.records import read_results
from roofline.verdicts.change import NOT_JUDGED
from roofline.verdicts.comparison import compare

DATA = Path(__file__).parent / "data"
H100, W8 = DATA / "reports_h100.jsonl", DATA / "reports_h100_w8.jsonl"


def busy(src: Path, dst: Path) -> Path:
    """``src`` with every measurement flagged host-busy: every step's verdict is withheld."""
    out = []
    for ln in src.read_text().splitlines():
        d = json.loads(ln)
        if d.get("type") == "measurement":
            d["flags"] = list(d.get("flags", [])) + ["host-busy"]
        out.append(json.dumps(d))
    dst.write_text("\n".join(out) + "\n")
    return dst


def texts(ax, prefix: str) -> list:
    return [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith(prefix)]


def test_the_roofline_labels_a_withheld_step_as_the_table_does(tmp_path):
    rf = read_results(busy(H100, tmp_path / "busy.jsonl"))
    assert {s.verdict for s in analyze(rf).steps} == {UNRELIABLE}       # what the table says
    fig, ax = new_figure(10, 6.4)
    plot_roofline(ax, rf)
    steps = texts(ax, "point-label:step:")
    assert steps, "the headline steps are labelled"
    for t in steps:
        assert "no verdict" in t and "-bound" not in t and "%" not in t, t
    assert "busy machine" in ax.get_title()


def test_a_quiet_run_keeps_its_verdicts_on_the_roofline():
    rf = read_results(H100)
    fig, ax = new_figure(10, 6.4)
    plot_roofline(ax, rf)
    steps = texts(ax, "point-label:step:")
    assert steps and all("-bound" in t and "%" in t for t in steps)
    assert "busy" not in ax.get_title()


def test_the_compare_chart_and_tables_do_not_judge_a_busy_comparison(tmp_path):
    c = compare(read_results(H100), read_results(busy(W8, tmp_path / "w8.jsonl")))
    assert not c.judged and "not judged" in c.noise_note
    assert any(s.time.verdict != "no change" for s in c.steps)   # the numbers moved; nothing may claim it
    fig, ax = new_figure(11, 6.4)
    plot_change(ax, c)
    every = [t.get_text() for t in ax.texts]
    assert not [t for t in every if "faster" in t or "slower" in t], every
    after = next(col for col in ax.collections if col.get_gid() == "steps:after")
    grey = tuple(round(v, 3) for v in to_rgba(SAME_COLOR))
    assert {tuple(round(v, 3) for v in fc) for fc in after.get_facecolors()} == {grey}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "after: faster" not in legend and "after: not judged (host-busy)" in legend
    assert "not judged" in ax.get_title()
    col = STEP_COLUMNS.index("verdict")
    said = {row[col][0] for row in step_rows(c)}
    assert NOT_JUDGED in said and said <= {NOT_JUDGED, "not comparable"}      # never faster or slower


def test_a_quiet_comparison_is_judged_on_its_chart():
    c = compare(read_results(H100), read_results(W8))
    assert c.judged and c.verdict_of(c.steps[0].time) == c.steps[0].time.verdict
    fig, ax = new_figure(11, 6.4)
    plot_change(ax, c)
    assert any("faster" in t or "slower" in t for t in texts(ax, "point-label:"))


def _backgrounds(css: str) -> dict:
    return {m.group(1): m.group(2).lower() for m in re.finditer(r"\.tag\.([\w-]+)\{background:(#[0-9a-fA-F]{3,6})\}",
                                                               css)}


def test_every_verdict_tag_has_a_colour_that_is_not_white():
    css = re.search(r"<style>(.*)</style>", page("t", []), re.S).group(1)
    bg = _backgrounds(css)
    for label in (MEMORY, COMPUTE, OVERHEAD, CACHE_RESIDENT, COMMUNICATION, UNRELIABLE):
        assert label in bg, label
        assert bg[label] not in ("#fff", "#ffffff"), label
    assert re.search(r"\.tag\{background:#[0-9a-fA-F]{6}\}", css)      # a label not named still shows


def test_a_counters_report_draws_its_launches(tmp_path):
    res = run_counters(CountersRun(str(DATA / "ncu" / "h100_raw.csv"), out=str(tmp_path / "c"), report=False))
    rf = read_results(res.path)
    ok = [m for m in rf.measurements if m.ok and m.point.cost.flops > 0]
    assert ok and {m.point.phase for m in ok} == {"forward"} and {m.point.batch for m in ok} == {0}
    fig, ax = new_figure(10, 6.4)
    plot_roofline(ax, rf)
    points = next((c for c in ax.collections if c.get_gid() == "points:forward"), None)
    assert points is not None and len(points.get_offsets()) == len(ok)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [t for t in legend if t in ("batch 0", "context 0")], legend
    assert "forward" in legend


def test_the_side_by_side_chart_marks_the_steps_whose_verdict_is_withheld(tmp_path):
    from reports.figures import compare_figures
    (tmp_path / "busy").mkdir()
    quiet, noisy = read_results(H100), read_results(busy(H100, tmp_path / "busy" / "busy.jsonl"))
    (f,) = compare_figures([quiet, noisy])
    for ax in f.figure.axes:
        marks = [c for c in ax.collections if (c.get_gid() or "").startswith("unreliable:")]
        assert marks and all(c.get_gid().endswith(":1") for c in marks)        # the busy run's only
        n = sum(len(c.get_offsets()) for c in marks)
        assert f"unreliable (host-busy): no verdict ({n})" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_counters_report_predicted_chart_has_its_points_and_no_empty_legend(tmp_path):
    from reports.figures import predicted_figure
    res = run_counters(CountersRun(str(DATA / "ncu" / "h100_raw.csv"), out=str(tmp_path / "c"), report=False))
    f = predicted_figure(read_results(res.path))
    pts = next(c for c in f.figure.axes[0].collections if c.get_gid() == "pred:forward")
    assert len(pts.get_offsets()) > 0 and f.figure.legends == [] and "pentagons" in f.caption
