"""Tensor parallelism on torch.distributed, on this CPU: two gloo ranks on 127.0.0.1.

Run: pytest tests/test_tp_ranks.py   (spawns one extra process per test that needs ranks; ~15 s on 2 cores)
"""

import time

import pytest
from click.testing import CliRunner

from profiler.cli import main
from profiler.distributed import check_tp
from profiler.run import RunSpec, default_plan, run_profile
from profiler.run_spec import validate_tp
from roofline.analysis import analyze
from roofline.errors import RooflineError
from roofline.models import ModelConfig
from roofline.parallel import COLLECTIVE_OPS
from roofline.layer import op_names
from roofline.models import load_model

import tp_helpers

# untied, a vocabulary two ranks split unevenly (251 -> 252 padded), GQA 4:2
ODD = ModelConfig("odd", 64, 176, 2, 4, 2, 251, 64)
NAMES = len(op_names(load_model("tiny"))) + 1 + len(COLLECTIVE_OPS)        # every op, the layer, the collectives: per rank


def test_tp2_logits_equal_tp1_for_prefill_decode_and_chunked_prefill():
    from profiler.tp_check import CASES, tp_logits_check

    errs = tp_logits_check(2, ODD)
    assert set(errs) == set(CASES)
    for case, (err, scale) in errs.items():
        assert scale > 0.1 and err <= 1e-5 * scale, (case, err, scale)   # fp32: the all-reduce's rounding only


def _args(out, *extra):
    return ["profile", "--model", "tiny", "--phases", "decode", "--batches", "1", "--contexts", "8,16",
            "--backends", "torch", "--dtype", "fp32", "--device", "cpu", "--budget-ms", "2", "--tp", "2",
            "--out", str(out), "--no-report", "--quiet", *extra]


def test_a_killed_rank_ends_the_run_keeps_its_points_and_resume_continues(tmp_path, monkeypatch):
    from profiler.ceilings import device_name
    from roofline.devices import cpu_device

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))   # its kernel-check pass is its own

    plan, _ = default_plan(model="tiny", phases=("decode",), batches=(1,), contexts=(8, tp_helpers.DIE_AT_CONTEXT),
                           backends=("torch",), dtype="fp32", device="cpu", budget_ms=2)
    dev = cpu_device(device_name("cpu"), {"fp32": 1e11}, 2e10)     # given ceilings: nothing to measure first
    run = RunSpec(plan, out=tmp_path, mode="new", tp=2, report=False, check_kernels=False, flop_check=False,
                     device=dev, quick=True, model_arg="tiny")
    t0 = time.monotonic()
    with pytest.raises(RooflineError) as e:
        run_profile(run, make_runners=tp_helpers.dying_runners)
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rank 1 of 2 killed by signal SIGKILL"), msg
    assert f"{2 * NAMES} measurements are kept in {tmp_path / 'results.jsonl'}" in msg and "--tp 2" in msg
    assert msg.endswith("--resume"), msg
    from roofline.records import read_results

    rf = read_results(tmp_path / "results.jsonl")
    assert {m.point.context for m in rf.measurements} == {8} and len(rf.measurements) == 2 * NAMES
    assert {m.rank for m in rf.measurements} == {0, 1} and {m.point.tp for m in rf.measurements} == {2}
    coll = rf.header.ceilings["collective"]
    assert coll["world"] == 2 and coll["backend"] == "gloo" and rf.header.device.link.source == "measured"
    for r in coll["rows"]:      # each row's busbw is nccl-tests' definition of its own measured time
        factor = 2 * (2 - 1) / 2 if r["kind"] == "all_reduce" else (2 - 1) / 2
        assert r["busbw"] == pytest.approx(r["bytes"] / r["time_s"] * factor)

    # --resume through the command line: the point measured before is kept, the rest is measured now
    res = CliRunner().invoke(main, _args(tmp_path, "--resume"))
    assert res.exit_code == 0, res.output
    assert f"{2 * NAMES} measured, 0 skipped, {NAMES} resumed" in res.output
    assert "ranks slow/fast" in res.output and "tp > 1" in res.output
    rf = read_results(tmp_path / "results.jsonl")
    assert len(rf.measurements) == 4 * NAMES and not rf.notices
    steps = analyze(rf).steps
    assert [(s.context, s.tp) for s in steps] == [(8, 2), (16, 2)]
    for s in steps:
        assert [r for r, _ in s.rank_s] == [0, 1] and s.communication_s > 0 and s.wire_bytes > 0
        assert "per rank: rank 0" in s.sentence


def test_bad_tp_is_a_one_line_error_before_anything_starts(tmp_path):
    for extra, expect in ((["--tp", "0"], "--tp must be a whole number of tensor-parallel ranks, at least 1"),
                          (["--tp", "3", "--model", "llama-2-7b"], "--tp 3 cannot split llama-2-7b: its 32 attention "
                                                                    "heads do not divide into 3 ranks")):
        res = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "o"), "--device", "cpu", *extra])
        assert res.exit_code == 2 and res.output.count("\n") == 1 and expect in res.output, res.output
        assert not (tmp_path / "o" / "results.jsonl").exists()
    res = CliRunner().invoke(main, ["ceilings", "--collective", "--tp", "1", "--device", "cpu"])
    assert res.exit_code == 2 and "--tp 2 or more" in res.output


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    with pytest.raises(RooflineError, match=r"--tp 4 needs 4 GPUs on this machine \(one per rank\), but torch sees 2"):
        check_tp(4, "cuda", device_count=2)
    check_tp(2, "cuda", device_count=2)
    plan, _ = default_plan(model="tiny", device="cpu")
    with pytest.raises(RooflineError, match="torch sees 1"):
        validate_tp(RunSpec(plan.__class__(**{**plan.__dict__, "device": "cuda"}), tp=2), device_count=1)
    with pytest.raises(RooflineError, match="names one GPU"):
        check_tp(2, "cuda:1", device_count=8)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(RooflineError, match="torchrun started 4 processes"):
        check_tp(2, "cpu")


def test_a_rank_that_dies_while_starting_stops_the_run_at_once():
    """A spawned rank that fails before it joins (an import error, an out-of-memory start) is noticed in
    seconds, not after the whole collective timeout."""
    import time

    from profiler.distributed import RankLost, run_ranks

    t0 = time.monotonic()
    # threads=-1: the spawned rank's torch.set_num_threads(-1) fails before it reaches the store
    with pytest.raises(RankLost, match=r"rank 1 of 2 exited with code 1 while starting"):
        run_ranks(2, "cpu", _never, _never, threads=-1)
    assert time.monotonic() - t0 < 60


def _never(ctx):
    raise AssertionError("no rank may run its part without its peers")
