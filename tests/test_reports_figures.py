"""Read back what the report's figures drew (seaborn's habit), on tests/data/reports_h100.jsonl.

The fixture's device: h100 with measured 3.0e12 B/s and 800e12 FLOP/s bf16 (fp32 67e12
from the datasheet); datasheet 3.35e12 B/s and 989e12 FLOP/s. Figures are closed by the
autouse fixture in tests/conftest.py (and these use no pyplot state at all).
"""

from pathlib import Path

import numpy as np
import pytest

from reports.figures import roofline_figure, run_figures
from reports.roofline_plot import plot_roofline, plotted, zero_flop_ops
from reports.style import new_figure
from reports.sweep_plot import plot_compare, plot_intensity_sweep, sweep_slices
from reports.time_plot import plot_predicted_vs_measured, plot_time_breakdown
from roofline.records import read_results

DATA = Path(__file__).parent / "data"
BW, PEAK = 3.0e12, 800e12


@pytest.fixture(scope="module")
def rf():
    return read_results(DATA / "reports_h100.jsonl")


@pytest.fixture(scope="module")
def roof_ax(rf):
    fig, ax = new_figure(10, 6.4)
    return plot_roofline(ax, rf)


def by_gid(items, gid):
    found = [a for a in items if a.get_gid() == gid]
    assert len(found) == 1, f"expected one artist with gid {gid!r}, found {len(found)}"
    return found[0]


def test_both_axes_log(roof_ax):
    assert roof_ax.get_xscale() == "log" and roof_ax.get_yscale() == "log"


def test_ridge_x_is_peak_over_bandwidth(roof_ax):
    ridge = by_gid(roof_ax.lines, "ridge:bf16")
    assert ridge.get_xdata()[0] == pytest.approx(PEAK / BW)   # 800e12 / 3.0e12 = 266.7 FLOP/byte
    assert ridge.get_ydata()[0] == pytest.approx(PEAK)
    label = next(t for t in roof_ax.texts if t.get_gid() == "ridge-label:bf16")
    assert "267 FLOP/byte" in label.get_text()


def test_bandwidth_roof_runs_up_to_its_elbow(roof_ax):
    used = by_gid(roof_ax.lines, "ceiling:bandwidth:used")
    x, y = used.get_xdata(), used.get_ydata()
    assert x[-1] == pytest.approx(PEAK / BW) and y[-1] == pytest.approx(PEAK)   # ends at the elbow
    assert y[0] == pytest.approx(x[0] * BW)                                       # slope = bandwidth
    sheet = by_gid(roof_ax.lines, "ceiling:bandwidth:datasheet")
    assert sheet.get_linestyle() == "--" and used.get_linestyle() == "-"          # datasheet dashed
    assert sheet.get_xdata()[-1] == pytest.approx(989e12 / 3.35e12)
    peak = by_gid(roof_ax.lines, "ceiling:peak:bf16:used")
    assert peak.get_xdata()[0] == pytest.approx(PEAK / BW) and set(peak.get_ydata()) == {PEAK}


def test_ceiling_labels_carry_value_unit_and_source(roof_ax):
    labels = {t.get_gid(): t.get_text().strip() for t in roof_ax.texts if (t.get_gid() or "").startswith("ceiling-")}
    assert labels == {
        "ceiling-label:bandwidth:used": "3 TB/s (measured)",
        "ceiling-label:bandwidth:datasheet": "3.35 TB/s (datasheet)",
        "ceiling-label:peak:bf16:used": "bf16 800 TFLOP/s (measured)",
        "ceiling-label:peak:bf16:datasheet": "bf16 989 TFLOP/s (datasheet)",
        # fp32 was not measured: drawn once, solid, and says the datasheet is its source
        "ceiling-label:peak:fp32:used": "fp32 67 TFLOP/s (datasheet)",
    }


def test_each_point_sits_at_its_intensity_and_achieved_flops(rf, roof_ax):
    for phase in ("prefill", "decode"):
        points = by_gid(roof_ax.collections, f"points:{phase}")
        want = [(m.intensity, m.point.cost.flops / m.median_s) for m in (r.m for r in plotted(rf)) if m.point.phase == phase]
        np.testing.assert_allclose(points.get_offsets(), np.array(want), rtol=1e-12)
    decode, prefill = (by_gid(roof_ax.collections, f"points:{p}") for p in ("decode", "prefill"))
    assert decode.get_paths()[0] != prefill.get_paths()[0]   # marker shape tells the phases apart


