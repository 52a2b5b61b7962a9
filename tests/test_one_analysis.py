"""One reading of a result file (issue 10): every consumer of a two-backend file agrees with roofline.analysis.

tests/data/reports_two_backends.jsonl holds the same decode steps on the triton and the torch
backend (device: 1e12 B/s, bf16 1e14 FLOP/s; model tiny, 2 layers). Its largest kernel differs by
backend, so a consumer that merged the backends (as `diagnose` once did, adding both backends'
times into one step) names the wrong kernel and the wrong time:

    decode, context 100        triton                  torch
      batch 1  q_proj          2 ms                    1.25 ms
               attention       5 ms  (largest)         0.25 ms
      step                     2 x 7 ms = 14 ms        2 x 1.5 ms = 3 ms
      batch 8  step            2 x 10.2 ms = 20.4 ms   2 x 3 ms = 6 ms
"""

import csv
import re
from pathlib import Path

import pytest

from profiler.export import phase_table, write_csv
from reports import write_report
from reports.style import new_figure
from reports.time_plot import plot_time_breakdown
from roofline import units as U
from roofline.analysis import analyze
from roofline.verdicts.diagnosis import diagnose
from roofline.records import read_results

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def rf():
    return read_results(DATA / "reports_two_backends.jsonl")


@pytest.fixture(scope="module")
def steps(rf):
    return {(s.backend, s.batch): s for s in analyze(rf).steps}


def test_the_analysis_keeps_backends_apart(steps):
    assert set(steps) == {("triton", 1), ("torch", 1), ("triton", 8), ("torch", 8)}
    assert steps[("triton", 1)].time_s == pytest.approx(14e-3)       # 2 layers x (2 + 5) ms
    assert steps[("torch", 1)].time_s == pytest.approx(3e-3)         # 2 layers x (1.25 + 0.25) ms
    assert steps[("triton", 8)].time_s == pytest.approx(20.4e-3) and steps[("torch", 8)].time_s == pytest.approx(6e-3)
    assert steps[("triton", 1)].top.op == "attention" and steps[("torch", 1)].top.op == "q_proj"
    # torch b1: 4.8e9 FLOP / 3 ms = 1.6e12 FLOP/s of 2.034 FLOP/B x 1e12 B/s -> 78.7% of the roof: memory-bound
    assert steps[("torch", 1)].roof_fraction == pytest.approx(1.6e12 / (4.8e9 / 2.36e9 * 1e12))
    assert steps[("torch", 1)].label == "memory"
    # triton b1: 4.8e9 / 14 ms = 3.43e11 FLOP/s -> 16.9% of the same roof: overhead, not memory
    assert steps[("triton", 1)].label == "overhead"


def test_diagnose_judges_each_backend_with_its_own_steps(rf, steps):
    found = diagnose([rf])
    phase = [f for f in found if f.rule == "phase-bound"]
    assert [f.claim for f in phase] == ["Decode (torch) is memory-bound at every measured batch and context.",
                                        "Decode (triton) is overhead-bound at every measured batch and context."]
    for f, backend in zip(phase, ("torch", "triton")):
        big = steps[(backend, 8)]      # the largest step of each backend
        assert (f"its largest kernel {big.top.op} {U.ms(big.top.median_s)}" in f.evidence), f.evidence
        assert f"{U.percent(big.roof_fraction)} of its roof" in f.evidence
    batch = {f.claim: f.evidence for f in found if f.rule == "decode-batch"}
    # torch: batch 8 takes 6 ms for 8x the tokens of batch 1's 3 ms -> 4.0x tokens/s
    assert "decode (torch) at context 100: batch 1 takes 3.0 ms per step, batch 8 takes 6.0 ms" in \
        batch["A larger decode batch would raise throughput (torch)."]


def test_the_profile_table_shows_the_same_steps(rf, steps):
    rows = [ln.split() for ln in phase_table(rf).splitlines()[2:]]
    assert len(rows) == 4
    for phase, backend, batch, context, t, unit, intensity, roof, label in rows:
        s = steps[(backend, int(batch))]
        assert f"{t} {unit}" == U.seconds(s.time_s) and roof == U.percent(s.roof_fraction) and label == s.label


def test_the_csv_carries_each_row_with_its_own_step(rf, steps, tmp_path):
    write_csv(rf, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert len(rows) == 8
    for r in rows:
        s = steps[(r["backend"], int(r["batch"]))]
        assert float(r["step_time_s"]) == pytest.approx(s.time_s) and r["step_label"] == s.label
        assert int(r["count"]) == 2 and r["label"] in ("memory", "compute", "overhead")


def test_the_time_breakdown_bars_total_the_steps(rf):
    fig, ax = new_figure(6, 4)
    plot_time_breakdown(ax, rf, "decode")
    totals = [t.get_text() for t in ax.texts]
    order = analyze(rf).phase_steps("decode")
    assert totals == [U.seconds(s.time_s) for s in order]
    assert [t.get_text().split("\n")[-1] for t in ax.get_xticklabels()] == [s.backend for s in order]


def test_the_html_and_markdown_tables_show_the_same_steps(rf, steps, tmp_path):
    paths = write_report([rf], tmp_path / "rep")
    md = paths["markdown"].read_text()
    html = paths["html"].read_text()
    for (backend, batch), s in steps.items():
        row = f"| decode | {batch} | 100 | {backend} | {U.seconds(s.time_s)} |"
        assert row in md, row
        assert re.search(rf">{backend}</td><td[^>]*>{re.escape(U.seconds(s.time_s))}</td>", html), (backend, batch)
