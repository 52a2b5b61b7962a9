"""Issue 33, figures a newcomer reads: the predicted-vs-measured y label is inside the figure; the sweep's
"turns compute-bound" star sits on or above the ridge drawn (never a cache level's, which is not drawn); ridge
labels are drawn above the markers; two files named alike get distinct legend labels; a step above the
roof-fraction axis is drawn at its edge, marked and said; a busy run's time breakdown carries the warning.

Each check reads back the matplotlib Figure (Agg): text positions, artists, gids, legend texts."""

import json
import shutil
from pathlib import Path

import numpy as np

from reports.figures import compare_figures, predicted_figure, time_figure
from reports.roofline_plot import plot_roofline
from reports.style import freeze_layout, new_figure
from reports.sweep_plot import FRACTION_TOP, plot_compare, plot_intensity_sweep
from roofline.analysis import analyze
from roofline.cost import Cost
from roofline.devices import cpu_device
from roofline.records import Measurement, ResultFile, RunHeader, WorkloadPoint, read_results

from test_newcomer_charts_verdicts import busy

DATA = Path(__file__).parent / "data"
H100 = DATA / "reports_h100.jsonl"
MiB, GB = 2**20, 1e9


def cpu():
    """fp32 peak 100 GFLOP/s over DRAM 10 GB/s: the drawn ridge is 10 FLOP/byte; an L3 of 32 MiB at 40 GB/s has
    its ridge at 2.5, an L2 of 2 MiB at 80 GB/s at 1.25 (neither drawn on the sweep)."""
    return cpu_device("Test CPU", {"fp32": 100 * GB}, 10 * GB).with_cache_levels(
        [("L3", 32 * MiB, 40 * GB), ("L2", 2 * MiB, 80 * GB)])


def point(op, cost, batch, context=64):
    return WorkloadPoint("small", op, "decode", batch, 1, context, cost, dtype="fp32", weight_dtype="fp32",
                         kv_dtype="fp32", compute_dtype="fp32")


def at(p, bytes_per_s):
    """A measurement of ``p`` whose median moves ``bytes_per_s`` (no clock: the time is written in)."""
    t = p.cost.bytes / bytes_per_s
    return Measurement(p, (t, t, t))


def rf_of(device, ms, path="synthetic.jsonl"):
    return ResultFile(Path(path), RunHeader(device=device, dtype="fp32"), list(ms))


def test_the_predicted_chart_keeps_its_y_label_inside_the_figure():
    f = predicted_figure(read_results(H100))
    fig = f.figure
    freeze_layout(fig)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    label = ax.yaxis.label.get_window_extent(r)
    assert ax.get_ylabel() and label.x0 >= 0 and label.x1 <= fig.bbox.x1, (label, fig.bbox)
    ticks = [t.get_window_extent(r) for t in ax.get_yticklabels() if t.get_text()]
    assert label.x1 <= min(t.x0 for t in ticks if ax.bbox.y0 <= (t.y0 + t.y1) / 2 <= ax.bbox.y1)


def test_the_sweep_star_sits_on_the_drawn_ridge_not_a_cache_levels():
    # attn_norm, 1 MiB (fits the L2 and L3), moving 30 GB/s (above DRAM's 10): judged against the L3 roof, ridge 2.5
    ms = [at(point("attn_norm", Cost(i * MiB, MiB), b), 30 * GB) for b, i in ((1, 0.5), (2, 2.0), (4, 5.0), (8, 20.0))]
    rf = rf_of(cpu(), ms)
    assert all(r.roof.level_name == "L3" for r in analyze(rf).ok)
    fig, ax = new_figure(6, 4)
    plot_intensity_sweep(ax, rf, "decode", "batch", 64)
    ridge = next(ln for ln in ax.lines if ln.get_gid() == "ridge:fp32")
    drawn = ridge.get_ydata()[0]
    assert drawn == 10.0
    stars = [ln for ln in ax.lines if (ln.get_gid() or "").startswith("crossing:")]
    assert len(stars) == 1
    x, y = stars[0].get_xdata(), stars[0].get_ydata()
    assert (np.ravel(x)[0], np.ravel(y)[0]) == (8, 20.0)          # batch 4 (5 FLOP/byte) is still under the ridge
    assert all(np.ravel(s.get_ydata())[0] >= drawn for s in stars)
    label = next(t for t in ax.texts if t.get_gid() == "ridge-label:fp32")
    assert label.get_zorder() > max(s.get_zorder() for s in ax.lines if s.get_gid() != "ridge:fp32")


def test_the_roofline_ridge_label_is_drawn_above_the_markers():
    fig, ax = new_figure(10, 6.4)
    plot_roofline(ax, read_results(H100))
    label = next(t for t in ax.texts if (t.get_gid() or "").startswith("ridge-label:"))
    assert label.get_zorder() > max(c.get_zorder() for c in ax.collections)


