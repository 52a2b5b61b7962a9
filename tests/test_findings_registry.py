"""The findings registry: a toy rule registered from this file shows up in diagnose's output, in registry order,
without touching a package file."""

from pathlib import Path

import pytest

from roofline.cost import Cost
from roofline.devices import Device
from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
from roofline.models import PRESETS
from roofline.verdicts import findings as R
from roofline.verdicts.diagnosis import diagnose
from roofline.writer import ResultWriter

DEV = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12)
MEM_LINEAR = dict(flops=2e6, nbytes=2e6, t=2.5e-6)   # intensity 1, 80% of its 2 us roof: memory-bound
KV_ATTN = dict(flops=1e6, nbytes=4e6, t=5e-6)


def meas(op, phase, t, flops, nbytes):
    p = WorkloadPoint(model="tiny", op=op, phase=phase, batch=1, new_tokens=1, context=512, cost=Cost(flops, nbytes),
                      compute_dtype="bf16")
    return Measurement(point=p, times_s=(t, t, t), device="toy")


def decode_file(tmp_path: Path):
    path = tmp_path / "registry_decode.jsonl"
    with ResultWriter(path, RunHeader(device=DEV, model=PRESETS["tiny"].to_dict(), kind="profile")) as w:
        for m in (meas("q_proj", "decode", **MEM_LINEAR), meas("down_proj", "decode", **MEM_LINEAR),
                  meas("attention", "decode", **KV_ATTN)):
            w.write(m)
    return read_results(path)


def toy_steps(phase, backend, ss, dev, src=""):
    """A toy phase rule: how many reliable steps the phase has, on which device."""
    return R.Finding("toy-steps", f"{phase.capitalize()} has {len(ss)} step(s) on {dev.name}.",
                     "counted by a rule registered from a test file", "nothing", src, {"steps": len(ss)})


def toy_run(rf, a, src=""):
    return R.Finding("toy-run", f"{len(a.results)} results.", f"kind {rf.header.kind}", "", src)


@pytest.fixture
def toys():
    added = [R.register("phase", "toy-steps", toy_steps, order=35),   # between communication- and weight-bound
             R.register("run", "toy-run", toy_run, order=5)]          # before the trace rules
    yield added
    for r in added:
        R.unregister(r)


def test_a_toy_finding_shows_up_in_registry_order(tmp_path, toys):
    rf = decode_file(tmp_path)
    found = diagnose([rf])
    assert [f.rule for f in found] == ["phase-bound", "toy-steps", "decode-weight-bound", "toy-run"]
    toy = found[1]
    src = str(rf.path)
    assert toy == R.Finding("toy-steps", "Decode has 1 step(s) on toy.", "counted by a rule registered from a test "
                            "file", "nothing", src, {"steps": 1})
    assert toy.to_dict() == {"rule": "toy-steps", "claim": "Decode has 1 step(s) on toy.",
                             "evidence": "counted by a rule registered from a test file", "action": "nothing",
                             "source": src, "data": {"steps": 1}}
    assert toy.text() == ("- Decode has 1 step(s) on toy.\n    evidence: counted by a rule registered from a test "
                          "file\n    try: nothing")
    assert found[3] == R.Finding("toy-run", "3 results.", "kind profile", "", src)


def test_order_is_by_order_then_name_and_a_rule_leaves_cleanly(tmp_path, toys):
    names = [r.name for r in R.rules("phase")]
    assert names == ["phase-bound", "cache-resident", "communication-bound", "toy-steps", "decode-weight-bound",
                     "prefill-compute-bound", "overhead-bound"]
    tie = R.register("phase", "a-toy", toy_steps, order=35)      # same order: by name, before toy-steps
    try:
        assert [r.name for r in R.rules("phase")][3:5] == ["a-toy", "toy-steps"]
    finally:
        R.unregister(tie)
    for r in toys:
        R.unregister(r)
    assert [f.rule for f in diagnose([decode_file(tmp_path)])] == ["phase-bound", "decode-weight-bound"]


def test_the_decorator_registers_and_an_unknown_scope_is_refused():
    @R.finding("change", "toy-change", order=99)
    def toy_change(c, src=""):
        return None

    try:
        assert R.rules("change")[-1].fn is toy_change
    finally:
        R.unregister(R.rules("change")[-1])
    assert "toy-change" not in [r.name for r in R.rules("change")]
    with pytest.raises(ValueError, match="unknown findings scope 'phases'"):
        R.register("phases", "x", toy_steps, order=1)
