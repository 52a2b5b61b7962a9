"""Regenerate the hand-built GPU-format trace fixtures (tests/test_trace_gpu_fixtures.py reads them).

    python tests/data/traces/make_traces.py

Each file is a torch.profiler (Kineto) trace in miniature, written event by event with the
fields libkineto's output_json.cpp writes (cpu_op / cuda_runtime / kernel / gpu_memcpy /
gpu_memset / user_annotation, ``args`` with External id, correlation, Input Dims, Input type,
Concrete Inputs; deviceProperties; distributedInfo). Times are whole microseconds so the
tests can state every join, sum and busy time exactly:

* ``gpu_new.json``: the newer linkage (a kernel carries its launching op's External id).
  prefill: aten::linear > aten::matmul > aten::mm [8,4096]x[4096,4096] bf16, one kernel
  300-380 us; a split-K aten::mm [8,4096]x[4096,14336] with two kernels 400-520 and 520-540
  (one instance, 140 us); aten::add [8,4096]+[8,4096] 540-560. decode: aten::mm
  [1,4096]x[4096,4096] 1100-1150; aten::copy_ fp32 -> bf16 [1,4096] as a memcpy 1200-1210; a
  memset 1300-1305 and a kernel 1400-1410 launched outside any op (unattributed).
  Kernel sum 80+120+20+20+50+10 = 300 us; with the copies the GPU is busy 315 us of a
  300-1410 window (idle 795 us).
* ``gpu_old.json``: the same work with the older linkage: a kernel's External id is its own
  correlation; only the runtime call's correlation and thread lead to the op.
* ``gpu_new.json.gz``: gpu_new.json gzip-compressed.
* ``two_streams.json``: kernels on streams 7 and 8 that overlap: 100-200 and 150-300 on two
  streams, 400-450: kernel sum 300 us, busy 250 us, window 350 us, idle 100 us.
* ``graph_replay.json`` / ``graph_capture.json``: a decode step as one cudaGraphLaunch whose
  three kernels (gemm, rms_norm, gemm) carry no op; the capture trace holds the ops that
  launched kernels of the same names, with shapes.
* ``ranks/rank0.json``, ``ranks/rank1.json``: two ranks (distributedInfo), each an mm and an
  NCCL all-reduce of 32,768 bf16 elements over 2 ranks (record_param_comms metadata).
* ``no_shapes.json``: kernels and ops recorded without shapes (record_shapes off).
* ``unknown_device.json``: a device name the catalogue does not know.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

HERE = Path(__file__).parent
PID, TID = 4242, 4242
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920, "computeMajor": 8,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 108, "warpSize": 32}


class Builder:
    def __init__(self, devices=(A100,), dist=None, shapes=True):
        self.events, self.ext, self.corr, self.shapes = [], 0, 100, shapes
        self.head = {"schemaVersion": 1, "deviceProperties": list(devices), "record_shapes": 1 if shapes else 0}
        if dist:
            self.head["distributedInfo"] = dist

    def annotation(self, name, ts, dur):
        self.ext += 1
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": TID, "ts": ts,
                            "dur": dur, "args": {"External id": self.ext}})

    def op(self, name, ts, dur, dims=(), types=(), concrete=None, **extra):
        self.ext += 1
        args = {"External id": self.ext, "Record function id": 0, **extra}
        if self.shapes:
            args.update({"Input Dims": [list(d) for d in dims], "Input type": list(types),
                         "Concrete Inputs": list(concrete or [""] * len(dims))})
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur,
                            "args": args})
        return self.ext

    def launch(self, ext, ts, gpu_ts, gpu_dur, name, *, cat="kernel", stream=7, api="cudaLaunchKernel", old=False,
               extra=None):
        """A runtime call at ts and the GPU activity it started; ``old``: the older linkage."""
        self.corr += 1
        c = self.corr
        rt = {"cbid": 211, "correlation": c}
        if ext is not None and not old:
            rt["External id"] = ext
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": PID, "tid": TID, "ts": ts,
                            "dur": 5, "args": rt})
        self.gpu(c, gpu_ts, gpu_dur, name, cat=cat, stream=stream, ext=c if old else ext, extra=extra)
        return c

    def gpu(self, corr, ts, dur, name, *, cat="kernel", stream=7, ext=None, extra=None):
        args = {"device": 0, "context": 1, "stream": stream, "correlation": corr, **(extra or {})}
        if ext is not None:
            args["External id"] = ext
        if cat == "kernel":
            args.update({"registers per thread": 32, "grid": [1, 1, 1], "block": [128, 1, 1]})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": args})

    def dump(self, path):
        d = dict(self.head, traceEvents=self.events + [{"name": "Record Window End", "ph": "i", "s": "g", "pid": "",
                                                        "tid": "", "ts": 5000}], traceName=str(path.name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(d, indent=0) + "\n")
        return d


BF, F32 = "c10::BFloat16", "float"
GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn"
SPLITK = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_splitK"
REDUCE = "void cutlass::Kernel<cutlass::reduction::kernel::splitKreduce_kernel<float, __nv_bfloat16>>(Params)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<c10::BFloat16>>"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>>"


def eager(old: bool) -> Builder:
    b = Builder()
    b.annotation("prefill", 0, 1000)
    b.op("aten::linear", 10, 190, [[8, 4096], [4096, 4096], []], [BF, BF, ""])
    b.op("aten::t", 12, 2, [[4096, 4096]], [BF])
    b.op("aten::matmul", 20, 170, [[8, 4096], [4096, 4096]], [BF, BF])
    mm = b.op("aten::mm", 30, 150, [[8, 4096], [4096, 4096]], [BF, BF])
    b.launch(mm, 40, 300, 80, GEMM, old=old)
    split = b.op("aten::mm", 210, 190, [[8, 4096], [4096, 14336]], [BF, BF])
    b.launch(split, 220, 400, 120, SPLITK, old=old)
    b.launch(split, 240, 520, 20, REDUCE, old=old)
    add = b.op("aten::add", 410, 40, [[8, 4096], [8, 4096], []], [BF, BF, "Scalar"], ["", "", "1"])
    b.launch(add, 420, 540, 20, ADD, old=old)
    b.annotation("decode", 1000, 1000)
    mm2 = b.op("aten::mm", 1010, 100, [[1, 4096], [4096, 4096]], [BF, BF])
    b.launch(mm2, 1020, 1100, 50, GEMM, old=old)
    cp = b.op("aten::copy_", 1120, 50, [[1, 4096], [1, 4096], []], [BF, F32, "Scalar"], ["", "", "False"])
    b.launch(cp, 1130, 1200, 10, "Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy", api="cudaMemcpyAsync",
             old=old, extra={"bytes": 16384})
    b.launch(None, 1250, 1300, 5, "Memset (Device)", cat="gpu_memset", api="cudaMemsetAsync", old=old,
             extra={"bytes": 64})
    b.launch(None, 1260, 1400, 10, FILL, old=old)
    return b


def main():
    d = eager(old=False).dump(HERE / "gpu_new.json")
    eager(old=True).dump(HERE / "gpu_old.json")
    (HERE / "gpu_new.json.gz").write_bytes(gzip.compress((json.dumps(d) + "\n").encode(), mtime=0))

    b = Builder()
    b.annotation("decode", 0, 500)
    for i, (ts, dur, stream) in enumerate(((100, 100, 7), (150, 150, 8), (400, 50, 7))):
        e = b.op("aten::mm", 10 + 20 * i, 10, [[1, 4096], [4096, 4096]], [BF, BF])
        b.launch(e, 12 + 20 * i, ts, dur, GEMM, stream=stream)
    b.dump(HERE / "two_streams.json")

    h100 = dict(A100, name="NVIDIA H100 80GB HBM3", computeMajor=9, numSms=132)
    names = (GEMM, "void vllm::rms_norm_kernel<c10::BFloat16, 8>(...)", GEMM)
    b = Builder(devices=(h100,))
    b.annotation("decode", 0, 1000)
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": PID, "tid": TID, "ts": 100,
                     "dur": 10, "args": {"cbid": 311, "correlation": 500}})
    for name, (ts, dur) in zip(names, ((200, 60), (260, 10), (270, 60))):
        b.gpu(500, ts, dur, name)
    b.dump(HERE / "graph_replay.json")
    b = Builder(devices=(h100,))
    b.annotation("cuda_graph_capture", 0, 1000)
    e = b.op("aten::mm", 10, 20, [[1, 4096], [4096, 4096]], [BF, BF])
    b.launch(e, 12, 100, 60, GEMM)
    e = b.op("_C::rms_norm", 40, 20, [[1, 4096], [1, 4096], [4096], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"])
    b.launch(e, 42, 160, 10, names[1])
    e = b.op("aten::mm", 70, 20, [[1, 4096], [4096, 11008]], [BF, BF])
    b.launch(e, 72, 170, 60, GEMM)
    b.dump(HERE / "graph_capture.json")

    for rank, slow in ((0, 0), (1, 40)):
        b = Builder(dist={"backend": "nccl", "rank": rank, "world_size": 2})
        b.annotation("decode", 0, 1000)
        e = b.op("aten::mm", 10, 20, [[8, 4096], [4096, 2048]], [BF, BF])
        b.launch(e, 12, 100, 50, GEMM)
        e = b.op("c10d::allreduce_", 40, 60, [[8, 4096]], [BF])
        meta = {"Collective name": "allreduce", "In msg nelems": 32768, "Out msg nelems": 32768, "Group size": 2,
                "dtype": "BFloat16"}
        e = b.op("record_param_comms", 45, 50, [[8, 4096]], [BF], **meta)
        b.launch(e, 50, 160 + slow, 100, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 stream=20, extra=meta)
        b.dump(HERE / "ranks" / f"rank{rank}.json")

    b = eager(old=False)
    ns = copy.deepcopy(b.head)
    b2 = Builder(shapes=False)
    b2.events = [dict(e, args={k: v for k, v in e["args"].items()
                               if k not in ("Input Dims", "Input type", "Concrete Inputs")}) for e in b.events]
    b2.head = dict(ns, record_shapes=0)
    b2.dump(HERE / "no_shapes.json")
    b = eager(old=False)
    b.head["deviceProperties"] = [dict(A100, name="NVIDIA Quantum X9000")]
    b.dump(HERE / "unknown_device.json")


if __name__ == "__main__":
    main()
