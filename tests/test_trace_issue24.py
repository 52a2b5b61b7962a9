"""Issue 24: every kernel attributed, ranks read together, idle time explained (fixtures:
tests/data/traces/make_traces_issue24.py, whose docstring derives every figure asserted here)."""

import json
from pathlib import Path

import pytest

from roofline import formulas as F
from roofline.devices import find_device
from roofline.verdicts.trace_rules import trace_idle_finding
from roofline.traces.analyze import analyze_trace
from roofline.traces.comms import collectives, overlap
from roofline.traces.events import gpu_time, read_trace, read_traces
from roofline.traces.idle import idle_causes, launch_stats

DATA = Path(__file__).parent / "data" / "traces"
US = 1e-6
MSG = 4_194_304 * 2


def test_rocm_capture_launch_calls_map_every_replayed_kernel():
    replay, capture = read_trace(DATA / "rocm_replay.json"), read_trace(DATA / "rocm_capture.json")
    assert sum(1 for g in capture.gpu if g.kind == "kernel") == 1          # one kernel event of four launches
    r = analyze_trace(replay, captures=[capture])
    a = r.summary["attribution"]
    assert a["replay_mapped_s"] == pytest.approx(250 * US) and a["replay_mapped_share"] == 1.0
    assert a["op_share"] == 1.0 and r.summary["graph_kernels_mapped"] == 4
    ms = {m.point.op: m for m in r.measurements}
    assert ms["aten::mm [1,8192]x[8192,28672] bf16"].point.cost == F.linear(1, 8192, 28672)
    assert list(ms["_C::rms_norm [1,8192] bf16"].times_s) == pytest.approx([10 * US])


def test_rocm_capture_without_launch_kernel_names_maps_only_the_kernel_event(tmp_path):
    d = json.loads((DATA / "rocm_capture.json").read_text())
    for e in d["traceEvents"]:
        e.get("args", {}).pop("kernel", None)
    p = tmp_path / "cap.json"
    p.write_text(json.dumps(d))
    a = analyze_trace(read_trace(DATA / "rocm_replay.json"), captures=[read_trace(p)]).summary["attribution"]
    assert a["replay_mapped_s"] == pytest.approx(100 * US) and a["replay_mapped_share"] == pytest.approx(0.4)


def test_graph_replays_without_capture_are_listed_by_kernel_and_attributed_to_the_cpu_op_around_the_launch():
    r = analyze_trace(read_trace(DATA / "graph_train.json"))
    ms = {m.point.op: m for m in r.measurements}
    # no capture: each replayed kernel by name (2 + 3 GEMM kernels: 60, 40, 50, 50, 20 us), uncosted
    k = ms["ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn (graph replay, no capture)"]
    assert sorted(k.times_s) == pytest.approx([20 * US, 40 * US, 50 * US, 50 * US, 60 * US])
    assert k.flags == ("uncosted",) and k.config["category"] == "gemm"
    a = r.summary["attribution"]
    assert a["replay_cpu_op_s"] == pytest.approx(220 * US) and a["op_s"] == pytest.approx(100 * US)
    assert a["op_share"] == pytest.approx(100 / 380)


def test_kernels_before_the_profiler_window_are_counted_apart():
    t = read_trace(DATA / "graph_train.json")
    g = gpu_time(t)
    assert g["before_window"] == 3 and g["before_window_s"] == pytest.approx(60 * US)
    assert g["unattributed_s"] == 0.0
    r = analyze_trace(t)
    assert r.summary["attribution"]["before_window_s"] == pytest.approx(60 * US)
    early = [i for i in r.instances if i.name == "launched before the profiler window elementwise"]
    assert len(early) == 3 and sum(i.seconds for i in early) == pytest.approx(60 * US)
    assert not any(i.name.startswith("unattributed") for i in r.instances)


def test_idle_split_into_causes_with_the_cpu_op():
    t = read_trace(DATA / "idle_causes.json")
    idle = idle_causes(t)
    c = idle["by_cause_s"]
    assert c["host-bound"] == pytest.approx(100 * US) and c["synchronisation"] == pytest.approx(50 * US)
    assert c["other"] == pytest.approx(27 * US)
    assert idle["idle_s"] == pytest.approx(gpu_time(t)["idle_s"]) == pytest.approx(177 * US)
    assert idle["dominant"] == "host-bound" and idle["dominant_share"] == pytest.approx(100 / 177)
    assert idle["host_ops"][0]["op"] == "vllm::prepare_inputs"
    assert [x["cause"] for x in idle["largest"]] == ["host-bound", "synchronisation", "other"]


