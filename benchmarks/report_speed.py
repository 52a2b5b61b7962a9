"""How long `roofline report` takes to render 2,000 points (target: under 10 s on 2 cores).

    python benchmarks/report_speed.py            # prints the time and the ratio to the target

Builds an in-memory result file like a real sweep (llama-3-8b on an h100 with measured
ceilings: every op of roofline.workload over decode batches 1..512 x contexts 128..6144
and prefill batches 1..16 x prompts 128..8192, cut at 2,000 points)
and times ``reports.write_report`` end to end: figures as PNG and SVG, HTML, markdown.
Nothing is measured on hardware; the times in the records are synthetic.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from roofline import workload as W
from roofline.bounds import predicted_time
from roofline.devices import find_device
from roofline.models import PRESETS
from roofline.records import Measurement, ResultFile, RunHeader, WorkloadPoint

TARGET_S = 10.0
N_POINTS = 2000


def synthetic_result_file(n_points: int = N_POINTS) -> ResultFile:
    rng = np.random.default_rng(0)
    model = PRESETS["llama-3-8b"]
    sheet = find_device("h100")
    dev = sheet.with_ceilings({"bf16": 800e12}, bandwidth=3.0e12, source="measured")
    header = RunHeader(device=dev, datasheet=sheet, model=model.to_dict(), command="benchmarks/report_speed.py")
    steps = [W.decode(model, b, c) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) for c in (128, 256, 512, 1024, 2048, 3072, 4096, 6144)]
    steps += [W.prefill(model, b, c) for b in (1, 2, 4, 8, 16) for c in (128, 256, 512, 1024, 2048, 4096, 8192)]
    ms = []
    for ph in steps:
        for op in ph.ops:
            peak = dev.peak(op.compute_dtype)
            t = predicted_time(op.cost, peak, dev.bandwidth) / rng.uniform(0.5, 0.9) + 3e-6
            p = WorkloadPoint(model=model.name, op=op.name, phase=ph.phase, batch=ph.batch, new_tokens=ph.new_tokens,
                              context=ph.context, cost=op.cost, compute_dtype=op.compute_dtype)
            ms.append(Measurement(point=p, times_s=tuple(t * (1 + 0.01 * rng.standard_normal(5))),
                                  timer="cuda-events"))
            if len(ms) == n_points:
                return ResultFile(Path("synthetic-2000.jsonl"), header, ms, [])
    raise AssertionError(f"only {len(ms)} points; add steps")


def main() -> None:
    from reports import write_report

    rf = synthetic_result_file()
    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), time.process_time()
        paths = write_report([rf], d)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        size = Path(paths["html"]).stat().st_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"report for {len(rf.measurements):,} points: {elapsed:.2f} s "
          f"({elapsed / TARGET_S:.2f} x the {TARGET_S:.0f} s target; {cpu:.2f} s CPU); HTML {size / 1e6:.1f} MB; "
          f"{cores} cores, {platform.processor() or platform.machine()}, python {platform.python_version()}")


if __name__ == "__main__":
    main()
