"""``roofline explain --spec K --acceptance A --from RESULTS`` (issue 34): the speculation curve from a sweep's own
measured decode and verify steps (``roofline.spec_measured``), beside the roofline's. A hand-written result file
whose times make every number workable by hand, and a tiny CPU sweep (torch backend) through the real runners."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline.analysis import analyze, expected_ops
from roofline.cost import Cost
from roofline.devices import cpu_device
from roofline.models import load_model
from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
from roofline.writer import ResultWriter

TINY = load_model("tiny")
DEVICE = cpu_device("test cpu", {"fp32": 1e11}, 1e10)      # ridge 10 FLOP/byte
CTX = 8
# a step's time, split evenly over the model's ops (each counted once): decode and the verify step of k = 3
DECODE_US = {1: 100, 2: 100, 4: 120, 8: 160}
VERIFY_US = {1: 120, 2: 150, 4: 300, 8: 600}


def _write(path, *, verify=VERIFY_US, k=3, model=TINY):
    names = expected_ops(TINY)
    head = RunHeader(device=DEVICE, model=model.to_dict(), dtype="fp32", settings={})
    with ResultWriter(path, head) as w:
        for phases in (("decode", DECODE_US), ("verify", verify)):
            phase, times = phases
            for b, us in times.items():
                for op in names:
                    v = phase == "verify"
                    # verify ops: intensity 2.5 x batch (at the ridge from batch 4); decode ops: 1
                    cost = Cost(5000 * b, 2000) if v else Cost(1000, 1000)
                    pt = WorkloadPoint(model=model.name, op=op, phase=phase, batch=b, new_tokens=k + 1 if v else 1,
                                       context=CTX + k + 1 if v else CTX, cached=CTX if v else 0, cost=cost,
                                       dtype="fp32", weight_dtype="fp32", kv_dtype="fp32", count=1)
                    w.write(Measurement(pt, [us * 1e-6 / len(names)] * 3, device="test cpu"))
    return path


def _explain(*args):
    r = CliRunner().invoke(main, ["explain", "--spec", "3", "--acceptance", "0.5", *args])
    return r


def test_hand_worked_numbers(tmp_path):
    f = _write(tmp_path / "r.jsonl")
    r = _explain("--from", str(f), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    m = d["measured"]
    assert m["context"] == CTX and "nearest to the 1,024 asked" in m["context_said"]
    (c,) = m["curves"]
    assert c["backend"] == "torch" and c["dtype"] == "fp32"
    rows = {r["batch"]: r for r in c["rows"]}
    assert sorted(rows) == [1, 2, 4, 8]
    # E = 1 + 0.5 + 0.25 + 0.125 = 1.875; speedup = E x decode / verify
    want = {1: 1.875 * 100 / 120, 2: 1.875 * 100 / 150, 4: 1.875 * 120 / 300, 8: 1.875 * 160 / 600}
    assert want == pytest.approx({1: 1.5625, 2: 1.25, 4: 0.75, 8: 0.5})
    for b, s in want.items():
        assert rows[b]["speedup"] == pytest.approx(s, rel=1e-12)
        assert rows[b]["decode_s"] == pytest.approx(DECODE_US[b] * 1e-6, rel=1e-12)
        assert rows[b]["verify_s"] == pytest.approx(VERIFY_US[b] * 1e-6, rel=1e-12)
        assert rows[b]["draft_s"] == 0 and rows[b]["tokens_per_step"] == 1.875
        assert rows[b]["verify_intensity"] == pytest.approx(2.5 * b) and rows[b]["ridge"] == pytest.approx(10)
    assert [rows[b]["verify_bound"] for b in (1, 2, 4, 8)] == ["memory", "memory", "compute", "compute"]
    assert c["compute_bound_batch"] == 4
    # under 1 first at batch 4 (0.75) after 1.25 at batch 2: 2 + (1.25 - 1) x (4 - 2) / (1.25 - 0.75) = 3
    assert c["stops_paying"] == {"batch": pytest.approx(3.0), "between": [2, 4], "never_pays": False}
    # the roofline curve beside it: the sweep's model, context, batches and measured ceilings
    assert d["model"] == "tiny" and d["context"] == CTX and [r["batch"] for r in d["rows"]] == [1, 2, 4, 8]
    assert d["device"] == "test cpu" and d["ridge"] == pytest.approx(10)

    text = _explain("--from", str(f)).output
    assert "Measured (" in text and "stops paying at batch 3.0 (interpolated linearly between the measured " \
        "batches 2 and 4)" in text
    assert "compute-bound (its recorded FLOPs / bytes at the measured ridge) from batch 4" in text
    assert "1.56x" in text and "0.50x" in text


def test_never_pays_and_always_pays(tmp_path):
    slow = _write(tmp_path / "slow.jsonl", verify={b: 1000 for b in DECODE_US})
    c = json.loads(_explain("--from", str(slow), "--json").output)["measured"]["curves"][0]
    assert c["stops_paying"] == {"batch": None, "between": None, "never_pays": True}
    assert "never pays: the speedup is under 1 already at batch 1" in _explain("--from", str(slow)).output
    fast = _write(tmp_path / "fast.jsonl", verify={b: 10 for b in DECODE_US})
    c = json.loads(_explain("--from", str(fast), "--json").output)["measured"]["curves"][0]
    assert c["stops_paying"] == {"batch": None, "between": None, "never_pays": False}
    assert "pays at every measured batch (up to 8)" in _explain("--from", str(fast)).output


def test_a_draft_model_adds_the_roofline_draft_time(tmp_path):
    f = _write(tmp_path / "r.jsonl")
    d = json.loads(_explain("--from", str(f), "--draft", "tiny", "--json").output)
    m = d["measured"]
    assert m["draft_from"] == "roofline"
    for mr, rr in zip(m["curves"][0]["rows"], d["rows"]):
        assert mr["batch"] == rr["batch"] and mr["draft_s"] == rr["draft_s"] > 0
        assert mr["speedup"] == pytest.approx(1.875 * mr["decode_s"] / (mr["verify_s"] + rr["draft_s"]))
    assert "the draft's time is the roofline's (not measured)" in _explain("--from", str(f), "--draft", "tiny").output


@pytest.mark.parametrize("args, says", [
    (("--spec", "5"), "has verify steps of k = 3 only, not of k = 5: measure them with `roofline profile --model "
                      "tiny --spec 5"),
    (("--model", "llama-3-8b"), "was measured on tiny, not llama-3-8b: give --model tiny, or measure llama-3-8b's "
                                "verify steps with `roofline profile --model llama-3-8b --spec 3"),
])
def test_refused_in_one_line(tmp_path, args, says):
    f = _write(tmp_path / "r.jsonl")
    r = CliRunner().invoke(main, ["explain", "--spec", "3", "--acceptance", "0.5", "--from", str(f), *args])
    assert r.exit_code != 0 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_sweep_without_verify_steps_is_refused(tmp_path):
    f = _write(tmp_path / "r.jsonl", verify={})
    r = _explain("--from", str(f))
    assert r.exit_code != 0 and "has no verify steps (a sweep without --spec)" in r.output
    assert "roofline profile --model tiny --spec 3" in r.output


def test_from_without_spec_is_refused(tmp_path):
    f = _write(tmp_path / "r.jsonl")
    r = CliRunner().invoke(main, ["explain", "--from", str(f)])
    assert r.exit_code != 0 and "--from reads a sweep's verify steps" in r.output


def test_the_context_asked_is_taken_when_measured(tmp_path):
    f = _write(tmp_path / "r.jsonl")
    m = json.loads(_explain("--from", str(f), "--context", str(CTX), "--json").output)["measured"]
    assert m["context"] == CTX and m["context_said"] == f"context {CTX} (as asked)"


def test_a_tiny_cpu_sweep(tmp_path):
    """A real sweep (the torch backend, the tiny model): the measured curve is its decode and verify steps'."""
    from profiler import sweep as S

    p = S.SweepPlan(model=TINY, phases=("decode", "verify"), batches=(1, 2), contexts=(CTX,), backends=("torch",),
                    dtype="fp32", budget_s=0.002, warmup_s=0.0, spec=(3,))
    path = tmp_path / "r.jsonl"
    head = RunHeader(device=DEVICE, model=TINY.to_dict(), dtype="fp32", settings=p.settings())
    with ResultWriter(path, head) as w:
        S.run_sweep(p, w, device_name="test cpu")
    steps = analyze(read_results(path)).steps
    dec = {s.batch: s for s in steps if s.phase == "decode"}
    ver = {s.batch: s for s in steps if s.phase == "verify"}
    r = _explain("--from", str(path), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    (c,) = d["measured"]["curves"]
    assert [x["batch"] for x in c["rows"]] == [1, 2] == [x["batch"] for x in d["rows"]]
    for x in c["rows"]:
        b = x["batch"]
        assert x["decode_s"] == dec[b].time_s and x["verify_s"] == ver[b].time_s
        assert x["speedup"] == pytest.approx(1.875 * dec[b].time_s / ver[b].time_s)
        assert x["verify_intensity"] == pytest.approx(ver[b].intensity) and x["missing"] == []
        assert x["verify_bound"] == ("compute" if ver[b].intensity >= 10 else "memory")


# ---------------------------------------------------------------- diagnose: speculation-measured (a latency file's)

def _config(tpot_ms, base_tpot_ms=10.0, speculation=None):
    from types import SimpleNamespace

    from roofline.latency import LatencySummary
    from roofline.verdicts.latency_rules import ConfigRun

    sp = {"k": 3, "draft": "tiny", "verify": "greedy", "rounds": 40, "drafted": 120, "accepted": 30,
          "acceptance": 0.25, "tokens_per_step": 1.75} if speculation is None else speculation
    plain = LatencySummary(config="chunk=64", tpot={"p50": base_tpot_ms * 1e-3})
    spec = LatencySummary(config="chunk=64,spec=3:tiny", tpot={"p50": tpot_ms * 1e-3}, speculation=sp)
    return ConfigRun(SimpleNamespace(summary=spec, config=spec.config), "l.jsonl", {}, (plain, spec))


def _measured(x):
    from roofline.verdicts import diagnosis  # noqa: F401 (the rules register)
    from roofline.verdicts.findings import rules

    (rule,) = [r for r in rules("latency") if r.name == "speculation-measured"]
    return rule.fn(x)


def test_measured_speculation_that_pays():
    (f,) = _measured(_config(8.0))
    # speedup = 10 / 8 = 1.25; a round costs 1.75 x 8 / 10 = 1.4 decode steps; independent E(0.25, 3) = 1.328125
    assert f.rule == "speculation-measured" and f.claim.startswith("[chunk=64,spec=3:tiny] Speculation measured: "
                                                                   "acceptance 0.250, tokens/step 1.75 (K = 3)")
    assert "1.25x the plain run's TPOT p50" in f.claim and f.claim.endswith("it pays.")
    assert f.data["speedup"] == pytest.approx(1.25) and f.data["round_decode_steps"] == pytest.approx(1.4)
    assert f.data["expected_tokens_independent"] == pytest.approx(1.328125) and f.data["plain"] == "chunk=64"
    assert "pays while the tokens per step exceed 1.40; measured 1.75" in f.evidence


def test_measured_speculation_that_does_not_pay():
    (f,) = _measured(_config(12.5, speculation={"k": 3, "rounds": 10, "acceptance": 0.5, "tokens_per_step": 1.75,
                                                    "per_position": [0.75, 0.5, 0.25]}))
    # speedup = 10 / 12.5 = 0.8; a round costs 1.75 x 12.5 / 10 = 2.1875; E(0.5, 3) = 1.875 > 1.75 + 0.05
    assert "0.80x" in f.claim and f.claim.endswith("does not pay.")
    assert f.data["round_decode_steps"] == pytest.approx(2.1875)
    assert "acceptance falling with the position: per position 0.75 / 0.50 / 0.25" in f.evidence and "roofline explain --spec K" in f.action


def test_measured_speculation_from_a_server_and_none():
    (f,) = _measured(_config(8.0, speculation={"source": "vllm", "acceptance": 0.6, "tokens_per_step": 2.2,
                                               "drafted": 100, "accepted": 60}))
    assert f.claim == "[chunk=64,spec=3:tiny] Speculation measured: acceptance 0.600, tokens/step 2.20 (K unknown)."
    assert "no run of the same requests without speculation" in f.evidence
    assert _measured(_config(8.0, speculation={})) == []
