"""Issue 22: a trace that does not tell its phases (a plain forward, a training step) is 'forward (phase unknown)'
with no invented batch or context; a generation pattern still gives prefill and decode."""

from types import SimpleNamespace as NS

import pytest

from roofline.analysis import analyze
from roofline.cost import Cost
from roofline.devices import find_device
from roofline.records import Measurement, ResultFile, RunHeader, WorkloadPoint
from roofline.traces.phases import FORWARD, phase_text, plan_phases


def trace(ops=(), annotations=(), modules=()):
    return NS(ops=list(ops), annotations=list(annotations), modules=list(modules))


def gemms(rows):
    """One GEMM instance per row count, 10 us apart, on one thread."""
    return [NS(t=10.0 * k, thread=(1, 1), category="gemm", detail={"m": m}, graph=None) for k, m in enumerate(rows)]


def test_gemm_rows_of_one_count_are_a_forward_of_unknown_phase():
    plan = plan_phases(trace(), gemms([4096] * 7))           # a plain forward of 4,096 tokens
    assert set(plan.phase) == {FORWARD} and set(plan.shape) == {FORWARD}
    assert plan.shape[FORWARD] == {"batch": 0, "context": 0, "cached": 0, "tokens": 4096,
                                   "how": "phase unknown: batch and context are not inferred"}
    assert any("does not tell prefill from decode" in n for n in plan.notes)


def test_a_training_step_is_not_a_generation():
    # forward 512 rows, backward: grad-input 512, grad-weight 64, then up again: rows rise after the fewest
    plan = plan_phases(trace(), gemms([512, 512, 512, 64, 512, 64, 512]))
    assert set(plan.phase) == {FORWARD} and plan.steps == {FORWARD: 1}


def test_a_plain_forward_with_a_last_token_head_is_not_a_generation():
    plan = plan_phases(trace(), gemms([4096] * 6 + [1]))
    assert set(plan.phase) == {FORWARD}


def test_prefill_then_decode_rows_are_a_generation():
    # 8-row prompt GEMMs, then decode: 1-row GEMMs and GQA attention GEMMs of 4 rows
    plan = plan_phases(trace(), gemms([8, 8, 8, 8, 1, 1, 4, 1, 1]))
    assert plan.phase == ["prefill"] * 4 + ["decode"] * 5
    assert plan.shape["decode"]["batch"] == 1


def test_one_forward_call_alone_is_not_a_prefill():
    emb = NS(name="aten::embedding", ts=0.0, args={"Input Dims": [[32000, 64], [1, 4096]]})
    plan = plan_phases(trace(ops=[emb]), gemms([4096] * 3))
    assert set(plan.phase) == {FORWARD} and "no decode step" in plan.method[FORWARD]


def test_forward_calls_with_a_decode_after_the_prompt_are_a_generation():
    embs = [NS(name="aten::embedding", ts=t, args={"Input Dims": [[32000, 64], [1, s]]})
            for t, s in ((0.0, 16), (100.0, 1), (200.0, 1))]
    inst = [NS(t=t + 5, thread=(1, 1), category="gemm", detail={"m": m}, graph=None)
            for t, m in ((0.0, 16), (100.0, 1), (200.0, 1))]
    plan = plan_phases(trace(ops=embs), inst)
    assert plan.phase == ["prefill", "decode", "decode"] and plan.steps == {"prefill": 1, "decode": 2}


def test_the_words_and_the_step_say_phase_unknown():
    ph = {"steps": 2, "batch": 0, "context": 0, "tokens": 4096, "how": "phase unknown: batch and context are not "
                                                                      "inferred"}
    assert phase_text(FORWARD, ph).startswith("forward (phase unknown): 2 step(s), 4,096 tokens each")
    p = WorkloadPoint(model="trace", op="aten::mm [4096,64]x[64,64] fp32", phase=FORWARD, batch=0, new_tokens=4096,
                      context=0, cost=Cost(2 * 4096 * 64 * 64, 4 * (4096 * 64 * 2 + 64 * 64)), dtype="fp32", weight_dtype="fp32", kv_dtype="fp32",
                      backend="trace", count=1)
    back = WorkloadPoint.from_dict(p.to_dict())              # batch 0 is valid for a forward only
    assert back == p
    rf = ResultFile("x", RunHeader(device=find_device("h100"), kind="trace", dtype="fp32"),
                    [Measurement(p, [1e-4], timer="trace")])
    (step,) = analyze(rf).steps
    assert step.title == "A forward (phase unknown) of 4,096 tokens" and step.where == "forward"
    assert "Decode" not in step.sentence and "context" not in step.sentence
    assert step.tokens_per_s != step.tokens_per_s                # NaN: sequences unknown


def test_a_prefill_point_still_needs_a_batch():
    from roofline.errors import RooflineError

    d = WorkloadPoint(model="m", op="x", phase="prefill", batch=1, new_tokens=8, context=8, cost=Cost(1, 1)).to_dict()
    d["batch"] = 0
    with pytest.raises(RooflineError):
        WorkloadPoint.from_dict(d)
