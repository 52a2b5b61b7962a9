"""The trace report as a user reads it, second look: five things that read wrong on the fixtures' reports.

1. a trace without --model is titled "traced ops", not "?";
2. the ridge label never sits on the peak's label (rocm_replay.json: a roofline with no points, the MI300X
   ridge 247 FLOP/byte near the right edge; gpu_new.json: a normal one);
3. a decode step's context is read from attention written as matmuls (our torch decode path, eager
   attention), and from every SDPA / flash-attn op the trace cost model costs;
4. a predicted-vs-measured point at exactly a power of ten lies strictly inside the axes;
5. an overhead-bound step says its memory-bound ops run far below the memory roof (no contradiction).

Fixtures: tests/data/traces/gpu_new.json, rocm_replay.json, idle_causes.json (make_traces*.py).
"""

from io import BytesIO
from types import SimpleNamespace

import numpy as np
import pytest

from reports.figures import roofline_figure
from reports.style import new_figure
from reports.time_plot import plot_predicted_vs_measured
from roofline.analysis import analyze
from roofline.cost import Cost
from roofline.devices import Device
from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
from roofline.traces.cost import cost_op
from roofline.traces.rules.sdpa import SDPA
from roofline.traces.phases import MATMUL_ATTENTION, PhasePlan, _shapes, matmul_attention
from roofline.writer import ResultWriter

from tests.test_trace_report_look import DATA, _trace, gpu_new, rocm  # noqa: E402, F401  (the same fixtures)


@pytest.fixture(scope="module")
def idle(tmp_path_factory):
    return _trace(tmp_path_factory, "idle_causes.json")


# ---------------------------------------------------------------- 1. the title of a trace with no model

def test_a_trace_without_a_model_is_titled_traced_ops(rocm, gpu_new):
    rf = read_results(rocm / "results.jsonl")
    assert rf.header.model is None and rf.header.model_name == "traced ops"
    fig = roofline_figure(rf).figure
    assert fig.axes[0].get_title() == "Roofline: traced ops on AMD Instinct MI300X"
    for out in (rocm, gpu_new):
        md = (out / "report.md").read_text()
        assert "traced ops on " in md and "? on " not in md and "Roofline: ?" not in md
        assert "traced ops &middot; " in (out / "report.html").read_text()


def test_other_files_without_a_model_say_what_they_hold():
    dev = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12}, bandwidth=1e12)
    assert RunHeader(device=dev, kind="counters").model_name == "counted kernels"
    assert RunHeader(device=dev, kind="profile").model_name == "no model"
    assert RunHeader(device=dev, kind="trace", model={"name": "tiny", **_tiny()}).model_name == "tiny"


def _tiny() -> dict:
    from roofline.models import PRESETS

    d = PRESETS["tiny"].to_dict()
    d.pop("name")
    return d


# ---------------------------------------------------------------- 2. ridge label vs the peak's label

def _text_boxes(ax):
    fig = ax.figure
    fig.savefig(BytesIO(), format="png")          # the layout and positions as saved
    r = fig.canvas.get_renderer()
    return {t.get_gid() or t.get_text(): t.get_window_extent(r) for t in ax.texts
            if t.get_visible() and t.get_text().strip()}


@pytest.mark.parametrize("which, ridge, peak_gid", [
    ("rocm", "ridge 247 FLOP/byte (bf16)", "ceiling-label:peak:bf16:used"),      # 1.31e15 / 5.3e12
    ("gpu_new", "ridge 153 FLOP/byte (bf16)", "ceiling-label:peak:bf16:used"),   # 312e12 / 2.04e12
])
def test_no_two_texts_of_the_roofline_overlap(which, ridge, peak_gid, request):
    rf = read_results(request.getfixturevalue(which) / "results.jsonl")
    ax = roofline_figure(rf).figure.axes[0]
    label = next(t for t in ax.texts if (t.get_gid() or "").startswith("ridge-label:"))
    assert label.get_text() == ridge
    dev = rf.header.device
    assert label.xy == pytest.approx((dev.peak_flops["bf16"] / dev.bandwidth, dev.peak_flops["bf16"]))
    boxes = _text_boxes(ax)
    assert peak_gid in boxes and "ridge-label:bf16" in boxes
    area = ax.get_window_extent(ax.figure.canvas.get_renderer())
    rb = boxes["ridge-label:bf16"]
    assert area.x0 <= rb.x0 and rb.x1 <= area.x1 and area.y0 <= rb.y0 and rb.y1 <= area.y1   # inside the axes
    names = sorted(boxes)
    hits = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if boxes[a].overlaps(boxes[b])]
    assert hits == []