def test_zero_flop_ops_are_left_off_and_the_caption_says_so(rf, roof_ax):
    assert zero_flop_ops(rf) == ["embedding", "kv_append"]
    n_drawn = sum(len(c.get_offsets()) for c in roof_ax.collections if (c.get_gid() or "").startswith("points:"))
    n_ok = sum(m.ok for m in rf.measurements)
    n_zero = sum(m.ok and m.point.cost.flops == 0 for m in rf.measurements)
    assert n_drawn == n_ok - n_zero
    cap = roofline_figure(rf).caption
    assert "embedding, kv_append do no FLOPs" in cap and "bytes/s" in cap


def test_point_above_its_roof_is_flagged(rf, roof_ax):
    ring = by_gid(roof_ax.collections, "above-roof")
    (x, y), = ring.get_offsets()
    m = next(m for m in rf.measurements if (m.point.op, m.point.phase, m.point.batch, m.point.context)
             == ("attention", "decode", 8, 128))
    assert (x, y) == pytest.approx((m.intensity, m.achieved_flops))
    assert any("above roof" in t.get_text() for t in roof_ax.texts)


def test_error_bars_span_p20_to_p80(rf, roof_ax):
    segs = by_gid(roof_ax.collections, "errorbars:decode").get_segments()
    ms = [r.m for r in plotted(rf) if r.point.phase == "decode"]
    lo, hi = segs[0][:, 1].min(), segs[0][:, 1].max()
    m = ms[0]
    assert lo == pytest.approx(m.point.cost.flops / m.p80_s) and hi == pytest.approx(m.point.cost.flops / m.p20_s)


def test_time_breakdown_stacks_to_one_per_step(rf):
    fig, ax = new_figure(8, 4)
    plot_time_breakdown(ax, rf, "decode")
    stacks = [c for c in ax.collections if (c.get_gid() or "").startswith("time:decode:")]
    assert {c.get_gid().split(":")[-1] for c in stacks} >= {"q_proj", "attention", "lm_head"}
    heights = np.sum([[np.ptp(p.vertices[:, 1]) for p in c.get_paths()] for c in stacks], axis=0)
    np.testing.assert_allclose(heights, 1.0)
    assert len(heights) == 12   # 4 batches x 3 contexts


def test_sweep_marks_ridge_and_crossing(rf):
    assert ("decode", "batch", 1024) in sweep_slices(rf) and ("prefill", "context", 1) in sweep_slices(rf)
    fig, ax = new_figure(6, 4)
    plot_intensity_sweep(ax, rf, "prefill", "context", 1)
    ridge = by_gid(ax.lines, "ridge:bf16")
    assert ridge.get_ydata()[0] == pytest.approx(PEAK / BW)
    star = by_gid(ax.lines, "crossing:q_proj:torch")   # q_proj: 108 FLOP/byte at 128 tokens, ~820 at 1,024
    assert star.get_xdata()[0] == 1024


def test_predicted_vs_measured_points(rf):
    fig, ax = new_figure(6, 6)
    plot_predicted_vs_measured(ax, rf)
    pts = by_gid(ax.collections, "pred:decode")
    ms = [m for m in rf.measurements if m.ok and m.point.phase == "decode"]
    dev = rf.header.device   # at the roof: max(FLOPs / peak of the op's compute dtype, bytes / bandwidth)
    want = [(max(m.point.cost.flops / dev.peak_flops[m.point.compute_dtype], m.point.cost.bytes / dev.bandwidth),
             m.median_s) for m in ms]
    np.testing.assert_allclose(pts.get_offsets(), np.array(want), rtol=1e-12)
    roof = by_gid(ax.lines, "pred:roof")
    np.testing.assert_allclose(roof.get_xdata(), roof.get_ydata())


def test_compare_colours_runs_by_device(rf):
    other = read_results(DATA / "reports_a100.jsonl")
    fig, ax = new_figure(6, 4)
    plot_compare(ax, [rf, other], "decode", "time")
    lines = [ln for ln in ax.lines if (ln.get_gid() or "").startswith("compare:")]
    assert len(lines) == 2 and lines[0].get_color() != lines[1].get_color()
    assert [list(ln.get_xdata()) for ln in lines] == [[1, 8, 32, 128]] * 2   # decode at context 1,024


def test_run_figures_in_report_order(rf):
    assert [f.key for f in run_figures(rf)] == ["roofline", "time_prefill", "time_decode", "sweep", "predicted"]


def test_the_roofline_caption_says_which_lines_are_which(rf):
    cap = roofline_figure(rf).caption
    assert cap.startswith("290 measured points at (arithmetic intensity")   # 327 lines: 36 zero-FLOP, 1 skipped
    assert "Solid: the ceilings used to classify (measured; a dtype it did not measure keeps its datasheet figure); dashed: the datasheet's." in cap
