"""Points that explain themselves, read back from what was drawn: hover marks on the drawn markers, step
markers at their step's numbers, batch colours, point labels that never overlap, the HTML overlay linking
each mark to its table row. (The page itself, hovered with real input events: tests/test_reports_browser.py.)"""

import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Text

from reports import hover, write_report
from reports.figures import predicted_figure, roofline_figure
from reports.roofline_plot import plotted, step_markers
from reports.style import batch_palette, freeze_layout, save
from roofline.analysis import analyze
from roofline.records import read_results
from roofline.writer import ResultWriter

DATA = Path(__file__).parent / "data"
H100 = DATA / "reports_h100.jsonl"


def svg_centers(svg: str, gid: str) -> np.ndarray:
    """Centres of the markers matplotlib wrote in group ``gid``: explicit paths (bbox centre) or <use x y>."""
    i = svg.index(f'<g id="{gid}">')
    depth = 0
    for t in re.finditer(r"<g[ >]|</g>", svg[i:]):          # the group's end: its own </g>, nested groups counted
        depth += -1 if t.group() == "</g>" else 1
        if depth == 0:
            break
    part = re.sub(r"<defs>.*?</defs>", "", svg[i:i + t.end()], flags=re.S)   # marker shapes, not markers
    out = [(float(x), float(y)) for x, y in re.findall(r'<use xlink:href="#[^"]+" x="([-0-9.e]+)" y="([-0-9.e]+)"',
                                                        part)]
    for d in re.findall(r'<path d="([^"]+)"', part):
        xy = np.array([float(v) for v in re.findall(r"-?[0-9.]+(?:e-?[0-9]+)?", d)]).reshape(-1, 2)
        out.append(((xy[:, 0].min() + xy[:, 0].max()) / 2, (xy[:, 1].min() + xy[:, 1].max()) / 2))
    return np.array(out)


def drawn(fig, tmp_path, name="fig"):
    paths = save(fig.figure, tmp_path / name)
    return paths["svg"].read_text(), hover.marks(fig.figure)


def nearest(points: np.ndarray, x: float, y: float) -> float:
    return float(np.min(np.hypot(points[:, 0] - x, points[:, 1] - y)))


@pytest.fixture(scope="module")
def rf():
    return read_results(H100)


def test_each_mark_sits_on_its_drawn_marker(rf, tmp_path):
    svg, marks = drawn(roofline_figure(rf), tmp_path)
    ops = np.vstack([svg_centers(svg, f"points:{p}") for p in ("decode", "prefill")])
    steps = np.vstack([svg_centers(svg, f"steps:{p}") for p in ("decode", "prefill")])
    a = analyze(rf)
    p_marks = [m for m in marks if m.kind == "p"]
    s_marks = [m for m in marks if m.kind == "s"]
    assert len(p_marks) == len(plotted(rf)) == len(ops) == 290 and len(s_marks) == len(steps) == 18
    for m in p_marks:
        assert nearest(ops, m.x, m.y) < 0.05          # SVG user units (pt): on the drawn marker
        assert a.results[m.index].ok and a.results[m.index].point.cost.flops > 0
    for m in s_marks:
        assert nearest(steps, m.x, m.y) < 0.05
    # the above-roof point's mark is that point: decode attention at batch 8, context 128
    above = [m for m in p_marks if a.results[m.index].above_roof]
    assert [(a.results[m.index].op, a.results[m.index].point.batch) for m in above] == [("attention", 8)]


def test_the_predicted_chart_marks_every_point(rf, tmp_path):
    svg, marks = drawn(predicted_figure(rf), tmp_path)
    pts = np.vstack([svg_centers(svg, f"pred:{p}") for p in ("decode", "prefill")])
    assert len(marks) == len(pts) and all(nearest(pts, m.x, m.y) < 0.05 for m in marks)


def test_step_markers_sit_at_the_steps_numbers(rf):
    fig = roofline_figure(rf)
    ax = fig.figure.axes[0]
    a = analyze(rf)
    for phase in ("decode", "prefill"):
        coll = next(c for c in ax.collections if c.get_gid() == f"steps:{phase}")
        # (step intensity, step FLOPs / step time): the summed cost over count x median of its ops
        want = [(s.cost.flops / s.cost.bytes, s.cost.flops / s.time_s) for s in step_markers(a) if s.phase == phase]
        np.testing.assert_allclose(coll.get_offsets(), np.array(want), rtol=1e-12)
        ops = next(c for c in ax.collections if c.get_gid() == f"points:{phase}")
        assert coll.get_sizes().min() > 2 * ops.get_sizes().max()      # larger than any op's marker
    labels = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("point-label:step")]
    assert "decode step b1/ctx128: memory-bound, 67%" in labels and any("compute-bound" in t for t in labels)


def test_a_handful_of_batches_get_one_colour_each(rf):
    fig = roofline_figure(rf)
    assert len(fig.figure.axes) == 1                                  # no colour bar
    ax = fig.figure.axes[0]
    palette = batch_palette([1, 8, 32, 128])
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"batch 1", "batch 8", "batch 32", "batch 128"} <= legend
    coll = next(c for c in ax.collections if c.get_gid() == "points:decode")
    sel = [r for r in plotted(rf) if r.point.phase == "decode"]
    assert [to_hex(c) for c in coll.get_facecolors()] == [palette[r.point.batch] for r in sel]
    assert batch_palette(range(1, 10)) is None