def test_launch_statistics():
    ls = launch_stats(read_trace(DATA / "idle_causes.json"))
    # delays A 50, B 20, C 10, E 10, D 85 us; E runs 3 us against its 5 us launch call
    assert ls["kernels"] == 5 and ls["delay_p50_s"] == pytest.approx(20 * US)
    assert ls["delay_max_s"] == pytest.approx(85 * US)
    assert ls["short_kernels"] == 1 and ls["short_s"] == pytest.approx(3 * US)


def test_collectives_matched_across_ranks_busbw_wait_straggler():
    traces = read_traces(DATA / "ranks_skew")
    link = find_device("h100").link
    c = collectives(traces, link)
    assert c["matched"] == 2 and c["unmatched"] == 0 and "Seq" in c["method"]
    one, two = c["calls"]
    assert one["message_bytes"] == MSG and one["transfer_s"] == pytest.approx(70 * US)
    assert one["wait_s"] == pytest.approx({"0": 80 * US, "1": 0.0}) and one["last_rank"] == 1
    assert two["transfer_s"] == pytest.approx(80 * US) and two["last_rank"] == 0
    algbw, busbw = F.bus_bandwidth("all_reduce", MSG, 70 * US, 2)
    assert one["algbw"] == pytest.approx(algbw) and one["busbw"] == pytest.approx(busbw)
    assert one["busbw"] == pytest.approx(MSG / 70e-6)       # 2(n-1)/n = 1 for two ranks
    (k,) = c["by_kind"]
    assert k["median_transfer_s"] == pytest.approx(75 * US) and k["calls"] == 2
    assert k["link_fraction"] == pytest.approx(MSG / 75e-6 / 450e9)
    assert c["straggler"] == {"rank": 1, "others_waited_s": pytest.approx(80 * US), "last_in": 1}
    assert c["wait_s"] == pytest.approx({"0": 80 * US, "1": 20 * US})


def test_collectives_matched_by_order_without_sequence_numbers(tmp_path):
    for r in (0, 1):
        d = json.loads((DATA / "ranks_skew" / f"rank{r}.json").read_text())
        for e in d["traceEvents"]:
            e.get("args", {}).pop("Seq", None)
        (tmp_path / f"rank{r}.json").write_text(json.dumps(d))
    c = collectives(read_traces(tmp_path))
    assert c["matched"] == 2 and c["method"].startswith("order")
    assert [x["last_rank"] for x in c["calls"]] == [1, 0] and c["link"] is None


def test_overlap_per_rank():
    r0, r1 = read_traces(DATA / "ranks_skew")
    o0, o1 = overlap(r0), overlap(r1)
    # rank 0: all-reduces 250-400 and 520-600 (230 us); its gemm 100-300 covers 250-300
    assert o0["communication_s"] == pytest.approx(230 * US) and o0["overlapped_s"] == pytest.approx(50 * US)
    assert o0["overlap_share"] == pytest.approx(50 / 230)
    assert o1["communication_s"] == pytest.approx(170 * US) and o1["overlap_share"] == 0.0


