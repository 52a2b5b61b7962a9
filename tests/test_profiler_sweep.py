"""profiler.sweep with fake runners (and once with kernels.runners): file, resume, OOM, Ctrl-C."""

import json
from types import SimpleNamespace

import pytest
import torch

from profiler import sweep as S
from roofline.devices import cpu_device
from roofline.errors import RooflineError
from roofline.models import load_model
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

TINY = load_model("tiny")
OPS = ("q_proj", "attention", "layer")


def fake_make_runners(fail=None, build_error=None, log=None):
    """Runners shaped like kernels.runners.OpRunner: a tiny matmul each, formula costs from roofline."""
    def make(cfg, phase, batch, context, *, dtype="fp32", backend="torch", device="cpu", seed=0, ops=None):
        if log is not None:
            log.append((phase, batch, context, ops))
        if build_error is not None:
            raise build_error
        a = torch.randn(16, 16)
        plan = S.SweepPlan(model=cfg, dtype=dtype)
        out = []
        for name in ops or OPS:
            cost, cdt = S.formula_cost(plan, name, phase, batch, context)

            def fn(name=name):
                if fail is not None and name == fail[0]:
                    raise fail[1]
                return a @ a
            out.append(SimpleNamespace(name=name, fn=fn, cost=cost, compute_dtype=cdt, config={"fake": True}))
        return out
    return make


def plan(**kw):
    d = dict(model=TINY, phases=("prefill", "decode"), batches=(1, 2), contexts=(8,), backends=("torch",),
             dtype="fp32", budget_s=0.002, warmup_s=0.0, ops=OPS)
    d.update(kw)
    return S.SweepPlan(**d)


def header(p, dtype="fp32"):
    return RunHeader(device=cpu_device("test cpu", {"fp32": 1e11}, 1e10), model=TINY.to_dict(), dtype=dtype,
                     settings=p.settings())


def test_sweep_writes_a_valid_file(tmp_path):
    p, path = plan(), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w:
        stats = S.run_sweep(p, w, make_runners=fake_make_runners(), device_name="test cpu")
    rf = read_results(path)
    assert stats.measured == len(rf.measurements) == 2 * 2 * len(OPS)   # phases x batches x ops
    m = rf.measurements[0]
    assert m.ok and m.timer == "cpu-clock" and m.config["fake"] and m.config["threads"] >= 1
    assert m.point.model == "tiny" and m.point.dtype == m.point.weight_dtype == m.point.kv_dtype == "fp32"
    assert m.clocks["after"]["ticks_total"] >= m.clocks["before"]["ticks_total"] > 0
    dec = [x for x in rf.measurements if x.point.phase == "decode"][0]
    assert dec.point.new_tokens == 1 and dec.point.context == 8
    # every timed sample counts, a busy point's first try too
    assert stats.kernel_time_s >= sum(sum(x.times_s) for x in rf.measurements) * (1 - 1e-9)


def test_resume_skips_points_already_measured(tmp_path):
    p, path = plan(), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w:
        S.run_sweep(p, w, make_runners=fake_make_runners())
    log = []
    bigger = plan(batches=(1, 2, 4))
    with ResultWriter(path, header(bigger), resume=True) as w:
        stats = S.run_sweep(bigger, w, make_runners=fake_make_runners(log=log))
    assert stats.resumed == 12 and stats.measured == 6                # only batch 4 is new
    assert {(ph, b) for ph, b, _, _ in log} == {("prefill", 4), ("decode", 4)}   # done points are not even built
    assert len(read_results(path).measurements) == 18


def test_resume_refuses_another_dtype(tmp_path):
    p, path = plan(), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)):
        pass
    with pytest.raises(RooflineError, match="it holds dtype 'fp32', this run is 'bf16'"):
        ResultWriter(path, header(p, dtype="bf16"), resume=True)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("CUDA error: out of memory")])
def test_out_of_memory_is_recorded_as_skipped(tmp_path, error):
    p, path = plan(phases=("decode",), batches=(1,)), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w:
        stats = S.run_sweep(p, w, make_runners=fake_make_runners(fail=("attention", error)))
    rf = read_results(path)
    by_op = {m.point.op: m for m in rf.measurements}
    assert stats.skipped == 1 and stats.measured == 2
    assert by_op["attention"].status == "skipped" and "out of memory" in by_op["attention"].reason
    assert by_op["layer"].ok                                          # the sweep went on


