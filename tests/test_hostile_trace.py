"""``roofline trace`` on truncated, junk and hostile traces (issue 23): a bad event is skipped, counted and said;
a bad file is one line naming the field; a result file is always readable."""

import json
import math

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline.errors import RooflineError
from roofline.records import read_results
from roofline.traces.events import read_trace, work_items


def mm(ts, dur=10, dims=([8, 64], [64, 64]), types=("float", "float"), **over):
    e = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": dur,
         "args": {"External id": ts, "Input Dims": [list(d) for d in dims] if isinstance(dims, tuple) else dims,
                  "Input type": list(types), "Concrete Inputs": ["", ""]}}
    for k, v in over.items():
        if k in ("pid", "tid"):
            e[k] = v
        else:
            e["args"][k] = v
    return e


def write(tmp_path, events, name="t.json", **head):
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "record_shapes": 1, "traceEvents": events, **head}))
    return p


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_nan_infinite_and_negative_durations_are_skipped_counted_and_said(tmp_path):
    events = [mm(0), mm(100, dur=float("nan")), mm(200, dur=float("inf")), mm(300, dur=-5), mm(400)]
    t = read_trace(write(tmp_path, events))
    assert [op.ts for op in t.ops] == [0, 400]
    assert sum(s for _, s, _ in work_items(t)) == pytest.approx(20e-6)            # 10 + 10 us, nothing NaN
    assert t.notices == ["3 event(s) of t.json were skipped, their time not counted (a negative or non-finite dur: "
                         "3)."]
    r = cli("trace", tmp_path / "t.json", "--device", "h100", "--out", tmp_path / "out", "--no-report")
    assert r.exit_code == 0, r.output
    assert "3 event(s) of t.json were skipped" in r.output
    rf = read_results(tmp_path / "out" / "results.jsonl")                           # readable: no Infinity in it
    assert sorted(x for m in rf.measurements for x in m.times_s) == pytest.approx([10e-6, 10e-6])


@pytest.mark.parametrize("head, words", [
    ({"distributedInfo": {"rank": float("nan")}}, "distributedInfo.rank must be a whole number"),
    ({"distributedInfo": {"rank": 0, "world_size": "2"}}, "distributedInfo.world_size must be a whole number"),
    ({"deviceProperties": 5}, "deviceProperties must be a list of device objects"),
])
def test_a_bad_file_level_field_is_one_line_naming_it(tmp_path, head, words):
    write(tmp_path, [mm(0)], **head)
    r = cli("trace", tmp_path / "t.json", "--device", "h100", "--out", tmp_path / "out", "--no-report")
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and words in lines[0], r.output


def test_bad_event_fields_are_skipped_or_ignored_and_counted(tmp_path):
    events = [mm(0), mm(100, **{"External id": [1]}), mm(200, pid=[1]), mm(300, dims=5), mm(400, dims={"a": 1}),
              mm(500, dims=[[8, -64], [64, 64]])]
    t = read_trace(write(tmp_path, events))
    assert [op.ts for op in t.ops] == [0, 100, 300, 400, 500]                   # the list pid: skipped
    assert t.ops[1].ext is None and "Input Dims" not in t.ops[2].args and "Input Dims" not in t.ops[3].args
    assert t.notices == ["1 event(s) of t.json were skipped, their time not counted (a pid or tid that is not a "
                         "string or whole number: 1).",
                         "3 malformed field(s) of t.json (External id, correlation, stream not a string or whole "
                         "number; Input Dims, Input type or Concrete Inputs not a list) were ignored."]
    r = cli("trace", tmp_path / "t.json", "--device", "h100", "--out", tmp_path / "out", "--no-report", "--json")
    assert r.exit_code == 0, r.output
    rf = read_results(tmp_path / "out" / "results.jsonl")
    flops = sorted(x.point.cost.flops for m in rf.measurements for x in [m] * len(m.times_s))
    assert flops.count(2 * 8 * 64 * 64) == 2      # 2 * m * k * n = 65,536: the two mm with good dims are costed


def test_peak_and_bandwidth_flags_price_an_fp32_trace(tmp_path):
    write(tmp_path, [mm(0), mm(100)])
    r = cli("trace", tmp_path / "t.json", "--peak-tflops", "1", "--bandwidth-gbs", "10", "--out", tmp_path / "out",
            "--no-report")
    assert r.exit_code == 0, r.output
    dev = read_results(tmp_path / "out" / "results.jsonl").header.device
    assert dev.peak("fp32") == 1e12 and dev.bandwidth == 10e9


def test_the_trace_event_reader_never_raises_anything_but_its_own_error(tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)
    fields = {"ph": st.sampled_from(["X", "i", 5]) | values, "cat": st.sampled_from(["cpu_op", "kernel",
              "cuda_runtime", "user_annotation", "gpu_memcpy"]) | values, "ts": values | st.floats(0, 1e6),
              "dur": values | st.floats(0, 1e3), "pid": values, "tid": values, "name": values,
              "args": st.fixed_dictionaries({}, optional={k: values for k in (
                  "External id", "correlation", "stream", "Input Dims", "Input type", "Concrete Inputs")}) | values}
    event = st.fixed_dictionaries({}, optional=fields)
    tmp = tmp_path_factory.mktemp("hypo")

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(event, max_size=8), st.dictionaries(st.sampled_from(["distributedInfo", "deviceProperties",
                                                                         "record_shapes"]), values, max_size=2))
    def check(events, head):
        p = tmp / "h.json"
        p.write_text(json.dumps({"traceEvents": [mm(0), *events], **head}))
        try:
            t = read_trace(p)
        except RooflineError:
            return
        assert all(math.isfinite(s) and s >= 0 for _, s, _ in work_items(t))

    check()