def test_the_compare_figure_keeps_its_ridge_label_clear_too(gpu_new):
    from reports.compare_plot import plot_change
    from roofline.verdicts.comparison import compare

    rf = read_results(gpu_new / "results.jsonl")
    _, ax = new_figure(10, 6)
    ax = plot_change(ax, compare(rf, rf))
    boxes = _text_boxes(ax)
    assert "ridge-label:bf16" in boxes
    names = sorted(boxes)
    assert [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if boxes[a].overlaps(boxes[b])] == []


# ---------------------------------------------------------------- 3. the context from attention ops

def _gemm(batch, m, k, n):
    return SimpleNamespace(category="gemm", detail={"m": m * batch, "k": k, "n": n, "batch": batch})


def _softmax(shape):
    return SimpleNamespace(category="softmax", detail={"shape": list(shape)})


def _decode_shape(instances):
    plan = PhasePlan(["decode"] * len(instances))
    _shapes(instances, plan, [])
    return plan.shape["decode"]


def test_attention_by_matmuls_gives_the_decode_context():
    # transformers' eager attention at decode: q [2, 4, 1, 8] . k^T [2, 4, 8, 33] -> bmm [8, 1, 8] x [8, 8, 33];
    # softmax over [2, 4, 1, 33]; p.v bmm [8, 1, 33] x [8, 33, 8]: batch 2, 33 keys = 32 cached + the new one
    ops = [_gemm(1, 2, 64, 64), _gemm(8, 1, 8, 33), _softmax((2, 4, 1, 33)), _gemm(8, 1, 33, 8), _gemm(1, 2, 64, 64)]
    assert matmul_attention(ops, list(range(len(ops)))) == {"batch": 2, "s_q": 1, "s_kv": 33}
    assert _decode_shape(ops) == {"batch": 2, "context": 32, "cached": 0, "how": MATMUL_ATTENTION}


def test_two_batched_gemms_that_are_not_attention_are_not_read_as_one():
    # the softmax's last dim is not the q.k^T's n; then a p.v whose k is not the keys
    ops = [_gemm(1, 2, 64, 64), _gemm(8, 1, 8, 33), _softmax((2, 4, 1, 32)), _gemm(8, 1, 33, 8)]
    assert matmul_attention(ops, list(range(4))) is None
    ops = [_gemm(8, 1, 8, 33), _softmax((2, 4, 1, 33)), _gemm(8, 1, 32, 8)]
    assert matmul_attention(ops, list(range(3))) is None
    shape = _decode_shape([_gemm(1, 2, 64, 64)] + ops)
    assert shape["context"] == 0 and shape["batch"] == 2 and "no attention op" in shape["how"]


_BF = "c10::BFloat16"


@pytest.mark.parametrize("name", sorted(SDPA))
def test_every_costed_attention_op_gives_the_decode_context(name):
    # decode: q one token per sequence, 40 keys (39 cached + the new one), batch 3, 8 query heads on 2 KV heads
    layout = SDPA[name][0]
    q, kv = ((3, 8, 1, 64), (3, 2, 40, 64)) if layout == "bhsd" else ((3, 1, 8, 64), (3, 40, 2, 64))
    oc = cost_op(name, {"Input Dims": [list(q), list(kv), list(kv)], "Input type": [_BF, _BF, _BF],
                        "Concrete Inputs": ["", "", ""]})
    assert oc is not None and oc.category == "attention"
    inst = SimpleNamespace(category=oc.category, detail=oc.detail)
    assert _decode_shape([_gemm(1, 3, 512, 512), inst]) == {"batch": 3, "context": 39, "cached": 0,
                                                             "how": "from its first attention op"}


