"""Issue 21 through the toolkit: the report's expert-bytes chart and diagnose's expert rules, on synthetic records.

The run: Mixtral-8x7B (8 experts, top-2, 32 layers, bf16) decoding at context 16, batches 1..16, on a toy
device (bf16 100 TFLOP/s, 1 TB/s: ridge 100). Every op takes its roof time / 0.8 (80% of its roof), except the
experts op at batch 8, which takes SLOW x that and records an expert imbalance of 3 (one expert got three times
the mean tokens); the other points record 1.2. No timing: every number follows from the cost model.
"""

from __future__ import annotations

import math

import pytest

from roofline import workload as W
from roofline.analysis import analyze
from roofline.bounds import predicted_time
from roofline.devices import Device
from roofline.verdicts.diagnosis import diagnose
from roofline.models import PRESETS
from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
from roofline.units import nbytes
from roofline.writer import ResultWriter

DEV = Device(key="toy", name="Toy GPU", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12,
             source="measured", provenance="made up")
MODEL = PRESETS["mixtral-8x7b"]
BATCHES = (1, 2, 4, 8, 16)
CTX = 16
EFF = 0.8
SLOW = 2.4          # the experts op at batch 8: 2.4x its uniform expectation (33% of its roof)
TOUCHED = {1: 2, 2: 4, 4: 5, 8: 7, 16: 8}   # "this point's own routing"


def _times(ph, backend, batch):
    out = {}
    for op in ph.ops:
        t = predicted_time(op.cost, DEV.peak(op.compute_dtype), DEV.bandwidth) / EFF
        if op.name == "experts" and batch == 8 and backend == "triton":
            t *= SLOW
        out[op.name] = t
    return out


def write_moe(path, backends=("triton",), model=MODEL, imbalance=True, device=DEV):
    header = RunHeader(device=device, model=model.to_dict(), dtype="bf16", kind="profile",
                       command=f"roofline profile --model {model.name}", settings={"backends": list(backends)})
    with ResultWriter(path, header, mode="overwrite") as w:
        for backend in backends:
            for b in BATCHES:
                ph = W.decode(model, b, CTX)
                times = _times(ph, backend, b)
                for op in ph.ops:
                    cfg = {"backend": backend}
                    if op.name == "experts":
                        cfg.update(experts_touched=TOUCHED[b], of=model.n_experts)
                        if imbalance:
                            cfg["expert_imbalance"] = 3.0 if b == 8 else 1.2
                    p = WorkloadPoint(model=model.name, op=op.name, phase="decode", batch=b, new_tokens=1,
                                      context=CTX, cost=op.cost, dtype="bf16", backend=backend,
                                      compute_dtype=op.compute_dtype)
                    t = times[op.name]
                    w.write(Measurement(point=p, times_s=(t, t, t), timer="cuda-events", l2_policy="flushed",
                                        config=cfg, device=device.name))
    return read_results(path)


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    return write_moe(tmp_path_factory.mktemp("moe") / "moe.jsonl")


@pytest.fixture(scope="module")
def two_backends(tmp_path_factory):
    return write_moe(tmp_path_factory.mktemp("moe2") / "moe2.jsonl", backends=("triton", "torch"))


# ----------------------------------------------------------------- the figure

def _by_gid(fig):
    out = {}
    for ax in fig.axes:
        for a in list(ax.lines) + list(ax.collections):
            if a.get_gid():
                out.setdefault(a.get_gid(), []).append(a)
    return out


def test_sweep_prices_each_step_from_the_cost_model(moe_file):
    from reports.expert_plot import expert_sweep

    sw = expert_sweep(moe_file)
    assert (sw.context, sw.n_experts, sw.k, sw.full_batch) == (CTX, 8, 2, 17)   # 8 (1 - 0.75^17) >= 7.92
    pts = sw.series[("triton", "")]
    assert [p.batch for p in pts] == list(BATCHES)
    p4 = pts[2]
    assert p4.experts_expected == pytest.approx(5.46875)                      # 8 (1 - 0.75^4)
    assert p4.expert_bytes == pytest.approx(W.decode(MODEL, 4, CTX).expert_weight_bytes)
    one = W.decode(MODEL, 1, CTX)
    # the dense equivalent: the active parameters read once; at batch 1 a step touches exactly k experts
    assert pts[0].dense_bytes == pytest.approx(one.weight_bytes)
    assert {round(p.dense_bytes) for p in pts} == {round(one.weight_bytes)}
    assert one.weight_bytes == pytest.approx(25.5e9, rel=0.03)                # the issue's ~12.9B active parameters
    assert p4.routing_bytes == pytest.approx(5 * sw.per_expert_bytes)
    assert sw.all_expert_bytes == pytest.approx(W.decode(MODEL, 64, CTX).expert_weight_bytes, rel=1e-3)
    # at batch 1 the step and its dense equivalent have the same roof time; above it the MoE step is slower
    assert pts[0].dense_floor_s == pytest.approx(pts[0].floor_s)
    assert all(p.dense_floor_s < p.floor_s for p in pts[1:])


