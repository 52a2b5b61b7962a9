"""Issue 22: noise as a gate. A run measured on a busy host says so first (table, report, diagnose, compare),
its steps' verdicts are withheld, a comparison with a noisy side is not judged, and a change against its
prediction is said so."""

import json
from pathlib import Path
from types import SimpleNamespace as NS

from profiler.export import phase_table
from profiler.run import host_load
from roofline.analysis import UNRELIABLE, analyze
from roofline.verdicts.change_rules import AGAINST, step_outcome
from roofline.verdicts.comparison import compare
from roofline.verdicts.diagnosis import change_findings, diagnose
from roofline.records import read_results

DATA = Path(__file__).parent / "data"


def busy_copy(src: Path, dst: Path, every: int = 1, ceilings: bool = False) -> Path:
    """``src`` with every ``every``-th measurement flagged host-busy (and the ceilings, with ``ceilings``)."""
    lines = src.read_text().splitlines()
    out, k = [], 0
    for ln in lines:
        d = json.loads(ln)
        if d.get("type") == "measurement":
            if k % every == 0:
                d["flags"] = list(d.get("flags", [])) + ["host-busy"]
            k += 1
        if d.get("type") == "header" and ceilings:
            d["ceilings"] = dict(d.get("ceilings") or {}, flags=["host-busy"])
        out.append(json.dumps(d))
    dst.write_text("\n".join(out) + "\n")
    return dst


def test_a_busy_run_withholds_its_verdicts(tmp_path):
    quiet = analyze(read_results(DATA / "reports_h100.jsonl"))
    a = analyze(read_results(busy_copy(DATA / "reports_h100.jsonl", tmp_path / "busy.jsonl")))
    assert not quiet.noisy and quiet.noise_note == "" and all(s.reliable for s in quiet.steps)
    n = len(a.ok)
    assert a.noisy and a.busy_points == n and f"{n} of {n} points were timed" in a.noise_note
    assert {s.verdict for s in a.steps} == {UNRELIABLE} and all(s.busy_share == 1.0 for s in a.steps)
    s = a.steps[0]
    assert "unreliable, no verdict" in s.sentence and f"-bound" not in s.sentence
    assert s.label == quiet.steps[0].label         # the label is kept for figures; readers are told the verdict


def test_a_few_busy_points_do_not_veto_the_run(tmp_path):
    rf = read_results(busy_copy(DATA / "reports_h100.jsonl", tmp_path / "b.jsonl", every=10))
    a = analyze(rf)
    assert 0 < a.busy_points < 0.25 * len(a.ok) and not a.noisy


def test_busy_ceilings_make_the_run_noisy(tmp_path):
    rf = read_results(busy_copy(DATA / "reports_h100.jsonl", tmp_path / "c.jsonl", every=10**6, ceilings=True))
    a = analyze(rf)
    assert a.noisy and "ceilings were measured on a busy host" in a.noise_note


def test_the_table_and_diagnose_say_it_first(tmp_path):
    rf = read_results(busy_copy(DATA / "reports_h100.jsonl", tmp_path / "busy.jsonl"))
    table = phase_table(rf).splitlines()
    assert table[0].startswith("WARNING: Measured on a busy machine")
    assert all(row.rstrip().endswith(UNRELIABLE) for row in table[3:] if row.startswith(("prefill", "decode")))
    fs = diagnose([rf])
    assert fs[0].rule == "noisy-run" and "phase-bound" not in {f.rule for f in fs}


def test_a_latency_run_on_a_busy_host_is_noisy(tmp_path):
    before = {"ticks_total": 1000, "ticks_busy": 100, "ticks_self": 50, "ticks_steal": 0}
    after = {"ticks_total": 2000, "ticks_busy": 1000, "ticks_self": 300, "ticks_steal": 0, "loadavg_1m": 5.0,
             "usable_cpus": 2}
    rec = host_load("chunk=64,prefix-cache=on", before, after)
    # others: (1000 - 100) - (300 - 50) = 650 of 1,000 ticks
    assert rec["others_share"] == 0.65 and rec["busy"] and rec["type"] == "host-load"
    p = tmp_path / "latency.jsonl"
    p.write_text((DATA / "latency_sweep_cpu.jsonl").read_text() + json.dumps(rec) + "\n")
    a = analyze(read_results(p))
    assert a.noisy and "1 latency configuration(s) ran on a busy host" in a.noise_note
    assert diagnose([read_results(p)])[0].rule == "noisy-run"


def test_a_comparison_with_a_noisy_side_is_not_judged(tmp_path):
    before = read_results(DATA / "reports_h100.jsonl")
    after = read_results(busy_copy(DATA / "reports_h100.jsonl", tmp_path / "after.jsonl"))
    c = compare(before, after)
    assert c.noise_note.startswith("The after run was measured on a busy machine")
    fs = change_findings(c)
    assert fs[0].rule == "compare-noisy" and not any(f.rule.endswith("-effect") for f in fs)
    assert compare(before, read_results(DATA / "reports_h100.jsonl")).noise_note == ""


def _step(pred, got, lo, hi, verdict):
    return NS(comparable=True, predicted_speedup=pred, time=NS(speedup=got, verdict=verdict, interval=(lo, hi)))


def test_a_change_against_its_prediction_is_said_so():
    # predicted 0.9x (slightly slower), measured 20x slower: same sign, far beyond the noise
    assert step_outcome(_step(0.9, 0.05, 0.048, 0.052, "slower")) == AGAINST
    assert step_outcome(_step(0.9, 0.89, 0.85, 0.93, "slower")) == "as predicted"
    assert step_outcome(_step(1.9, 0.5, 0.45, 0.55, "slower")) == AGAINST     # the other way
    assert step_outcome(_step(1.0, 3.0, 2.8, 3.2, "faster")) == AGAINST       # moved, nothing predicted
    assert step_outcome(_step(1.9, 1.3, 1.25, 1.35, "faster")) == "partly"
    assert step_outcome(_step(1.9, 1.8, 1.7, 1.9, "faster")) == "as predicted"


def test_the_report_says_it_at_the_top(tmp_path):
    from reports import write_report

    p = busy_copy(DATA / "reports_h100.jsonl", tmp_path / "busy.jsonl")
    paths = write_report([p], tmp_path / "r")
    md = paths["markdown"].read_text().splitlines()
    assert md[2].startswith("> Measured on a busy machine")
    html = paths["html"].read_text()
    assert html.index("Measured on a busy machine") < html.index("<table")
    # the headline verdicts' badges say it too (not the label the figures keep)
    assert '<span class="tag unreliable">unreliable</span>' in html
    assert '<span class="tag memory">' not in html.split("<table")[0]
