"""The point key is defined once (``roofline.records.KEY_FIELDS``) and every place that spells it agrees: the
point's ``key``, the step's ``StepKey``, what ``roofline compare`` matches by, and the header settings a profile
records (``profiler.run_spec.KEY_SETTINGS``), so that a field added to the key (as ``ep`` was) is one edit."""

import dataclasses

from profiler.commands.profile import profile
from profiler.run_spec import KEY_SETTINGS, RunSpec, spec_from_options
from roofline.analysis import StepKey
from roofline.cost import Cost
from roofline.records import KEY_FIELDS, PARALLEL_FIELDS, STEP_FIELDS, WorkloadPoint
from roofline.verdicts.comparison import POINT_FIELDS
from roofline.verdicts.comparison import STEP_FIELDS as COMPARE_STEP_FIELDS

ARGS = ["--model", "tiny-moe", "--phases", "prefill,decode", "--batches", "1,2", "--contexts", "8", "--backends",
        "torch", "--dtype", "fp32", "--device", "cpu", "--budget-ms", "2", "--threads", "1", "--weight-dtype",
        "fp32,int8", "--kv-dtype", "fp32,int8", "--tp", "2", "--ep", "2"]


def distinct_point(**changed) -> WorkloadPoint:
    base = dict(model="m", op="q_proj", phase="decode", batch=2, new_tokens=1, context=64, cost=Cost(1.0, 2.0),
                dtype="bf16", backend="torch", cached=0, weight_dtype="bf16", kv_dtype="bf16", tp=1, ep=1)
    return WorkloadPoint(**{**base, **changed})


def other_value(v):
    return v + 1 if isinstance(v, int) else v + "x"


def test_every_key_field_is_a_point_field_and_separates_points():
    names = {f.name for f in dataclasses.fields(WorkloadPoint)}
    assert set(KEY_FIELDS) <= names and len(set(KEY_FIELDS)) == len(KEY_FIELDS)
    p = distinct_point()
    assert p.key == tuple(getattr(p, f) for f in KEY_FIELDS)
    for f in KEY_FIELDS:                      # each field of the key tells two points apart
        assert distinct_point(**{f: other_value(getattr(p, f))}).key != p.key, f
    # what is not in the key does not: the cost, the compute dtype, the count
    assert distinct_point(cost=Cost(3.0, 4.0), compute_dtype="fp32", count=2).key == p.key


def test_step_key_is_the_key_without_the_op():
    assert tuple(f.name for f in dataclasses.fields(StepKey)) == STEP_FIELDS
    assert set(STEP_FIELDS) <= set(KEY_FIELDS) and set(PARALLEL_FIELDS) <= set(STEP_FIELDS)
    assert set(KEY_FIELDS) - set(STEP_FIELDS) == {"model", "op", "new_tokens"}
    p = distinct_point(tp=2, ep=2)
    k = StepKey.of(p)
    assert all(getattr(k, f) == getattr(p, f) for f in STEP_FIELDS)
    assert StepKey.of(distinct_point(op="o_proj", tp=2, ep=2)) == k                 # one step: every op of the point
    for f in STEP_FIELDS:
        assert StepKey.of(distinct_point(**{f: other_value(getattr(p, f))})) != StepKey.of(distinct_point()), f


def test_compare_matches_by_the_key():
    assert set(POINT_FIELDS) == set(KEY_FIELDS) - {"model", "new_tokens"}
    assert COMPARE_STEP_FIELDS == STEP_FIELDS


def test_the_header_records_every_key_field(tmp_path):
    assert set(KEY_SETTINGS) == set(KEY_FIELDS)
    params = profile.make_context("profile", [*ARGS, "--out", str(tmp_path / "o")]).params
    spec = spec_from_options(params, "new")
    settings = spec.to_header(threads=1)
    for field_name, setting in KEY_SETTINGS.items():
        if setting is not None:
            assert setting in settings, (field_name, setting)
    assert {k: settings[k] for k in PARALLEL_FIELDS} == {"tp": 2, "ep": 2}
    assert all(getattr(spec, k) == 2 for k in PARALLEL_FIELDS) and isinstance(spec, RunSpec)
    assert all(f"--{k}" in spec.command() for k in PARALLEL_FIELDS)
    one = spec_from_options(profile.make_context("profile", [*ARGS[:-4], "--out", str(tmp_path / "p")]).params, "new")
    assert not set(PARALLEL_FIELDS) & set(one.to_header(threads=1))   # one rank: absent, read back as 1
