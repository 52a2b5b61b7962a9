"""Issue 30, honest views: a CUDA-graph replay without its capture lists its kernels by name, time and category,
costed where a kernel-name rule applies (roofline.traces.analyze, cost.cost_kernel), instead of one row
"graph replay (ops unknown)".

Fixture (an SGLang-style decode replayed with no capture): two replays of one graph, each a GEMM (50 us), an
RMSNorm (10 us), a GEMM (50 us) and an all-reduce (20 us).
"""

import sys
from pathlib import Path

import pytest

from roofline.cost import Cost
from roofline.traces import registry
from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import GEMM, PID, TID, Builder  # noqa: E402
from make_traces_issue24 import H100, NCCL  # noqa: E402

US = 1e-6
NORM = "void vllm::rms_norm_kernel<c10::BFloat16, 8>(...)"
KERNELS = ((GEMM, 50), (NORM, 10), (GEMM, 50), (NCCL, 20))


def _replays(path):
    b = Builder(devices=(H100,))
    for step in range(2):
        b.annotation("decode", 1000 * step, 1000)
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": PID, "tid": TID,
                         "ts": 1000 * step + 50, "dur": 10, "args": {"cbid": 311, "correlation": 900 + step}})
        ts = 1000 * step + 100
        for name, dur in KERNELS:
            b.gpu(900 + step, ts, dur, name, extra={"grid": [4, 1, 1]})
            ts += dur
    b.dump(path)
    return path


def _by_name(r):
    return {m.config["name"]: m for m in r.measurements}


def test_each_replayed_kernel_is_listed_by_name_time_and_category(tmp_path):
    r = analyze_trace(read_trace(_replays(tmp_path / "replay.json")))
    assert not any("ops unknown" in m.point.op for m in r.measurements)
    ms = _by_name(r)
    gemm, norm, comm = ms[GEMM], ms[NORM[:80]], ms[NCCL[:80]]
    # per step: 2 GEMM kernels of 50 us, one norm of 10 us, one all-reduce of 20 us; 2 steps
    assert gemm.config["category"] == "gemm" and sorted(gemm.times_s) == pytest.approx([50 * US] * 4)
    assert gemm.point.count == 2 and norm.point.count == 1 and gemm.point.phase == "decode"
    assert norm.config["category"] == "norm" and list(norm.times_s) == pytest.approx([10 * US, 10 * US])
    assert comm.flags == ("communication",) and comm.config["category"] == "communication"
    assert gemm.flags == norm.flags == ("uncosted",)
    s = r.summary
    assert s["uncosted_s"] == pytest.approx(220 * US) and s["communication_s"] == pytest.approx(40 * US)
    assert [o["op"].split(" (graph")[0] for o in s["top_uncosted"][:1]] == [GEMM]


def test_a_kernel_name_rule_with_a_cost_costs_a_replayed_kernel(tmp_path):
    @registry.rule(kernels=r"rms_norm_kernel", category="norm", shapes=False, priority=10)
    def norm_kernel(a):                    # a user's rule: this norm kernel, costed from what it knows
        return a.op(Cost(4096 * 5, 4096 * 2 * 2), "bf16", "[1,4096] bf16 (kernel)")

    try:
        r = analyze_trace(read_trace(_replays(tmp_path / "replay.json")))
    finally:
        registry.unregister(norm_kernel)
    norm = _by_name(r)[NORM[:80]]
    assert norm.flags == () and norm.point.cost == Cost(4096 * 5, 4096 * 2 * 2)
    assert norm.config["rule"].endswith("norm_kernel") and norm.config["category"] == "norm"
    assert r.summary["costed_s"] == pytest.approx(20 * US)
