"""Regenerate the issue-24 trace fixtures (tests/test_trace_issue24.py reads them, with every figure by hand).

    python tests/data/traces/make_traces_issue24.py

Whole microseconds throughout (``make_traces.Builder``: launch calls last 5 us):

* ``rocm_capture.json`` / ``rocm_replay.json`` (MI300X, vLLM full-graph decode): the replay is one
  ``hipGraphLaunch`` of four kernels (gemm 100 us, rms_norm 10, gemm 100, paged attention 40 = 250 us).
  The capture records its four ops' launch calls (``hipLaunchKernel`` with ``args.kernel``) but only the
  first kernel as a kernel event: by kernel events alone 100 of 250 us map; with the launch calls, all.
* ``graph_train.json`` (A100 training): eager ``aten::mm`` 1000-1100 us; two ``cudaGraphLaunch`` calls
  inside ``CompiledFunction`` (1200) and ``CompiledFunctionBackward`` (1400), replaying 2 kernels (60 + 40)
  and 3 kernels (50 + 50 + 20); and 3 kernels launched before the profiler window on stream 7 (0-30, 40-60,
  70-80 us: no runtime call in the trace, before the first kernel that has one).
* ``ranks_skew/rank{0,1}.json`` (H100 SXM, NVLink 4 at 450 GB/s a direction): two all-reduces of
  4,194,304 bf16 elements (8,388,608 bytes) over 2 ranks, Seq 1 and 2, process group "0".
  rank 0: gemm 100-300, all-reduce 250-400, gemm 400-500, all-reduce 520-600 (metadata on the kernels).
  rank 1: gemm 100-330, all-reduce 330-400, gemm 400-480, all-reduce 500-600 (metadata only on
  record_param_comms). Call 1: rank 1 arrives last (330), transfer 400-330 = 70 us, rank 0 waits 80.
  Call 2: rank 0 arrives last (520), transfer 80 us, rank 1 waits 20.
* ``idle_causes.json`` (H100, decode): stream 7 runs A 100-200 (launched 50), B 300-350 (launched 280),
  C 400-450 (launched 390), E 450-453 (launched 440, 3 us: shorter than its 5 us launch call); stream 8
  runs D 480-500 (launched 395). Gaps: 200-300 host-bound (B launched after the GPU went idle; the thread
  was in ``vllm::prepare_inputs`` 205-268), 350-400 synchronisation (``cudaStreamSynchronize`` 330-360),
  453-480 other (D was queued at 395). Window 400 us, busy 223, idle 177 = 100 + 50 + 27.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from make_traces import A100, BF, GEMM, PID, TID, Builder  # noqa: E402

H100 = dict(A100, name="NVIDIA H100 80GB HBM3", computeMajor=9, numSms=132)
MI300X = {"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992}
ROCM_GEMM = "Cijk_Ailk_Bljk_BBS_BH_MT128x64x64_MI16x16x16_SN_1LDSB0"
NORM = "void vllm::rms_norm_kernel<c10::BFloat16, 8>(...)"
ATTN = "void vllm::paged_attention_v1_kernel<__hip_bfloat16, 128>(...)"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ELEMS = 4_194_304


def runtime(b, name, ts, dur, corr, **args):
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur,
                     "args": {"cbid": 1, "correlation": corr, **args}})


def rocm():
    b = Builder(devices=(MI300X,))
    b.annotation("cuda_graph_capture", 0, 1000)
    ops = (("aten::mm", [[1, 8192], [8192, 8192]], [BF, BF], ROCM_GEMM),
           ("_C::rms_norm", [[1, 8192], [1, 8192], [8192], []], [BF, BF, BF, "double"], NORM),
           ("aten::mm", [[1, 8192], [8192, 28672]], [BF, BF], ROCM_GEMM),
           ("vllm::unified_attention", [[1, 64, 128], [1, 8, 128]], [BF, BF], ATTN))
    for i, (name, dims, types, kernel) in enumerate(ops):
        e = b.op(name, 10 + 50 * i, 30, dims, types)
        if i == 0:    # the one kernel the capture recorded as a kernel event
            b.launch(e, 12, 100, 60, kernel, api="hipLaunchKernel")
        else:         # the rest only as launch calls naming their kernel
            b.corr += 1
            runtime(b, "hipExtModuleLaunchKernel", 12 + 50 * i, 5, b.corr, kernel=kernel)
    b.dump(HERE / "rocm_capture.json")
    b = Builder(devices=(MI300X,))
    b.annotation("decode", 0, 1000)
    runtime(b, "hipGraphLaunch", 100, 10, 900)
    for name, (ts, dur) in zip((ROCM_GEMM, NORM, ROCM_GEMM, ATTN), ((200, 100), (300, 10), (310, 100), (410, 40))):
        b.gpu(900, ts, dur, name)
    b.dump(HERE / "rocm_replay.json")


def graph_train():
    b = Builder()
    for i, (ts, dur) in enumerate(((0, 30), (40, 20), (70, 10))):      # queued before the profiler started
        b.gpu(10 + i, ts, dur, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>")
    e = b.op("aten::mm", 900, 50, [[2048, 4096], [4096, 4096]], [BF, BF])
    b.launch(e, 910, 1000, 100, GEMM)
    b.op("CompiledFunction", 1150, 100)
    runtime(b, "cudaGraphLaunch", 1200, 10, 700)
    for ts, dur in ((1250, 60), (1310, 40)):
        b.gpu(700, ts, dur, GEMM)
    b.op("CompiledFunctionBackward", 1380, 100)
    runtime(b, "cudaGraphLaunch", 1400, 10, 701)
    for ts, dur in ((1450, 50), (1500, 50), (1550, 20)):
        b.gpu(701, ts, dur, GEMM)
    b.dump(HERE / "graph_train.json")


def ranks_skew():
    spans = {0: ((100, 300), (250, 400), (400, 500), (520, 600)), 1: ((100, 330), (330, 400), (400, 480), (500, 600))}
    for rank, (g1, c1, g2, c2) in spans.items():
        b = Builder(devices=(H100,), dist={"backend": "nccl", "rank": rank, "world_size": 2})
        b.annotation("decode", 0, 1000)
        for seq, (g, c) in enumerate(((g1, c1), (g2, c2)), start=1):
            e = b.op("aten::mm", g[0] - 80, 20, [[8, 4096], [4096, 2048]], [BF, BF])
            b.launch(e, g[0] - 75, g[0], g[1] - g[0], GEMM)
            e = b.op("c10d::allreduce_", g[0] - 50, 40, [[ELEMS]], [BF])
            meta = {"Collective name": "allreduce", "In msg nelems": ELEMS, "Out msg nelems": ELEMS, "Group size": 2,
                    "dtype": "BFloat16", "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Seq": seq}
            e = b.op("record_param_comms", g[0] - 45, 30, [[ELEMS]], [BF], **meta)
            b.launch(e, g[0] - 40, c[0], c[1] - c[0], NCCL, stream=20, extra=meta if rank == 0 else None)
        b.dump(HERE / "ranks_skew" / f"rank{rank}.json")


def idle():
    b = Builder(devices=(H100,))
    b.annotation("decode", 0, 600)
    e = b.op("aten::mm", 40, 20, [[1, 4096], [4096, 4096]], [BF, BF])
    b.launch(e, 50, 100, 100, GEMM)                                 # A
    b.op("vllm::prepare_inputs", 205, 63)
    e = b.op("aten::add", 270, 20, [[1, 4096], [1, 4096], []], [BF, BF, "Scalar"], ["", "", "1"])
    b.launch(e, 280, 300, 50, "void at::native::vectorized_elementwise_kernel<4, add>")   # B
    b.corr += 1
    runtime(b, "cudaStreamSynchronize", 330, 30, b.corr)
    e = b.op("aten::mm", 385, 20, [[1, 4096], [4096, 4096]], [BF, BF])
    b.launch(e, 390, 400, 50, GEMM)                                 # C
    e = b.op("aten::mm", 393, 10, [[1, 4096], [4096, 1024]], [BF, BF])
    b.launch(e, 395, 480, 20, GEMM, stream=8)                       # D
    e = b.op("aten::mul", 438, 10, [[1, 4096], []], [BF, "Scalar"], ["", "2"])
    b.launch(e, 440, 450, 3, "void at::native::vectorized_elementwise_kernel<4, mul>")    # E
    b.dump(HERE / "idle_causes.json")


def main():
    rocm()
    graph_train()
    ranks_skew()
    idle()


if __name__ == "__main__":
    main()
