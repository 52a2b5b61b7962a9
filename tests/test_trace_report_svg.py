"""The trace report's own SVG figures (reports/svg.py and reports/svg_roofline.py, svg_predicted.py, svg_idle.py):
read back from the files ``roofline trace`` writes, without matplotlib.

Fixtures: tests/data/traces/gpu_new.json (make_traces.py: an A100 prefill + decode, 4 costed ops: 2 GEMMs, an add,
a cast, each its own point; ridge 312e12 / 2.04e12 = 153 FLOP/byte), idle_causes.json (make_traces_issue24.py:
gaps 100-200 us host-bound, 250-300 synchronisation, 353-380 other in a 400 us window), the SGLang Qwen3-8B decode
step tests/test_trace_engines_sglang.py writes (12 points on its roofline, 14 on predicted-vs-measured).
"""

import json
import math
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from reports import svg as S
from reports.palette import CATEGORY_COLORS
from reports.roof_points import plotted, predicted
from roofline.analysis import analyze
from roofline.records import read_results

DATA = Path(__file__).parent / "data" / "traces"
ROOT = Path(__file__).resolve().parents[1]
NS = "{http://www.w3.org/2000/svg}"


def _trace(out, trace, *args):
    res = CliRunner().invoke(main, ["trace", str(trace), "--out", str(out), "--quiet", *map(str, args)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def gpu_new(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("gpu_new"), DATA / "gpu_new.json")


@pytest.fixture(scope="module")
def idle(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("idle"), DATA / "idle_causes.json")


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    import test_trace_engines_sglang as sgl

    d = tmp_path_factory.mktemp("sgl")
    sgl.build(d)
    return _trace(d / "o", d / "sglang_qwen3_decode.json", "--model", "qwen3-8b", "--mix", "decode=8x4096")


def _root(path):
    return ET.parse(path).getroot()        # valid XML, or this raises


def _group(root, gid):
    return next((e for e in root.iter() if e.get("id") == gid), None)


def _markers(root, gid) -> list:
    g = _group(root, gid)
    return [] if g is None else [e for e in g.iter(f"{NS}path")]


def _centre(d: str) -> tuple:
    """A marker path's centre: a circle starts at its left edge (M x-r y, then arcs of radius r); a polygon's is the
    middle of its vertices' box."""
    nums = [float(v) for v in re.findall(r"-?[\d.]+", d)]
    if "a" in d:
        return (nums[0] + nums[2], nums[1])
    xs, ys = nums[0::2], nums[1::2]
    return ((min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2)


def _texts(root) -> list:
    """(gid, corners, text) of every text drawn, its rectangle recomputed from the SVG with our metrics: each <g>
    holding <text> lines is one text (its lines' boxes joined), turned by the group's rotate(-a cx cy)."""
    out = []
    for g in root.iter(f"{NS}g"):
        lines = [t for t in g if t.tag == f"{NS}text"]
        if not lines:
            continue
        boxes = []
        for t in lines:
            x, y, size = float(t.get("x")), float(t.get("y")), float(t.get("font-size"))
            boxes.append((x, y - S.ASCENT * size, x + S.text_width(t.text or "", size), y + S.DESCENT * size))
        box = (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))
        corners = [(box[0], box[1]), (box[2], box[1]), (box[2], box[3]), (box[0], box[3])]
        m = re.match(r"rotate\(([-\d.]+) ([-\d.]+) ([-\d.]+)\)", g.get("transform") or "")
        if m:      # SVG's rotate(t) turns clockwise on screen: t = -(our counter-clockwise angle)
            a, cx, cy = -float(m.group(1)), float(m.group(2)), float(m.group(3))
            corners = S.turn([(px - cx, py - cy) for px, py in corners], cx, cy, a)
        out.append((g.get("id") or "", corners, "\n".join(t.text or "" for t in lines)))
    return out


def _overlapping(root) -> list:
    texts = _texts(root)
    return [(a[2], b[2]) for i, a in enumerate(texts) for b in texts[i + 1:] if S.quads_overlap(a[1], b[1])]


# ---------------------------------------------------------------- the writer's pieces

def test_text_widths_are_dejavu_sans_advance_widths():
    from fontTools.ttLib import TTFont
    import matplotlib

    font = TTFont(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf")
    cmap, hmtx = font.getBestCmap(), font["hmtx"]
    assert font["head"].unitsPerEm == S.UNITS_PER_EM == 2048
    assert list(S.ADVANCE) == [hmtx[cmap[c]][0] for c in range(32, 127)]
    assert {ch: hmtx[cmap[ord(ch)]][0] for ch in S.WIDE} == S.WIDE
    assert S.text_width("1000", 8.0) == 4 * 1303 * 8 / 2048            # digits 1303 units each
    assert S.text_width("ridge", 10.0) == (842 + 569 + 1300 + 1300 + 1260) * 10 / 2048
    assert S.text_extent("a\nbb", 10.0) == (2 * 1300 * 10 / 2048, (S.LINE + S.ASCENT + S.DESCENT) * 10)


def test_log_ticks_are_decades_with_minor_ticks_at_2_and_5():
    major, minor = S.log_ticks(0.1, 1000)
    assert major == [0.1, 1.0, 10.0, 100.0, 1000.0]
    assert [round(m, 6) for m in minor] == [0.2, 0.5, 2.0, 5.0, 20.0, 50.0, 200.0, 500.0]
    major, minor = S.log_ticks(1e-9, 1e-3, stride=2)
    assert [f"{v:g}" for v in major] == ["1e-09", "1e-07", "1e-05", "0.001"]
    assert [f"{v:g}" for v in minor] == ["1e-08", "1e-06", "0.0001"]


def test_linear_ticks_step_1_2_2_5_or_5():
    assert S.linear_ticks(0, 400e-6, 10) == pytest.approx([i * 50e-6 for i in range(9)])
    assert S.linear_ticks(0, 6.97e-3, 10) == pytest.approx([i * 1e-3 for i in range(7)])
    assert S.linear_ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1.0]


def test_a_turned_text_s_box_holds_its_corners():
    box = S.text_box(100, 100, "abc", 10.0, "left", "bottom", rotation=90)   # reads upward from (100, 100)
    w, h = S.text_extent("abc", 10.0)
    assert box == pytest.approx((100 - h, 100 - w, 100, 100))


def test_every_category_drawn_has_a_legend_row():
    from reports.palette import OTHER_CATEGORY_COLOR, category_legend

    assert category_legend(["quantize", "my_rule", "gemm", "moe", "gemm"]) == [
        ("gemm", CATEGORY_COLORS["gemm"]), ("moe", CATEGORY_COLORS["moe"]), ("quantize", CATEGORY_COLORS["quantize"]),
        ("my_rule", OTHER_CATEGORY_COLOR)]
    assert len(set(CATEGORY_COLORS.values())) == len(CATEGORY_COLORS)


# ---------------------------------------------------------------- the roofline

def test_the_roofline_draws_each_point_with_its_hover_title(gpu_new):
    root = _root(gpu_new / "figures" / "roofline.svg")
    rf = read_results(gpu_new / "results.jsonl")
    pts = plotted(rf)
    by_phase = {p: [r for r in pts if r.point.phase == p] for p in ("prefill", "decode")}
    for phase, sel in by_phase.items():
        drawn = _markers(root, f"points:{phase}")
        assert len(drawn) == len(sel) and len(sel) > 0
        titles = [m.find(f"{NS}title").text for m in drawn]
        assert all(t.startswith(f"{r.op} · {phase} · ") for t, r in zip(titles, sel))
        assert all("\nroof " in t for t in titles)
        fills = {m.get("fill") for m in drawn}
        assert fills <= set(CATEGORY_COLORS.values())
    assert len(_markers(root, "steps:prefill")) == 1 and len(_markers(root, "steps:decode")) == 1
    assert _markers(root, "steps:decode")[0].find(f"{NS}title").text.startswith("decode step")


def test_the_roofline_has_its_roofs_ridge_ticks_and_axis_labels(gpu_new):
    root = _root(gpu_new / "figures" / "roofline.svg")
    # the A100's datasheet ceilings classify (nothing measured): drawn once, solid, as the ceilings used
    for gid in ("ceiling:bandwidth:used", "ceiling:peak:bf16:used", "ceiling:peak:fp32:used", "ridge:bf16"):
        assert _group(root, gid) is not None, gid
    texts = {gid: text for gid, _, text in _texts(root)}
    assert texts["ridge-label:bf16"] == "ridge 153 FLOP/byte (bf16)"
    assert texts["ceiling-label:peak:bf16:used"] == "bf16 312 TFLOP/s (datasheet)"
    assert texts["ceiling-label:bandwidth:used"] == "  2.04 TB/s (datasheet)"
    xt = [t for gid, _, t in _texts(root) if gid.startswith("xticks:")]
    assert xt == ["0.01", "0.1", "1", "10", "100", "1000"]
    yt = [t for gid, _, t in _texts(root) if gid.startswith("yticks:")]
    assert yt[0] == "1 GFLOP/s" and yt[-1] == "1 PFLOP/s" and "10 TFLOP/s" in yt
    assert texts["xlabel"] == "arithmetic intensity (FLOP/byte)" and texts["ylabel"] == "achieved FLOP/s"
    assert texts["title"] == "Roofline: traced ops on NVIDIA A100 SXM 80GB"
    legend = [t for gid, _, t in _texts(root) if gid.startswith("legend:")]
    assert legend == ["decode", "prefill", "decode step (its ops summed)", "prefill step (its ops summed)", "gemm",
                      "elementwise", "datasheet ceilings"]


@pytest.mark.parametrize("fixture", ["gpu_new", "sglang", "idle"])
def test_no_two_texts_overlap_by_our_metrics(fixture, request):
    out = request.getfixturevalue(fixture)
    for name in ("roofline", "predicted", "idle"):
        path = out / "figures" / f"{name}.svg"
        if path.exists():
            root = _root(path)
            assert _overlapping(root) == [], name
            w, h = (float(x) for x in root.get("viewBox").split()[2:])
            assert all(0 <= x <= w and 0 <= y <= h for _, q, _ in _texts(root) for x, y in q), name


def test_the_step_callouts_are_placed_with_their_verdicts(gpu_new):
    texts = {gid: t for gid, _, t in _texts(_root(gpu_new / "figures" / "roofline.svg"))}
    calls = sorted(t for gid, t in texts.items() if gid.startswith("point-label:step:"))
    assert calls == ["decode step b1/ctx0: memory-bound, 27%", "prefill step b1/ctx8: memory-bound, 31%"]


# ---------------------------------------------------------------- predicted against measured

def test_the_predicted_chart_draws_every_point_and_the_diagonals(sglang):
    root = _root(sglang / "figures" / "predicted.svg")
    rf = read_results(sglang / "results.jsonl")
    n = len(predicted(analyze(rf)))
    assert n == 14 and len(_markers(root, "pred:decode")) == n
    assert all(m.find(f"{NS}title") is not None for m in _markers(root, "pred:decode"))
    assert _group(root, "pred:roof") is not None and _group(root, "pred:overhead") is not None
    texts = {gid: t for gid, _, t in _texts(root)}
    assert texts["pred-label:roof"] == "at the roof: measured = predicted"
    assert texts["pred-label:overhead"] == "25% of roof: overhead above"
    # the diagonals' labels lie along their lines (turned 45 degrees: the axes are square here) and cover no point
    quads = {gid: q for gid, q, _ in _texts(root)}
    for gid in ("pred-label:roof", "pred-label:overhead"):
        (x0, y0), (x1, y1) = quads[gid][:2]
        assert math.degrees(math.atan2(y0 - y1, x1 - x0)) == pytest.approx(45, abs=2)
        for m in _markers(root, "pred:decode"):
            cx, cy = _centre(m.get("d"))
            r = math.sqrt(30) / 2
            assert not S.quads_overlap(quads[gid], S.box_quad((cx - r, cy - r, cx + r, cy + r))), gid
    assert [t for gid, _, t in _texts(root) if gid.startswith("xticks:")] == ["1 ns", "10 ns", "100 ns", "1 us",
                                                                             "10 us", "100 us", "1 ms"]
    assert [t for gid, _, t in _texts(root) if gid.startswith("legend:")][0] == "op category"


# ---------------------------------------------------------------- the idle timeline

def _rects(root, gid) -> list:
    g = _group(root, gid)
    return [(float(r.get("x")), float(r.get("width"))) for r in g.iter(f"{NS}rect")]


def test_the_idle_timeline_draws_each_gap_at_its_place_with_its_cause(idle):
    root = _root(idle / "figures" / "idle.svg")
    busy = _rects(root, "idle:busy")
    x0 = busy[0][0]
    per_us = (busy[-1][0] + busy[-1][1] - x0) / 400         # the window: 400 us
    us = lambda rs: [(round((x - x0) / per_us, 1), round(w / per_us, 1)) for x, w in rs]   # noqa: E731
    assert us(busy) == [(0, 100), (200, 50), (300, 53), (380, 20)]
    assert us(_rects(root, "idle:host-bound")) == [(100, 100)]
    assert us(_rects(root, "idle:synchronisation")) == [(250, 50)]
    assert us(_rects(root, "idle:other")) == [(353, 27)]
    gaps = _group(root, "idle:host-bound")
    assert [t.text for t in gaps.iter(f"{NS}title")] == ["host-bound gap: 100 us at 100 us"]
    assert {r.get("fill") for r in gaps.iter(f"{NS}rect")} == {"#E69F00"}
    texts = [t for gid, _, t in _texts(root)]
    assert "GPU idle 177 us of a 400 us window (44%), each gap by its cause" in texts
    assert [t for gid, _, t in _texts(root) if gid.startswith("idle:legend:")] == [
        "busy: 223 us", "host-bound: 100 us (56% of idle)", "synchronisation: 50 us (28% of idle)",
        "other: 27 us (15% of idle)", "phase: decode"]
    largest = _group(root, "idle:largest")
    assert ["\n".join(t.text for t in g.iter(f"{NS}text")) for g in largest if g.tag == f"{NS}g"] == [
        "CPU in vllm::prepare_inputs\n100 us", "synchronisation\n50 us", "other\n27 us"]
    assert [t for gid, _, t in _texts(root) if gid.startswith("xticks:")] == [
        "0", "50 us", "100 us", "150 us", "200 us", "250 us", "300 us", "350 us", "400 us"]


# ---------------------------------------------------------------- the report around them

def test_the_html_embeds_the_svgs_and_its_hover_targets_sit_on_the_points(gpu_new):
    import base64

    html = (gpu_new / "report.html").read_text()
    for name in ("roofline", "predicted", "idle"):
        assert base64.b64encode((gpu_new / "figures" / f"{name}.svg").read_bytes()).decode() in html
    root = _root(gpu_new / "figures" / "roofline.svg")
    centres = sorted(_centre(m.get("d")) for phase in ("prefill", "decode")
                     for m in _markers(root, f"points:{phase}") + _markers(root, f"steps:{phase}"))
    over = html[html.index('id="fig-roofline"'):html.index('id="fig-predicted"')]
    circles = sorted((float(a), float(b)) for a, b in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', over))
    assert len(circles) == len(centres) == 6
    assert all(math.dist(c, p) < 0.02 for c, p in zip(circles, centres))


def test_no_png_without_the_flag_and_report_md_links_the_svgs(gpu_new):
    figs = sorted(p.name for p in (gpu_new / "figures").iterdir())
    assert figs == ["idle.svg", "predicted.svg", "roofline.svg"]
    md = (gpu_new / "report.md").read_text()
    assert "![Roofline](figures/roofline.svg)" in md and ".png" not in md


def test_png_draws_the_pngs_too(tmp_path):
    out = _trace(tmp_path / "o", DATA / "gpu_new.json", "--png")
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert figs == ["idle.png", "idle.svg", "predicted.png", "predicted.svg", "roofline.png", "roofline.svg"]
    assert all((out / "figures" / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figs if f.endswith(".png"))
    assert "<g id=\"points:prefill\"" in (out / "figures" / "roofline.svg").read_text()   # still our own SVG
    assert "![Roofline](figures/roofline.svg)" in (out / "report.md").read_text()


def test_the_help_says_what_png_does():
    res = CliRunner().invoke(main, ["trace", "--help"])
    assert "--png" in res.output and "matplotlib" in res.output


PROBE = """
import json, sys
from click.testing import CliRunner
from profiler.cli import main
r = CliRunner().invoke(main, json.loads(sys.argv[1]))
print(json.dumps({"code": r.exit_code, "out": r.output[-300:], "matplotlib": "matplotlib" in sys.modules}))
"""


def _fresh(args) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps([str(a) for a in args])], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_trace_report_does_not_import_matplotlib_unless_png(tmp_path):
    got = _fresh(["trace", DATA / "gpu_new.json", "--out", tmp_path / "a", "--quiet"])
    assert got["code"] == 0, got["out"]
    assert got["matplotlib"] is False
    assert sorted(p.name for p in (tmp_path / "a" / "figures").iterdir()) == ["idle.svg", "predicted.svg",
                                                                              "roofline.svg"]
    got = _fresh(["trace", DATA / "gpu_new.json", "--out", tmp_path / "b", "--quiet", "--png"])
    assert got["code"] == 0 and got["matplotlib"] is True


def test_a_figure_our_writer_does_not_draw_is_still_matplotlib_s_in_report_order(tmp_path):
    # two ranks with their all-reduces (tests/data/traces/ranks): the interconnect figure is matplotlib's, as SVG
    out = _trace(tmp_path / "o", DATA / "ranks")
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["idle.svg", "interconnect.svg", "predicted.svg",
                                                                   "roofline.svg"]
    assert "<dc:title>Matplotlib" in (out / "figures" / "interconnect.svg").read_text()[:2000]
    html = (out / "report.html").read_text()
    assert re.findall(r'<figure id="fig-([a-z]+)"', html) == ["roofline", "predicted", "idle", "interconnect"]
    md = (out / "report.md").read_text()
    assert "](figures/interconnect.svg)" in md and "](figures/idle.svg)" in md
    png = _trace(tmp_path / "p", DATA / "ranks", "--png")
    assert sorted(p.suffix for p in (png / "figures").iterdir()).count(".png") == 4