def test_many_batches_keep_the_ramp(rf, tmp_path):
    combos = sorted({(m.point.batch, m.point.context) for m in rf.measurements if m.point.phase == "decode"})
    new = {bc: i + 1 for i, bc in enumerate(combos)}                  # 12 distinct batch sizes
    src = tmp_path / "many.jsonl"
    with ResultWriter(src, rf.header) as w:
        for m in rf.measurements:
            if m.point.phase == "decode":
                w.write(replace(m, point=replace(m.point, batch=new[(m.point.batch, m.point.context)])))
    fig = roofline_figure(read_results(src))
    assert len(fig.figure.axes) == 2 and fig.figure.axes[1].get_ylabel() == "batch"   # the colour bar


def _two_above_roof(rf, path):
    """reports_h100 with a second point above its roof next to the first (their labels used to collide)."""
    with ResultWriter(path, rf.header) as w:
        for m in rf.measurements:
            p = m.point
            if (p.op, p.phase, p.batch, p.context) == ("attention", "decode", 8, 1024):
                m = replace(m, times_s=tuple(t * 0.25 for t in m.times_s))
            w.write(m)
    return path


@pytest.mark.parametrize("name", ["reports_h100", "reports_a100", "reports_exact", "reports_two_backends", "two"])
def test_point_labels_never_overlap_each_other_or_the_markers(rf, name, tmp_path):
    src = _two_above_roof(rf, tmp_path / "two.jsonl") if name == "two" else DATA / f"{name}.jsonl"
    fig = roofline_figure(read_results(src)).figure
    freeze_layout(fig)                                                # the positions as saved
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if (t.get_gid() or "").startswith("point-label:")]
    assert labels
    boxes = [Text.get_window_extent(t, renderer) for t in labels]
    for i, b in enumerate(boxes):
        assert ax.bbox.contains(b.x0, b.y0) and ax.bbox.contains(b.x1, b.y1)
        for other in boxes[i + 1:]:
            assert not b.overlaps(other), (labels[i].get_text(), other)
        for coll in ax.collections:
            if coll.get_gid() is None or not coll.get_gid().startswith(("points:", "steps:", "above-roof")):
                continue
            px = coll.get_offset_transform().transform(coll.get_offsets())
            half = np.sqrt(np.broadcast_to(coll.get_sizes(), (len(px),))) / 2 * fig.dpi / 72
            hit = ((px[:, 0] + half > b.x0) & (px[:, 0] - half < b.x1) & (px[:, 1] + half > b.y0)
                   & (px[:, 1] - half < b.y1))
            assert not hit.any(), (labels[i].get_text(), coll.get_gid())
    if name == "two":
        above = [t.get_text() for t in labels if t.get_gid().startswith("point-label:above")]
        assert len(above) == 2 and any("c1024" in t for t in above) and any("c128:" in t for t in above)


def test_the_html_links_each_mark_to_the_row_holding_its_numbers(tmp_path):
    paths = write_report([H100], tmp_path / "rep")
    html = paths["html"].read_text()
    a = analyze(read_results(H100))
    rows = dict(re.findall(r'<tr data-phase="[^"]*" data-label="[^"]*" id="(r1-\d+)"[^>]*>(.*?)</tr>', html))
    assert len(rows) == len(a.results) == 327
    links = re.findall(r'<a href="#(r1-\d+)" data-k="(r1-\d+)" aria-label="([^"]*)"><circle cx="([0-9.]+)" '
                       r'cy="([0-9.]+)" r="([0-9.]+)"/></a>', html)
    # roofline 290 + predicted 307 ops (every costed one) + sweep slices' points
    assert len(links) > 290 + 300
    for href, key, name, *_ in links:
        assert href == key and key in rows
        r = a.results[int(key.split("-")[1])]
        assert f">{r.op}</td>" in rows[key] and f">{r.point.phase}</td>" in rows[key]
        assert name.startswith(f"{r.point.phase} {r.op}, batch {r.point.batch}, context {r.point.context}")
    steps = re.findall(r'<a href="#(s1-\d+)"', html)
    assert len(steps) == 18 and all(f'id="{s}"' in html for s in steps)
    assert '<table id="points" data-tip="{op} · {phase}' in html and html.count('<div id="tip"') == 1
    assert html.count('<svg class="hover"') == 3                      # roofline, sweep, predicted
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)


def test_a_large_file_keeps_a_bounded_overlay(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from report_speed import write_synthetic

    src = tmp_path / "big.jsonl"
    write_synthetic(src, 2600)
    rf = read_results(src)
    assert len(plotted(rf)) > hover.HOVER_MAX
    fig = roofline_figure(rf)
    svg, marks = drawn(fig, tmp_path)
    a = analyze(rf)
    assert marks and all(m.priority for m in marks)                   # only steps and above-roof points
    assert {m.kind for m in marks} <= {"s", "p"}
    assert all(a.results[m.index].above_roof for m in marks if m.kind == "p")
    assert len([m for m in marks if m.kind == "s"]) == len(step_markers(a)) < len(a.steps)
