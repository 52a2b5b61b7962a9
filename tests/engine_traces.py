"""A small builder of serving-engine profiler traces for tests (the Kineto format ``roofline.traces.events`` reads).

Ops are ``cpu_op`` events with Input Dims / Input type / Concrete Inputs; each kernel is a runtime launch call
(``cudaLaunchKernel``, or ``cuLaunchKernel`` for Triton) inside its op and a ``kernel`` event joined by its External
id; a graph replay is one ``cudaGraphLaunch`` whose kernels share its correlation. CPU and GPU clocks advance on
their own (µs), so kernels never overlap and the GPU time is the sum of the kernel durations given.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

PID, TID = 7, 7
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984, "computeMajor": 9,
        "computeMinor": 0, "numSms": 132}
BF, F32, FP8, I32, I64, U8 = "c10::BFloat16", "float", "c10::Float8_e4m3fn", "int", "long int", "unsigned char"


class EngineTrace:
    def __init__(self, world_size: int = 1):
        self.events, self.ext, self.corr, self.cpu, self.gpu_t = [], 0, 1000, 100.0, 10_000.0
        self.head = {"schemaVersion": 1, "deviceProperties": [H100], "record_shapes": 1}
        if world_size > 1:
            self.head["distributedInfo"] = {"rank": 0, "world_size": world_size, "backend": "nccl"}
        self.kernel_us = 0.0

    def _event(self, cat, name, ts, dur, args, pid=PID, tid=TID):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})

    @contextmanager
    def step(self, name: str):
        """A user_annotation (an engine's step name) around what the block records."""
        start = self.cpu
        self.cpu += 1
        yield
        self.cpu += 1
        self.ext += 1
        self._event("user_annotation", name, start, self.cpu - start, {"External id": self.ext})

    def _kernel(self, name, dur, corr, ext=None, stream=7):
        self.gpu_t = max(self.gpu_t, self.cpu + 5)
        args = {"device": 0, "stream": stream, "correlation": corr, "grid": [1, 1, 1], "block": [128, 1, 1]}
        if ext is not None:
            args["External id"] = ext
        self._event("kernel", name, self.gpu_t, dur, args, pid=0, tid=stream)
        self.gpu_t += dur
        self.kernel_us += dur

    def op(self, name, dims=(), types=(), concrete=None, kernels=()):
        """An op and the kernels it launches, in order: ``kernels`` [(name, µs), ...]; an item that is a dict
        {"op": (name, dims, types, concrete, kernels)} is an op nested inside this one."""
        self.ext += 1
        ext, start = self.ext, self.cpu
        self.cpu += 1
        for item in kernels:
            if isinstance(item, dict):
                self.op(*item["op"])
                self.cpu += 1
                continue
            kname, dur = item
            self.corr += 1
            api = "cuLaunchKernel" if not kname.startswith("void") and "::" not in kname else "cudaLaunchKernel"
            self._event("cuda_runtime" if api.startswith("cuda") else "cuda_driver", api, self.cpu, 2,
                        {"correlation": self.corr, "External id": ext})
            self._kernel(kname, dur, self.corr, ext)
            self.cpu += 3
        self.cpu += 1
        self._event("cpu_op", name, start, self.cpu - start,
                    {"External id": ext, "Input Dims": [list(d) for d in dims], "Input type": list(types),
                     "Concrete Inputs": list(concrete or [""] * len(dims))})
        return ext

    def bare(self, kname, dur):
        """A kernel no op launched (a library calling the driver outside every op)."""
        self.corr += 1
        self.cpu += 1                     # past the op before it
        self._event("cuda_driver", "cuLaunchKernel", self.cpu, 2, {"correlation": self.corr})
        self.cpu += 3
        self._kernel(kname, dur, self.corr)

    def graph(self, kernels):
        """One cudaGraphLaunch replaying ``kernels`` [(name, µs) or (name, µs, stream), ...] (stream 7 unless
        given), one after another on the GPU clock."""
        self.corr += 1
        self.cpu += 1
        self._event("cuda_runtime", "cudaGraphLaunch", self.cpu, 10, {"correlation": self.corr})
        self.cpu += 11
        for kname, dur, *stream in kernels:
            self._kernel(kname, dur, self.corr, stream=stream[0] if stream else 7)

    def dump(self, path: Path) -> Path:
        d = dict(self.head, traceEvents=self.events)
        path.write_text(json.dumps(d))
        return path