def test_out_of_memory_while_building_skips_the_point(tmp_path):
    p, path = plan(phases=("prefill",), batches=(1,)), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w:
        stats = S.run_sweep(p, w, make_runners=fake_make_runners(build_error=torch.OutOfMemoryError("oom")))
    ms = read_results(path).measurements
    assert stats.skipped == 3 and all(m.status == "skipped" for m in ms)
    assert ms[0].point.cost.flops > 0                                  # formula cost kept for the report


def test_other_errors_are_not_swallowed(tmp_path):
    p = plan(phases=("decode",), batches=(1,))
    with ResultWriter(tmp_path / "r.jsonl", header(p)) as w, pytest.raises(ValueError, match="shape"):
        S.run_sweep(p, w, make_runners=fake_make_runners(fail=("q_proj", ValueError("bad shape"))))


def test_ctrl_c_keeps_finished_lines(tmp_path):
    p, path = plan(), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w, pytest.raises(KeyboardInterrupt):
        S.run_sweep(p, w, make_runners=fake_make_runners(fail=("layer", KeyboardInterrupt())))
    lines = path.read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["header", "measurement", "measurement"]


def test_plan_validation():
    with pytest.raises(RooflineError, match="maximum context of 512"):
        plan(contexts=(512,), phases=("decode",)).validate()          # 512 cached + 1 new > 512
    plan(contexts=(512,), phases=("prefill",)).validate()
    with pytest.raises(RooflineError, match="Triton interpreter"):
        plan(model=load_model("small"), backends=("triton",)).validate()
    plan(backends=("triton",)).validate()                              # tiny shapes are allowed


def test_with_the_real_runners(tmp_path):
    p = plan(phases=("decode",), batches=(1,), ops=None)
    path = tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w:
        stats = S.run_sweep(p, w)
    rf = read_results(path)
    assert stats.measured == len(S.expected_ops(load_model("tiny")))
    assert [m.point.op for m in rf.measurements] == list(S.expected_ops(load_model("tiny")))
    from roofline import workload as W
    ph = W.decode(TINY, 1, 8, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
    q = next(m for m in rf.measurements if m.point.op == "q_proj")
    assert q.point.cost == ph.op("q_proj").cost and q.point.compute_dtype == "fp32"


def test_a_busy_point_is_timed_once_more(tmp_path, monkeypatch):
    samples = iter([{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}])
    probe = SimpleNamespace(kind="cpu", sample=lambda: next(samples), static=lambda: {})
    monkeypatch.setattr(S.probes, "point_flags", lambda a, b, st: ("host-busy",) if a["n"] == 0 else ())
    p, path = plan(phases=("decode",), batches=(1,), ops=("q_proj",)), tmp_path / "r.jsonl"
    with ResultWriter(path, header(p)) as w:
        S.run_sweep(p, w, make_runners=fake_make_runners(), probe=probe)
    (m,) = read_results(path).measurements
    assert m.flags == () and m.config["tries"] == 2 and m.clocks["before"] == {"n": 2}


@pytest.mark.gpu
def test_gpu_sweep_with_the_real_triton_runners(tmp_path):
    from profiler.probes import open_probe

    p = plan(phases=("prefill", "decode"), batches=(2,), contexts=(64,), backends=("triton",), dtype="bf16",
             device="cuda", ops=None, budget_s=0.01)
    path = tmp_path / "r.jsonl"
    probe = open_probe("cuda")
    with ResultWriter(path, header(p, dtype="bf16")) as w:
        stats = S.run_sweep(p, w, probe=probe)
    ms = read_results(path).measurements
    assert stats.measured == 2 * len(S.expected_ops(load_model("tiny"))) and all(m.ok for m in ms)
    assert {m.timer for m in ms} <= {"cuda-events", "cuda-graph"} and {m.l2_policy for m in ms} == {"flushed"}
    if probe.kind == "gpu":
        assert ms[0].clocks["before"]["sm_clock_mhz"] > 0


def test_triton_off_a_gpu_is_flagged_as_the_interpreter():
    from profiler.sweep import SweepPlan, _backend_flags
    from roofline.models import load_model

    plan = SweepPlan(model=load_model("tiny"), backends=("triton", "torch"))
    assert _backend_flags(plan, "triton") == ("triton-interpreter",)
    assert _backend_flags(plan, "torch") == ()
    assert _backend_flags(SweepPlan(model=load_model("tiny"), device="cuda"), "triton") == ()
