"""How long `roofline report` takes, and how much memory it needs, for a large result file.

    python benchmarks/report_speed.py              # 20,000 points (targets: under 10 s, under 300 MB)
    python benchmarks/report_speed.py --points 2000

Writes a synthetic result file like a real sweep (llama-3-8b on an h100 with measured
ceilings: every op of roofline.workload over many decode and prefill steps, 100 raw samples
per point, as a GPU sweep records), then runs ``roofline report FILE`` as a separate process
(``python -m profiler.cli``, the same code as the command) and reports its wall time and peak
resident memory (the child's ru_maxrss) side by side with the targets. Nothing is measured
on hardware; the times in the records are synthetic.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.timing import now  # noqa: E402  the one clock
from roofline import workload as W  # noqa: E402
from roofline.bounds import predicted_time  # noqa: E402
from roofline.devices import find_device  # noqa: E402
from roofline.models import PRESETS  # noqa: E402
from roofline.records import Measurement, RunHeader, WorkloadPoint  # noqa: E402
from roofline.writer import ResultWriter  # noqa: E402

TARGET_S = 10.0
TARGET_MB = 300.0
SAMPLES = 100


def write_synthetic(path: Path, n_points: int) -> int:
    """A result file of ``n_points`` measurements; returns its size in bytes."""
    rng = np.random.default_rng(0)
    model = PRESETS["llama-3-8b"]
    sheet = find_device("h100")
    dev = sheet.with_ceilings({"bf16": 800e12}, bandwidth=3.0e12, source="measured")
    header = RunHeader(device=dev, datasheet=sheet, model=model, command="benchmarks/report_speed.py")
    batches = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512]
    contexts = [128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8191]
    steps = [(be, "decode", b, c) for be in ("triton", "torch") for b in batches for c in contexts]
    steps += [(be, "prefill", b, c) for be in ("triton", "torch") for b in batches for c in contexts]
    n = 0
    with ResultWriter(path, header, mode="overwrite") as w:
        for backend, phase, b, c in steps:
            ph = W.decode(model, b, c) if phase == "decode" else W.prefill(model, b, c)
            for op in ph.ops:
                peak = dev.peak(op.compute_dtype)
                t = predicted_time(op.cost, peak, dev.bandwidth) / rng.uniform(0.5, 0.9) + 3e-6
                p = WorkloadPoint(model=model.name, op=op.name, phase=phase, batch=b, new_tokens=ph.new_tokens,
                                  context=c, cost=op.cost, compute_dtype=op.compute_dtype, backend=backend)
                w.write(Measurement(point=p, times_s=tuple(float(x) for x in t * (1 + 0.01 *
                                                                             rng.standard_normal(SAMPLES))),
                                    timer="cuda-events", l2_policy="flushed"))
                n += 1
                if n == n_points:
                    return path.stat().st_size
    raise SystemExit(f"only {n} points could be made; add steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "results.jsonl"
        size = write_synthetic(src, args.points)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = now()
        r = subprocess.run([sys.executable, "-m", "profiler.cli", "report", str(src), "--out", str(Path(d) / "rep")],
                           cwd=ROOT, capture_output=True, text=True)
        elapsed = now() - t0
        if r.returncode:
            raise SystemExit(f"report failed:\n{r.stderr}")
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024     # kB on Linux
        html = (Path(d) / "rep" / "report.html").stat().st_size
    if before:
        rss_note = " (a child before it used more)" if before / 1024 >= rss_mb else ""
    else:
        rss_note = ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"`roofline report` of {args.points:,} points ({size / 1e6:.1f} MB file): {elapsed:.2f} s "
          f"({elapsed / TARGET_S:.2f}x the {TARGET_S:.0f} s target), peak memory {rss_mb:.0f} MB "
          f"({rss_mb / TARGET_MB:.2f}x the {TARGET_MB:.0f} MB target){rss_note}; HTML {html / 1e6:.1f} MB; "
          f"{cores} cores, {platform.processor() or platform.machine()}, python {platform.python_version()}; "
          f"1-min load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
