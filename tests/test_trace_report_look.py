"""The trace report as a user reads it: fact lines that agree with each other, figures with a legend that names
what is drawn, and no empty chart (found by running ``roofline trace`` on every fixture trace and looking).

Fixtures: tests/data/traces/gpu_new.json (make_traces.py: an A100 prefill + decode whose host-bound gaps fall
between ops; its 6 kernels all run longer than their launch calls), rocm_replay.json (make_traces_issue24.py:
MI300X graph replays with no capture trace: no op is costed).
"""

from pathlib import Path

import pytest
from click.testing import CliRunner
from matplotlib.colors import to_rgba

from profiler.cli import main
from reports.figures import figure_builders, predicted_figure
from reports.style import CATEGORY_COLORS
from reports.trace_section import trace_facts
from roofline.analysis import analyze
from roofline.records import read_results

DATA = Path(__file__).parent / "data" / "traces"


def _trace(tmp_path_factory, name, *args):
    out = tmp_path_factory.mktemp(name)
    res = CliRunner().invoke(main, ["trace", str(DATA / name), "--out", str(out), "--quiet", *args])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def gpu_new(tmp_path_factory):
    return _trace(tmp_path_factory, "gpu_new.json")


@pytest.fixture(scope="module")
def rocm(tmp_path_factory):
    return _trace(tmp_path_factory, "rocm_replay.json")


def test_no_short_kernel_is_not_said_to_be_dominated_by_launch_overhead(gpu_new):
    facts = trace_facts(analyze(read_results(gpu_new / "results.jsonl")))
    (line,) = [f for f in facts if f.startswith("Kernel launches")]
    # 6 kernels, none shorter than its launch call: no "0 kernel(s) ... launch overhead dominates them"
    assert line.endswith("over 6 kernel(s); no kernel ran shorter than its launch call.")
    assert "launch overhead dominates" not in " ".join(facts)


def test_a_gap_between_ops_reads_as_between_ops_not_as_an_op_named_no_op(gpu_new):
    facts = " ".join(trace_facts(analyze(read_results(gpu_new / "results.jsonl"))))
    assert "the CPU was between ops (Python or framework code)." in facts
    # the 540 us gap at 260 us, host-bound while the host ran Python
    assert "at 260 us 540 us host-bound (CPU between ops (Python or framework code))" in facts
    assert "in no op" not in facts       # ("kernels that joined no op" stays: that is what they did)
    md = (gpu_new / "report.md").read_text()
    assert "CPU in no op" not in md and "was in no op" not in md


def test_a_traces_predicted_chart_colours_and_names_op_categories(gpu_new):
    rf = read_results(gpu_new / "results.jsonl")
    fig = predicted_figure(rf).figure
    (legend,) = fig.legends
    assert legend.get_title().get_text() == "op category"
    # gpu_new costs GEMMs, an add and a cast (the unattributed kernels are uncosted: off the chart)
    assert [t.get_text() for t in legend.get_texts()] == ["gemm", "elementwise", "cast"]
    ax = fig.axes[0]
    colours = {tuple(c[:3]) for coll in ax.collections if str(coll.get_gid()).startswith("pred:")
               for c in coll.get_facecolor()}        # alpha 0.9 aside
    assert colours == {to_rgba(CATEGORY_COLORS[c])[:3] for c in ("gemm", "elementwise", "cast")}


def test_a_replay_with_no_costed_op_gets_no_empty_predicted_chart(rocm):
    rf = read_results(rocm / "results.jsonl")
    assert [n for n, _ in figure_builders(rf)] == ["roofline", "idle"]
    assert not (rocm / "figures" / "predicted.png").exists()
    assert 'id="fig-predicted"' not in (rocm / "report.html").read_text()