def test_figure_draws_bytes_dense_equivalent_time_and_full_batch(moe_file):
    from reports.figures import figure_builders

    builders = dict(figure_builders(moe_file))
    assert "experts" in builders
    (fig,) = builders["experts"]()
    assert fig.key == "experts" and fig.title == "Expert weights against batch"
    g = _by_gid(fig.figure)
    sw_bytes = [W.decode(MODEL, b, CTX).expert_weight_bytes for b in BATCHES]
    (line,) = g["experts:bytes"]
    assert list(line.get_xdata()) == list(BATCHES)
    assert list(line.get_ydata()) == pytest.approx(sw_bytes)
    (dense,) = g["experts:dense"]
    assert list(dense.get_ydata()) == pytest.approx([W.decode(MODEL, 1, CTX).weight_bytes] * len(BATCHES))
    assert "dense equivalent" in dense.get_label() and "2 of 8 experts" in dense.get_label()
    full = g["experts:full"]
    assert len(full) == 2 and all(list(v.get_xdata()) == [17, 17] for v in full)   # both panels
    (t,) = g["experts:time:triton"]
    a_steps = sorted((s.batch, s.time_s) for s in analyze(moe_file).phase_steps("decode"))
    assert list(t.get_ydata()) == pytest.approx([x for _, x in a_steps])
    assert t.get_label() == "measured step (triton)"
    (routing,) = g["experts:routing:triton"]
    per = W.decode(MODEL, 1, CTX).expert_weight_bytes / 2
    assert [y for _, y in routing.get_offsets()] == pytest.approx([per * TOUCHED[b] for b in BATCHES])
    labels = [x.get_text() for x in fig.figure.axes[0].texts]
    assert "5/8" in labels and "all experts from batch 17" in labels
    assert {"experts:floor", "experts:dense-floor", "experts:weights", "experts:all"} <= set(g)
    assert "from batch 17" in fig.caption and "dense equivalent" in fig.caption


def test_figure_has_one_time_line_per_backend(two_backends):
    from reports.figures import expert_figure

    g = _by_gid(expert_figure(two_backends).figure)
    assert {k for k in g if k.startswith("experts:time:")} == {"experts:time:triton", "experts:time:torch"}
    assert len(g["experts:bytes"]) == 1            # the cost model's line is drawn once
    tri, tor = g["experts:time:triton"][0], g["experts:time:torch"][0]
    assert tri.get_color() != tor.get_color()
    assert tri.get_ydata()[3] == pytest.approx(tor.get_ydata()[3] + (SLOW - 1) * _experts_time(8))


def _experts_time(b):
    ph = W.decode(MODEL, b, CTX)
    o = ph.op("experts")
    return o.count * predicted_time(o.cost, DEV.peak(o.compute_dtype), DEV.bandwidth) / EFF


def test_no_expert_figure_for_a_dense_model():
    from pathlib import Path

    from reports.figures import figure_builders

    rf = read_results(Path(__file__).parent / "data" / "reports_h100.jsonl")
    assert "experts" not in dict(figure_builders(rf))


def test_report_html_and_markdown_carry_the_figure(moe_file, tmp_path):
    from reports import write_report

    out = write_report([moe_file], tmp_path / "rep")
    assert (tmp_path / "rep" / "figures" / "experts.png").exists()
    assert "Expert weights against batch" in (tmp_path / "rep" / "report.md").read_text()
    assert "Expert weights against batch" in (tmp_path / "rep" / "report.html").read_text()
    assert "png:experts" in out


# ----------------------------------------------------------------- diagnose