def _copies(tmp_path, folders, settings=None) -> list:
    out = []
    for i, folder in enumerate(folders):
        p = tmp_path / folder / "results.jsonl"
        p.parent.mkdir(parents=True)
        if settings is None:
            shutil.copy(H100, p)
        else:
            lines = H100.read_text().splitlines()
            head = json.loads(lines[0])
            head["settings"] = dict(head["settings"], **settings[i])
            p.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
        out.append(read_results(p))
    return out


def _legend_labels(fig) -> list:
    return [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend()]


def test_two_files_named_alike_get_distinct_series_labels(tmp_path):
    rfs = _copies(tmp_path, ["run-a", "run-b"])
    (f,) = compare_figures(rfs)
    for labels in _legend_labels(f.figure):
        assert len(set(labels)) == len(labels) == 2, labels
        assert any("run-a" in t for t in labels) and any("run-b" in t for t in labels)


def test_files_in_folders_named_alike_are_told_apart_by_their_settings(tmp_path):
    rfs = _copies(tmp_path, ["x/out", "y/out"], settings=[{"threads": 2}, {"threads": 1}])
    (f,) = compare_figures(rfs)
    for labels in _legend_labels(f.figure):
        assert len(set(labels)) == 2 and {t.split()[-1] for t in labels} == {"threads=2", "threads=1"}, labels


def test_a_step_above_the_fraction_axis_is_drawn_at_its_edge_and_said():
    # one op a step: swiglu, 1 MiB, judged against the L2 roof (80 GB/s) it beats at 100 GB/s (125%); batch 2 at
    # 40 GB/s (50% of the L3's)
    norm = Cost(MiB // 4, MiB)
    rf = rf_of(cpu(), [at(point("swiglu", norm, 1), 100 * GB), at(point("swiglu", norm, 2), 20 * GB)])
    fig, ax = new_figure(6, 4)
    plot_compare(ax, [rf], "decode", "fraction")
    assert ax.get_ylim()[1] == FRACTION_TOP
    clipped = next(c for c in ax.collections if c.get_gid() == "clipped")
    (xy,) = clipped.get_offsets()
    assert tuple(xy) == (1, FRACTION_TOP) and not clipped.get_clip_on()
    assert [t.get_text() for t in ax.texts if t.get_gid() == "clipped-value"] == ["125%"]
    (note,) = [t.get_text() for t in ax.texts if t.get_gid() == "clipped-note"]
    assert note.startswith("1 step(s) above 110%")


def test_a_busy_runs_time_breakdown_carries_the_warning(tmp_path):
    rf = read_results(busy(H100, tmp_path / "busy.jsonl"))
    f = time_figure(rf, "decode")
    ax = f.figure.axes[0]
    n = len(analyze(rf).phase_steps("decode"))
    assert f"WARNING: busy machine (host-busy): {n} of {n} steps unreliable" in ax.get_title()
    assert f.caption.startswith("WARNING: Measured on a busy machine")
    assert all(t.get_text().endswith("unreliable") for t in ax.get_xticklabels())
    quiet = time_figure(read_results(H100), "decode")
    assert "WARNING" not in quiet.figure.axes[0].get_title() and not quiet.caption.startswith("WARNING")


def _outside(fig) -> list:
    """Texts drawn past the figure's edge: titles, axis labels, legends, annotations (tick labels aside: matplotlib
    keeps those of ticks beyond the view, never drawn)."""
    from matplotlib.axis import Tick
    freeze_layout(fig)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ticks = {id(t) for tick in fig.findobj(Tick) for t in (tick.label1, tick.label2)}
    out = []
    for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_window_extent")):
        if id(t) in ticks or not t.get_visible() or not t.get_text().strip():
            continue
        e = t.get_window_extent(r)
        if e.x0 < -1 or e.y0 < -1 or e.x1 > fig.bbox.x1 + 1 or e.y1 > fig.bbox.y1 + 1:
            out.append((t.get_text(), e.bounds))
    return out


def test_no_run_figure_draws_text_past_its_edge(tmp_path):
    from reports.figures import run_figures
    for rf in (read_results(H100), read_results(busy(H100, tmp_path / "busy.jsonl"))):
        for f in run_figures(rf):
            assert _outside(f.figure) == [], f.key


def test_a_report_of_two_files_named_alike_names_its_sections_apart(tmp_path):
    from reports import write_report
    rfs = _copies(tmp_path, ["run-a", "run-b"])
    write_report(rfs, tmp_path / "rep")
    heads = [ln for ln in (tmp_path / "rep" / "report.md").read_text().splitlines() if ln.startswith("## NVIDIA")]
    assert heads == ["## NVIDIA H100 SXM5 80GB (run-a/results.jsonl)", "## NVIDIA H100 SXM5 80GB (run-b/results.jsonl)"]


def test_a_busy_runs_roofline_caption_says_first_what_to_do(tmp_path):
    from reports.figures import roofline_figure
    f = roofline_figure(read_results(busy(H100, tmp_path / "busy.jsonl")))
    assert f.caption.startswith("WARNING: Measured on a busy machine") and "Measure again on a quiet machine" in f.caption
    assert not roofline_figure(read_results(H100)).caption.startswith("WARNING")