def test_trace_cli_json_and_text_carry_collectives_and_idle(tmp_path):
    from click.testing import CliRunner

    from profiler.cli import main

    res = CliRunner().invoke(main, ["trace", str(DATA / "ranks_skew"), "--out", str(tmp_path / "o"), "--json",
                                    "--no-report"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    c = out["collectives"]
    assert c["straggler"]["rank"] == 1 and c["by_kind"][0]["busbw"] == pytest.approx(MSG / 75e-6)
    assert [o["overlap_share"] for o in c["overlap"]] == pytest.approx([50 / 230, 0.0])
    res = CliRunner().invoke(main, ["trace", str(DATA / "idle_causes.json"), "--out", str(tmp_path / "i")])
    assert res.exit_code == 0, res.output
    assert "mostly host-bound (56%" in res.output and "the CPU was in vllm::prepare_inputs" in res.output
    html = (tmp_path / "i" / "report.html").read_text()
    assert "mostly host-bound" in html and "Largest idle gaps" in html


def _settings(idle_s, window_s, by_cause, dominant, host_ops=()):
    idle = sum(by_cause.values())
    return {"gpu_time": {"kind": "gpu", "idle_s": idle_s, "window_s": window_s, "busy_s": window_s - idle_s,
                         "kernel_sum_s": window_s - idle_s},
            "idle": {"by_cause_s": by_cause, "dominant": dominant, "dominant_share": by_cause[dominant] / idle,
                     "host_ops": list(host_ops)},
            "phases": {"decode": {}}}


def test_diagnose_says_host_bound_only_when_the_split_says_so():
    s = _settings(0.61, 1.0, {"host-bound": 0.5, "synchronisation": 0.1, "other": 0.01}, "host-bound",
                  [{"op": "no op (Python or framework code between ops)", "time_s": 0.5}])
    f = trace_idle_finding(s)
    assert f.claim == ("Decode is host-bound: the GPU is idle 61% of the traced window, waiting on launches from "
                       "Python.") and "CUDA graphs" in f.action
    s = _settings(0.61, 1.0, {"host-bound": 0.1, "synchronisation": 0.5, "other": 0.01}, "synchronisation")
    f = trace_idle_finding(s)
    assert "host-bound" not in f.claim and "synchronisations" in f.claim and ".item()" in f.action
    s = _settings(0.61, 1.0, {"host-bound": 0.2, "synchronisation": 0.2, "other": 0.21}, "other")
    assert "no single cause" in trace_idle_finding(s).claim
    assert trace_idle_finding(_settings(0.1, 1.0, {"host-bound": 0.1, "synchronisation": 0, "other": 0},
                                        "host-bound")) is None


@pytest.mark.parametrize("name", ["gpu_new.json", "gpu_new.json.gz", "ranks_skew/rank0.json", "idle_causes.json"])
def test_streamed_read_equals_the_whole_document_read(monkeypatch, name):
    from roofline.traces import stream as trace_stream
    from roofline.traces.events import _read

    monkeypatch.setattr(trace_stream, "CHUNK", 7)       # every event crosses chunk boundaries
    a, b = _read(DATA / name, stream=False), _read(DATA / name, stream=True)
    assert (b.rank, b.world_size, b.devices, b.record_shapes) == (a.rank, a.world_size, a.devices, a.record_shapes)
    assert [(g.name, g.ts, g.end, g.op.name if g.op else None) for g in b.gpu] == \
        [(g.name, g.ts, g.end, g.op.name if g.op else None) for g in a.gpu]
    assert [(o.name, o.ts, o.args) for o in b.ops] == [(o.name, o.ts, o.args) for o in a.ops]


def test_streamed_read_of_a_cut_off_trace_is_one_line(tmp_path):
    from roofline.errors import RooflineError
    from roofline.traces.events import _read

    p = tmp_path / "cut.json"
    p.write_bytes((DATA / "gpu_new.json").read_bytes()[:3000])
    with pytest.raises(RooflineError, match=r"cut\.json is not valid JSON .*cut off") as e:
        _read(p, stream=True)
    assert "\n" not in str(e.value)


def test_kernel_sums_use_the_file_durations_not_differences_of_absolute_timestamps(tmp_path):
    """Kineto's timestamps are ~5e12 us since the epoch, where one float step is ~0.001 us: (ts + dur) - ts is not
    dur, and 100,000 kernels drifted 0.2 us from the sum TraceLens and HTA report (the file's durs)."""
    from fractions import Fraction

    t0, durs = 5_312_345_678_901.234, [0.713 + (i % 7) * 0.101 for i in range(20_000)]
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t0 + 3.0 * i, "dur": d,
           "args": {"stream": 7, "correlation": i}} for i, d in enumerate(durs)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    g = gpu_time(read_trace(p))
    exact = float(sum(Fraction(d) for d in durs)) * US
    assert g["kernel_sum_s"] == pytest.approx(exact, rel=1e-12, abs=0)
    drift = sum((t0 + 3.0 * i + d) - (t0 + 3.0 * i) for i, d in enumerate(durs)) * US
    assert abs(drift - exact) > 1e-6 * exact      # the old way is off by more than 1 ppm here: the test can fail
