"""``roofline compare``: recorded pairs whose answer is known (tests/data/make_fixtures.py).

* reports_h100.jsonl against itself: no change anywhere.
* reports_h100_slow_op.jsonl: the same file with decode o_proj at batch 32, context 1,024 taking
  exactly twice as long: that op, and its step, are the only moves; the step's slowdown is the
  op's extra time (32 layers x its median).
* reports_h100_w8.jsonl: the sweep with int8 weights: matched without the weight dtype, and judged
  against the weight-quantization rule (decode bytes down as the cost model says).
* latency_sweep_cpu_late.jsonl: every token 0.5 s later: TTFT p50 slower by exactly that in every
  configuration, TPOT and ITL unchanged.
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline import workload as W
from roofline.analysis import analyze
from roofline.verdicts.change import MIN_CHANGE, SAME, SLOWER, UNBOUNDED, Change
from roofline.verdicts.comparison import compare
from roofline.verdicts.diagnosis import change_findings
from roofline.errors import RooflineError
from roofline.models import PRESETS
from roofline.records import read_results
from roofline.stats import quantile, quantile_interval
from roofline.writer import ResultWriter

DATA = Path(__file__).parent / "data"
H100, SLOW, W8, A100 = (DATA / f"{n}.jsonl" for n in ("reports_h100", "reports_h100_slow_op", "reports_h100_w8",
                                                        "reports_a100"))
LAT, LATE = DATA / "latency_sweep_cpu.jsonl", DATA / "latency_sweep_cpu_late.jsonl"
SLOW_OP = ("o_proj", "decode", 32, 1024)   # tests/data/make_fixtures.py
LATE_S = 0.5


@pytest.fixture(scope="module")
def h100():
    return analyze(read_results(H100))


def test_a_file_against_itself_changes_nothing(h100):
    c = compare(h100, analyze(read_results(H100)))
    assert c.changed == {} and c.only_before == [] and c.only_after == []
    assert len(c.ops) == 326 and c.flagged == []                    # 327 points, one skipped in both
    assert [(b.op, b.point.batch, b.point.context) for _, b, _ in c.skipped] == [("attention", 8, 4096)]
    assert all(o.time.speedup == 1.0 and o.time.verdict == SAME for o in c.ops)
    assert len(c.steps) == 18 and {s.verdict for s in c.steps} == {SAME}
    rules = {f.rule for f in change_findings(c)}
    assert "change-regressions" not in rules
    effect = [f for f in change_findings(c) if f.rule == "same-workload-effect"]
    assert [f.data["as_predicted"] for f in effect] == [6, 12]      # prefill, decode: every step as predicted


def test_one_op_twice_as_slow_is_exactly_that_op_and_its_step_moves_by_the_arithmetic(h100):
    c = compare(h100, read_results(SLOW))
    assert [o.title for o in c.flagged] == ["decode o_proj b32 c1024"]
    o = c.flagged[0]
    assert c.ops[0] is o                                             # the largest time lost sorts first
    assert o.time.speedup == pytest.approx(0.5) and o.time.verdict == SLOWER
    m = o.before.m
    # the interval: [before p20 / after p80, before p80 / after p20], the after samples being 2x the before
    assert o.time.interval == pytest.approx((m.p20_s / (2 * m.p80_s), m.p80_s / (2 * m.p20_s)))
    moved = [s for s in c.steps if s.verdict != SAME]
    assert [s.title for s in moved] == ["Decode at batch 32, context 1,024"]
    s = moved[0]
    # the step gains exactly one more o_proj per layer: 32 layers x its median
    assert o.before.count == 32
    assert s.time.after == pytest.approx(s.time.before + 32 * m.median_s, rel=1e-12)
    assert s.time.speedup == pytest.approx(s.time.before / (s.time.before + 32 * m.median_s), rel=1e-12)
    assert s.time.saved == pytest.approx(-32 * m.median_s)
    assert o in s.ops and s.comparable
    reg = next(f for f in change_findings(c) if f.rule == "change-regressions")
    assert reg.data["ops"] == ["decode o_proj b32 c1024"] and "2.00x slower" in reg.evidence


@pytest.mark.parametrize("before, after, rng_b, rng_a, verdict", [
    (1.0, 1.02, (0.99, 1.01), (1.01, 1.03), SAME),        # 2%: under MIN_CHANGE, whatever the ranges
    (1.0, 0.8, (0.7, 1.3), (0.7, 0.9), SAME),             # 1.25x, but [0.7 / 0.9, 1.3 / 0.7] holds 1
    (1.0, 0.8, (0.98, 1.02), (0.79, 0.81), "faster"),     # [0.98 / 0.81, 1.02 / 0.79] = [1.21, 1.29]
    (1.0, 1.25, (0.98, 1.02), (1.24, 1.26), SLOWER),
    (1.0, 2.0, (0.9, math.inf), (1.9, 2.1), UNBOUNDED),   # a p99 of a few requests: no claim
])
def test_the_noise_rule(before, after, rng_b, rng_a, verdict):
    ch = Change(before, after, rng_b, rng_a)
    assert ch.verdict == verdict
    assert ch.speedup == pytest.approx(before / after)
    if verdict in ("faster", SLOWER):
        lo, hi = ch.interval
        assert (lo, hi) == pytest.approx((rng_b[0] / rng_a[1], rng_b[1] / rng_a[0])) and not lo <= 1 <= hi
    assert MIN_CHANGE == 0.03


def test_quantile_interval_is_the_binomial_order_statistics():
    xs = [float(i) for i in range(1, 11)]
    # n = 10, q = 0.5: Binomial(10, 0.5) has its p20 at 4 and p80 at 6, so ranks 4 and 6 + 1
    assert quantile_interval(xs, 0.5) == (4.0, 7.0)
    lo, hi = quantile_interval(xs[:6], 0.9)     # 6 samples: P(all 6 under the p90) = 0.9^6 = 53% > 20%
    assert hi == math.inf and lo <= quantile(xs[:6], 0.9)
    big = [float(i) for i in range(200)]
    lo, hi = quantile_interval(big, 0.99)       # 200 samples bound a p99
    assert math.isfinite(hi) and lo <= quantile(big, 0.99) <= hi


def test_weight_quantization_is_matched_without_the_dtype_and_judged_by_its_rule(h100):
    c = compare(h100, read_results(W8))
    assert c.changed == {"weight_dtype": ("bf16", "int8")} and "weights bf16 -> int8" in c.change_text
    assert "weight_dtype" not in c.point_fields
    assert len(c.ops) == 323 and len(c.only_before) == 3          # the layer op, measured in the bf16 file only
    model = PRESETS["llama-3-8b"]
    for s in (s for s in c.steps if s.phase == "decode"):
        k = s.after.key
        bf16, int8 = W.decode(model, k.batch, k.context), W.decode(model, k.batch, k.context, weight_dtype="int8")
        assert s.bytes_ratio == pytest.approx(bf16.total.bytes / int8.total.bytes, rel=1e-9)   # the cost model's
        assert s.time.verdict == "faster"
    effect = {f.data["phase"]: f for f in change_findings(c) if f.rule == "weight-quantization-effect"}
    assert effect["decode"].data["as_predicted"] == 12
    assert "did what its rule predicted in decode: bytes down" in effect["decode"].claim
    assert "step time down" in effect["decode"].claim


def test_latency_percentiles_before_and_after_with_the_same_noise_rule():
    c = compare(read_results(LAT), read_results(LATE))
    configs = {x.config for x in c.latency}
    assert len(configs) == 6 and c.ops == [] and c.steps == []
    for x in c.latency:
        if x.metric == "TTFT" and x.pct == "p50":
            assert x.change.after == pytest.approx(x.change.before + LATE_S) and x.change.verdict == SLOWER
        elif x.metric == "TTFT":      # 6 requests cannot bound a p90 or a p99
            assert x.change.verdict == UNBOUNDED
        else:                         # every gap the same: TPOT and ITL did not move
            assert x.change.speedup == pytest.approx(1.0) and x.change.verdict == SAME
    itself = compare(read_results(LAT), read_results(LAT))
    assert {x.change.verdict for x in itself.latency} == {SAME}
    lat = [f for f in change_findings(c) if f.rule == "change-latency"]
    assert len(lat) == 6 and all("TTFT p50" in f.claim and "slower" in f.claim for f in lat)


def test_different_devices_are_refused_unless_allowed(tmp_path):
    with pytest.raises(RooflineError, match="--across-models"):
        compare(read_results(H100), read_results(A100))
    c = compare(read_results(H100), read_results(A100), across_models=True)
    assert any(n.startswith("Across models or devices, as asked (--across-models): different devices: ")
               and "NVIDIA H100" in n for n in c.notes)
    r = CliRunner().invoke(main, ["compare", str(H100), str(A100), "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "--across-models" in r.stderr and not (tmp_path / "c" / "report.html").exists()


def test_points_and_steps_in_one_file_only_are_listed(tmp_path, h100):
    rf = read_results(H100)
    part = tmp_path / "part.jsonl"
    with ResultWriter(part, rf.header) as w:
        for m in rf.measurements:
            if not (m.point.phase == "decode" and m.point.batch == 128):
                w.write(m)
    c = compare(h100, read_results(part))
    gone = {(r.point.phase, r.point.batch) for r in c.only_before}
    assert gone == {("decode", 128)} and len(c.only_before) == 3 * 18 and c.only_after == []
    assert sorted(s.context for s in c.steps_only_before) == [128, 1024, 4096] and c.flagged == []


def test_a_trace_is_matched_by_op_and_shape(tmp_path):
    res = CliRunner().invoke(main, ["trace", str(DATA / "traces" / "gpu_new.json"), "--out", str(tmp_path / "t"),
                                    "--json", "--no-report"])
    assert res.exit_code == 0, res.output
    src = Path(json.loads(res.output)["results"])
    rf = read_results(src)
    assert compare(rf, read_results(src)).flagged == []
    target = max((m for m in rf.measurements if m.point.phase == "decode"), key=lambda m: sum(m.times_s))
    slow = tmp_path / "slow.jsonl"
    with ResultWriter(slow, rf.header) as w:
        for m in rf.measurements:
            same = (m.point.op, m.point.phase) == (target.point.op, target.point.phase)
            # the trace's batch and context may differ between captures: a trace is matched by op and shape only
            p = replace(m.point, context=m.point.context + 7)
            w.write(replace(m, point=p, times_s=tuple(2 * t for t in m.times_s) if same else m.times_s))
    c = compare(rf, read_results(slow))
    assert c.point_fields == ("op", "phase") and c.only_before == [] and c.only_after == []
    assert [(o.after.point.op, o.after.point.phase) for o in c.flagged] == [(target.point.op, "decode")]
    assert c.flagged[0].time.speedup == pytest.approx(0.5)


def test_cli_compare_writes_the_report_and_diagnose_reads_it(tmp_path):
    out = tmp_path / "cmp"
    r = CliRunner().invoke(main, ["compare", str(H100), str(SLOW), "--out", str(out)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[-3:] == [str(out / "report.html"), str(out / "report.md"), str(out / "compare.json")]
    assert "decode o_proj b32 c1024 2.00x slower" in r.stdout
    assert "Decode at batch 32, context 1,024 (torch)" in r.stdout and "1.06x slower" in r.stdout
    html = (out / "report.html").read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert html.count("data:image/svg+xml;base64,") == 1 and '<svg class="hover"' in html
    assert html.count('<a href="#c-') > 250 and 'id="t-0"' in html
    md = (out / "report.md").read_text()
    assert "![Before and after on the roofline](figures/change.png)" in md and "| decode | o_proj |" in md
    d = json.loads((out / "compare.json").read_text())
    assert d["format"] == "roofline-compare" and [o["op"] for o in d["flagged_ops"]] == ["decode o_proj b32 c1024"]
    diag = CliRunner().invoke(main, ["diagnose", str(out / "compare.json")])
    assert diag.exit_code == 0, diag.output
    assert "1 op(s) got slower beyond the noise" in diag.stdout and "The change:" in diag.stdout
    base = CliRunner().invoke(main, ["diagnose", str(W8), "--baseline", str(H100), "--json"])
    assert base.exit_code == 0, base.output
    rules = {f["rule"] for f in json.loads(base.stdout)}
    assert {"change-summary", "weight-quantization-effect"} <= rules
    js = CliRunner().invoke(main, ["compare", str(H100), str(H100), "--out", str(tmp_path / "same"), "--json"])
    assert js.exit_code == 0 and json.loads(js.stdout)["flagged_ops"] == []


def test_diagnose_baseline_takes_one_file():
    r = CliRunner().invoke(main, ["diagnose", str(W8), str(SLOW), "--baseline", str(H100)])
    assert r.exit_code == 2 and "--baseline" in r.stderr and len(r.stderr.strip().splitlines()) == 1