def test_our_tiny_moe_decode_reads_its_context_from_its_attention_matmuls(tmp_path):
    """kernels.decode_attention.torch_decode is matmuls (q.k^T, softmax, p.v), no SDPA: the decode step of a
    12-token prompt has 13 keys, so context 12 (the prefill's SDPA says 12 too)."""
    torch = pytest.importorskip("torch")
    from kernels.model import LlamaModel
    from profiler.capture import capture
    from roofline.models import load_model
    from roofline.traces.analyze import analyze_trace
    from roofline.traces.events import read_trace

    torch.manual_seed(0)
    m = LlamaModel(load_model("tiny-moe"), dtype="fp32", backend="torch", max_slots=2, max_len=64)
    m.prefill(torch.arange(1, 9), slot=1)                   # warm-up outside the trace
    path = tmp_path / "tiny_moe.json"
    with capture(path, cuda=False) as cap:
        with cap.phase("prefill"):
            m.prefill(torch.arange(1, 13), slot=0)
        with cap.phase("decode"):
            m.decode_step(torch.tensor([3]), torch.tensor([0]))
    phases = analyze_trace(read_trace(path)).summary["phases"]
    dec, pre = phases["decode"], phases["prefill"]
    assert (dec["batch"], dec["context"]) == (1, 12), dec
    assert MATMUL_ATTENTION in str(dec)
    assert (pre["batch"], pre["context"]) == (1, 12), pre


# ---------------------------------------------------------------- 4. points inside the predicted chart

def test_a_point_at_a_power_of_ten_lies_strictly_inside_the_predicted_chart(tmp_path):
    # bandwidth 1e12 B/s: 1e6 bytes are predicted 1e-6 s at the roof, measured 1e-5 s: both exactly powers of ten
    dev = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12)
    p = WorkloadPoint(model="tiny", op="q_proj", phase="decode", batch=1, new_tokens=1, context=512,
                      cost=Cost(1e6, 1e6))
    q = WorkloadPoint(model="tiny", op="o_proj", phase="decode", batch=1, new_tokens=1, context=512,
                      cost=Cost(1e7, 1e7))
    path = tmp_path / "pow10.jsonl"
    with ResultWriter(path, RunHeader(device=dev, model={"name": "tiny", **_tiny()})) as w:
        w.write(Measurement(point=p, times_s=(1e-5, 1e-5, 1e-5), device="toy"))
        w.write(Measurement(point=q, times_s=(1e-4, 1e-4, 1e-4), device="toy"))
    rf = read_results(path)
    preds = sorted(r.predicted_s for r in analyze(rf).ok)
    assert preds == pytest.approx([1e-6, 1e-5])
    fig, ax = new_figure(6, 6)
    plot_predicted_vs_measured(ax, rf)
    pts = np.vstack([c.get_offsets() for c in ax.collections if (c.get_gid() or "").startswith("pred:")])
    assert pts[np.argsort(pts[:, 0])].ravel().tolist() == pytest.approx([1e-6, 1e-5, 1e-5, 1e-4])
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert (x0, x1, y0, y1) == pytest.approx((1e-7, 1e-3, 1e-7, 1e-3))   # whole decades, padded past each point
    assert np.all((pts[:, 0] > x0) & (pts[:, 0] < x1) & (pts[:, 1] > y0) & (pts[:, 1] < y1))


# ---------------------------------------------------------------- 5. an overhead-bound verdict

def test_an_overhead_bound_step_says_its_ops_run_far_below_the_memory_roof(idle):
    steps = analyze(read_results(idle / "results.jsonl")).steps
    (s,) = [s for s in steps if s.phase == "decode"]
    assert s.label == "overhead"
    assert s.sentence.startswith("Decode at batch 1, context 0 is overhead-bound (launches, latency or the kernels, "
                                 "not memory): it reaches only 9.0% of the 3.35 TB/s datasheet bandwidth roof")
    assert s.sentence.endswith("; all of its measured 223 us is in ops memory-bound by intensity, but they run far "
                               "below the memory roof, so the time goes to launches and latency, not to moving "
                               "bytes.")
    assert "is in memory-bound ops" not in s.sentence
    assert "not to moving bytes" in (idle / "report.md").read_text()
