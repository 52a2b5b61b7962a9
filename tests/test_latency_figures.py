"""Latency figures read back from the axes (what was drawn), on built timelines and the recorded CPU fixture."""

from pathlib import Path

import pytest

from reports.latency_figures import (latency_section, plot_chunk_tradeoff, plot_distribution,
                                     plot_request_timeline)
from reports.style import new_figure
from roofline.latency import LatencySummary, RequestTimeline, timeline_from_stages
from roofline.records import read_results

DATA = Path(__file__).parent / "data"


def test_timeline_draws_queue_chunks_decode_and_first_token():
    seed = timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
    chunked = RequestTimeline(id=1, arrival=0.01, chunks=((0.03, 0.05, 16), (0.06, 0.08, 16)), first_selected=0.08,
                              deliveries=(0.09, 0.1), finish=0.1)
    fig, ax = new_figure(5, 2)
    plot_request_timeline(ax, [seed, chunked])
    bars = {c.get_label(): c for c in ax.collections}
    # seed request: queue 0 -> 20 ms, one prefill chunk 20 -> 100 ms, decode 105 -> 180 ms
    q = bars["queue"].get_paths()[0].get_extents()
    assert (q.x0, q.x1) == pytest.approx((0.0, 20.0))
    p = bars["prefill chunk"].get_paths()[0].get_extents()
    assert (p.x0, p.x1) == pytest.approx((20.0, 100.0))
    d = bars["decode"].get_paths()[0].get_extents()
    assert (d.x0, d.x1) == pytest.approx((105.0, 180.0))
    first = [ln for ln in ax.lines if ln.get_label() == "first token"]
    assert list(first[0].get_xdata()) == pytest.approx([105.0])
    ticks = [ln for ln in ax.lines if ln.get_marker() == "|"]
    assert list(ticks[0].get_xdata()) == pytest.approx([105.0, 130.0, 155.0, 180.0])   # four tokens
    # the chunked request's two chunks are drawn as two bars on row 1
    assert sum(len(c.get_paths()) for c in ax.collections if c.get_facecolor()[0][0] > 0.9) >= 3


def test_distribution_is_an_ecdf_in_ms():
    fig, ax = new_figure(4, 3)
    plot_distribution(ax, {"a": [0.3, 0.1, 0.2]}, "TTFT")
    (ln,) = ax.lines
    assert list(ln.get_xdata()) == pytest.approx([100.0, 200.0, 300.0])
    assert list(ln.get_ydata()) == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_chunk_tradeoff_plots_ttft_and_itl_in_budget_order():
    def summ(b, ttft, itl):
        return LatencySummary(config=f"chunk={b}", settings={"chunk_budget": b, "prefix_cache": True},
                              ttft={"p90": ttft}, itl={"p99": itl})
    fig, ax = new_figure(4, 3)
    plot_chunk_tradeoff(ax, [summ(None, 0.5, 0.5), summ(16, 1.0, 0.02), summ(64, 0.6, 0.08)])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "64", "none"]
    ttft, itl = ax.lines
    assert list(ttft.get_ydata()) == pytest.approx([1000.0, 600.0, 500.0])
    assert list(itl.get_ydata()) == pytest.approx([20.0, 80.0, 500.0])


def test_latency_section_on_the_recorded_sweep():
    rf = read_results(DATA / "latency_sweep_cpu.jsonl")
    section = latency_section(rf)
    assert [t for t, _, _ in section] == ["Latency summary", "Request timelines", "TTFT and ITL distributions",
                                          "Chunk-budget trade-off"]
    table = section[0][1].axes[0].tables[0]
    cells = table.get_celld()
    assert cells[(0, 0)].get_text().get_text() == "configuration"
    summary = rf.summaries[0]
    assert cells[(1, 0)].get_text().get_text() == summary.config
    assert cells[(1, 1)].get_text().get_text() == f"{summary.ttft['p50'] * 1e3:.1f}"
    assert "TPOT = (last delivery - first delivery) / (n - 1)" in section[0][2]
    section = section[1:]
    timelines_fig = section[0][1]
    assert len(timelines_fig.axes) == 6                                  # one per configuration
    n_req = rf.header.settings["requests"]
    assert all(len(ax.get_yticks()) == n_req for ax in timelines_fig.axes)
    trade = section[2][1].axes[0]
    assert [t.get_text() for t in trade.get_xticklabels()] == ["16", "64", "none"]
    assert len(trade.lines) == 4                                         # TTFT and ITL, cache off and on
    assert all("TTFT" in cap or "chunk" in cap or "queue" in cap for _, _, cap in section)
