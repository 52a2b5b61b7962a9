"""Exact arithmetic of the latency metrics (roofline/latency.py), the seed's example first."""

import math

import pytest

from roofline.errors import RooflineError
from roofline.latency import (RequestTimeline, arrival_times, meets_slo, parse_slo, stats, summarize,
                              timeline_from_stages)


def seed_timeline(**kw):
    # queue+prep 20 ms, prefill+select 80 ms, delivery 5 ms, three 25 ms gaps
    return timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3, **kw)


def test_seed_example_ttft_finish_gaps():
    t = seed_timeline()
    assert t.ttft == pytest.approx(0.105)          # 20 + 80 + 5
    assert t.finish - t.arrival == pytest.approx(0.180)  # 105 + 3 x 25
    assert t.e2e == pytest.approx(0.180)
    assert t.n == 4 and len(t.itls) == 3           # four tokens, three gaps
    assert sum(t.itls) / 3 == pytest.approx(0.025)
    assert t.tpot == pytest.approx(0.025)          # (180 - 105) / (4 - 1)
    st = t.stages
    assert st["queue"] == pytest.approx(0.020) and st["prefill"] == pytest.approx(0.080)
    assert st["delivery"] == pytest.approx(0.005) and st["decode"] == pytest.approx(0.075)
    assert sum(st.values()) == pytest.approx(t.e2e)


def test_tpot_undefined_for_one_token():
    t = timeline_from_stages(queue=0.01, prefill=0.02, first_delivery=0.0)
    assert t.n == 1 and math.isnan(t.tpot) and t.itls == []
    s = summarize([t, seed_timeline(arrival=1.0)])
    assert s.tpot_undefined == 1
    assert s.tpot["n"] == 1 and s.tpot["mean"] == pytest.approx(0.025)


def test_percentiles_linear_interpolation():
    st = stats([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0])
    assert st["p50"] == 6.0                       # middle of 11
    assert st["p90"] == pytest.approx(10.0)       # pos (11-1)*0.9 = 9 -> 10
    assert st["p99"] == pytest.approx(10.9)       # pos 9.9 -> 10 + 0.9
    assert st["mean"] == 6.0 and st["n"] == 11
    empty = stats([])
    assert empty["n"] == 0 and math.isnan(empty["p50"])


def test_goodput_counts_requests_meeting_every_slo_and_failures():
    fast = seed_timeline(arrival=0.0)                               # ttft 105, tpot 25, e2e 180 ms
    slow_ttft = timeline_from_stages(queue=0.3, prefill=0.08, first_delivery=0.0, gaps=(0.01,), arrival=0.5, id=1)
    slow_tpot = timeline_from_stages(queue=0.01, prefill=0.01, first_delivery=0.0, gaps=(0.1, 0.1), arrival=1.0, id=2)
    failed = RequestTimeline(id=9, arrival=1.5, finish=1.6, status="failed", error="boom")
    slo = parse_slo("ttft=200ms,tpot=50ms")
    assert [meets_slo(t, slo) for t in (fast, slow_ttft, slow_tpot, failed)] == [True, False, False, False]
    s = summarize([fast, slow_ttft, slow_tpot, failed], slo)
    assert s.requests == 4 and s.failed == 1 and s.met_slo == 1
    # duration: last finish (slow_tpot: 1.0 + 0.02 + 0.2 = 1.22; failed 1.6) - first arrival 0 = 1.6 s
    assert s.duration_s == pytest.approx(1.6)
    assert s.goodput_rps == pytest.approx(1 / 1.6)
    assert s.throughput_rps == pytest.approx(3 / 1.6)
    # the failed request is in the counts but not in the latency distributions
    assert s.ttft["n"] == 3
    # pooled ITL: 3 x 25 ms + 10 ms + 2 x 100 ms
    assert s.itl["n"] == 6 and s.itl["mean"] == pytest.approx((0.075 + 0.01 + 0.2) / 6)
    # per request: the same gaps, kept apart
    assert s.itl_by_request["0"]["mean"] == pytest.approx(0.025) and s.itl_by_request["0"]["n"] == 3
    assert s.itl_by_request[str(slow_tpot.id)]["max"] == pytest.approx(0.1)


def test_summary_roundtrip_and_timeline_roundtrip():
    t = seed_timeline()
    assert RequestTimeline.from_dict(t.to_dict()) == t
    s = summarize([t], parse_slo("e2e=2s"), config="chunk=64")
    d = s.to_dict()
    assert d["type"] == "latency-summary" and any("TTFT" in f for f in d["formulas"])
    assert d["goodput_rps"] == pytest.approx(1 / 0.18)


@pytest.mark.parametrize("text,seconds", [("ttft=200ms,tpot=50ms,e2e=2s", {"ttft": 0.2, "tpot": 0.05, "e2e": 2.0}),
                                          (" TTFT = 1.5s ", {"ttft": 1.5}), ("tpot=500us", {"tpot": 5e-4}), ("", {})])
def test_parse_slo(text, seconds):
    got = parse_slo(text)
    assert got.keys() == seconds.keys()
    for k in got:
        assert got[k] == pytest.approx(seconds[k])


@pytest.mark.parametrize("bad,msg", [("ttft=200", "malformed"), ("ttft200ms", "malformed"), ("foo=1s", "unknown"),
                                     ("ttft=1s,ttft=2s", "twice"), ("ttft=0ms", "above zero"), ("ttft=-1ms", "malformed")])
def test_parse_slo_rejects(bad, msg):
    with pytest.raises(RooflineError, match=msg):
        parse_slo(bad)


def test_arrivals_fixed_and_seeded_poisson():
    assert arrival_times(4, 2.0, "fixed") == [0.0, 0.5, 1.0, 1.5]
    a, b = arrival_times(50, 4.0, "poisson", seed=3), arrival_times(50, 4.0, "poisson", seed=3)
    assert a == b and a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:]))
    assert arrival_times(2000, 4.0, "poisson", seed=1)[-1] / 1999 == pytest.approx(0.25, rel=0.1)
    for rate in (0, -1.0):
        with pytest.raises(RooflineError, match="rate"):
            arrival_times(3, rate)
