"""Issue 30, honest views: ``--model gpt-oss-20b`` finds the router GEMM of a vLLM decode run as a CUDA-graph
replay, which only the graph-capture trace records (roofline.traces.experts).

Why it was missed: a replay has no CPU ops of its own (one ``cudaGraphLaunch``, its kernels carry no op), and the
expert reader looked only at the replay trace's ops. The capture (vLLM's gpt_oss.py: ``router =
nn.Linear(2880, 32)`` -> ``aten::linear`` > ``aten::addmm`` [T, 2880] x [2880, 32] with its [32] bias, then the
fused MoE ``vllm::moe_forward`` running triton_kernels' ``_matmul_ogs`` kernels) holds it; the replayed kernels
map to those captured ops, and through them the reader finds the passes.

Fixture: 2 MoE layers captured at batch 8; the replay (one decode step) runs their 6 kernels: router GEMM 10 us,
two matmul_ogs 40 us each, per layer.
"""

import sys
from pathlib import Path

import pytest

from roofline.models import load_model
from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import BF, GEMM, PID, TID, Builder  # noqa: E402
from make_traces_issue24 import H100  # noqa: E402

T, H, E = 8, 2880, 32
OGS = ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu", "_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1")


def _capture(path):
    b = Builder(devices=(H100,))
    b.annotation("cuda_graph_capture", 0, 2000)
    t = 10
    for _layer in range(2):
        b.op("aten::linear", t, 40, [[T, H], [E, H], [E]], [BF, BF, BF])
        e = b.op("aten::addmm", t + 5, 30, [[E], [T, H], [H, E]], [BF, BF, BF])
        b.launch(e, t + 8, t + 100, 10, GEMM)
        e = b.op("vllm::moe_forward", t + 50, 100, [[T, H], [T, E]], [BF, BF])
        for j, k in enumerate(OGS):
            b.launch(e, t + 60 + 20 * j, t + 200 + 50 * j, 40, k)
        t += 300
    return b.dump(path) and path


def _replay(path):
    b = Builder(devices=(H100,))
    b.annotation("decode", 0, 2000)
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": PID, "tid": TID, "ts": 100,
                     "dur": 10, "args": {"cbid": 311, "correlation": 900}})
    ts = 200
    for _layer in range(2):
        for name, dur in ((GEMM, 10), (OGS[0], 40), (OGS[1], 40)):
            b.gpu(900, ts, dur, name)
            ts += dur
    return b.dump(path) and path


def test_the_gpt_oss_router_is_found_through_the_capture(tmp_path):
    model = load_model("gpt-oss-20b")
    assert (model.hidden, model.n_experts, model.n_active) == (H, E, 4)
    r = analyze_trace(read_trace(_replay(tmp_path / "replay.json")), model=model,
                      captures=[read_trace(_capture(tmp_path / "capture.json"))])
    assert r.summary["graph_kernels_mapped"] == 6
    ex = r.summary["experts"]
    assert "no router GEMM" not in ex["sentence"]
    assert ex["n_passes"] == 2 and [p["layer"] for p in ex["passes"]] == [0, 1]
    assert all(p["tokens"] == T and p["phase"] == "decode" for p in ex["passes"])
    # the fused MoE records no per-expert counts: said so, never guessed
    assert ex["how"] == "grouped" and all(p["grouped"] == "vllm::moe_forward" for p in ex["passes"])
    assert "per-expert token counts are not in it" in ex["sentence"]


def test_without_the_capture_the_replay_still_says_no_router(tmp_path):
    r = analyze_trace(read_trace(_replay(tmp_path / "replay.json")), model=load_model("gpt-oss-20b"))
    assert r.summary["experts"]["n_passes"] == 0 and "no router GEMM" in r.summary["experts"]["sentence"]