def _rule(findings, rule):
    return [f for f in findings if f.rule == rule]


def test_expert_bound_says_the_bytes_and_where_reuse_recovers(moe_file):
    (f,) = _rule(diagnose([moe_file]), "expert-bound")
    ph = W.decode(MODEL, 16, CTX)
    assert f.claim == (f"Decode is bound by expert weights: at batch 16 a step reads {nbytes(ph.expert_weight_bytes)} "
                       f"of expert weights ({ph.experts_touched:.2f} of 8 experts per layer); every expert is loaded "
                       "from batch 17, after which batching reuses them.")
    assert f.claim == ("Decode is bound by expert weights: at batch 16 a step reads 89.3 GB of expert weights "
                       "(7.92 of 8 experts per layer); every expert is loaded from batch 17, after which batching "
                       "reuses them.")
    assert f.action.startswith("a larger decode batch, up to 17 (below it each added token mostly brings new "
                               "experts' weights; from it on they are reused, as in a dense model); expert "
                               "parallelism")
    assert "quantized experts" in f.action
    for b in BATCHES:
        assert f"b{b}/ctx16: experts op" in f.evidence
    assert "5 touched by this point's routing" in f.evidence


def test_expert_bound_is_silent_past_the_every_expert_batch(tmp_path, monkeypatch):
    import roofline.explain as X

    monkeypatch.setattr(X, "FULL_SHARE", 0.5)     # every expert "loaded" from batch 3: batches 4..16 reuse them
    rf = write_moe(tmp_path / "m.jsonl")
    (f,) = _rule(diagnose([rf]), "expert-bound")
    assert "at batch 2 a step reads" in f.claim and "from batch 3," in f.claim
    assert "b4/ctx16" not in f.evidence


def test_expert_bound_names_the_cpu_advice(tmp_path):
    from dataclasses import replace

    rf = write_moe(tmp_path / "c.jsonl", device=replace(DEV, kind="cpu"))
    (f,) = _rule(diagnose([rf]), "expert-bound")
    assert "needs a second memory system" in f.action


def test_expert_imbalance_names_the_point_and_how_much(moe_file):
    (f,) = _rule(diagnose([moe_file]), "expert-imbalance")
    assert f.claim == ("Expert imbalance at b8/ctx16: the experts op took 2.4x the time uniform routing predicts, "
                       "and one expert got 3.0x the mean tokens of the experts touched.")
    assert "median roof fraction over this run's 5 decode points (80%)" in f.evidence
    assert "max/mean tokens per expert 3.00" in f.evidence


def test_expert_imbalance_needs_recorded_counts(tmp_path):
    rf = write_moe(tmp_path / "n.jsonl", imbalance=False)
    assert not _rule(diagnose([rf]), "expert-imbalance")
    assert _rule(diagnose([rf]), "expert-bound")        # the time alone still says what bounds the step


def test_two_backends_keep_their_findings_apart(two_backends):
    fs = diagnose([two_backends])
    assert [f.claim.split(":")[0] for f in _rule(fs, "expert-bound")] == [
        "Decode (torch) is bound by expert weights", "Decode (triton) is bound by expert weights"]
    (imb,) = _rule(fs, "expert-imbalance")               # only the triton run was slow at batch 8
    assert imb.claim.startswith("Expert imbalance (triton) at b8/ctx16")


def test_dense_model_gets_no_expert_findings():
    from pathlib import Path

    rf = read_results(Path(__file__).parent / "data" / "reports_two_backends.jsonl")
    assert not [f for f in diagnose([rf]) if f.rule.startswith("expert")]


# ----------------------------------------------------------------- the runner records the routing's imbalance

def test_experts_runner_records_max_over_mean_tokens():
    from kernels.runners import make_runners

    cfg = PRESETS["tiny-moe"]
    for b in (4, 16):
        (r,) = make_runners(cfg, "decode", b, 16, dtype="fp32", backend="torch", ops=["experts"])
        c = r.config
        touched, ratio = c["experts_touched"], c["expert_imbalance"]
        mean = b * cfg.n_active / touched
        busiest = ratio * mean                       # the busiest expert's tokens: a whole number, at most b
        assert busiest == pytest.approx(round(busiest), abs=1e-3)
        assert math.ceil(mean - 1e-9) <= round(busiest) <= b
        assert ratio >= 1.0
