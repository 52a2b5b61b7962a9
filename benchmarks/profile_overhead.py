"""Profiler overhead and repeatability on this machine (a benchmark that prints ratios, not a test).

    python benchmarks/profile_overhead.py            # prints the figures
    python benchmarks/profile_overhead.py --append   # and appends them to benchmarks/RESULTS.md

1. Overhead, side by side in one run: ``roofline profile --quick`` and the default CPU sweep
   ``roofline profile`` (each a subprocess of this interpreter, ``python -m profiler.cli``;
   the ceilings and FLOP-check caches are warmed first so a first-ever measurement is not
   charged to them), each one's wall time against the sum of every timed sample in its
   results (targets: 2.5x for --quick, 1.5x for the default sweep). The sweep alone
   (warm-up, estimates, probes, writing, building inputs) is reported too, from the
   command's own "s of sweep" figure; the rest is start-up, kernel validation and the report.
2. Repeatability: the same point (decode, batch 4, context 256, the whole layer; and
   prefill batch 1 x 64, q_proj) measured twice in one process with the sweep's own
   settings; the medians should agree within 5%.

The 1-minute load average is printed: on a 2-core machine shared with other jobs the
times are the scheduler's as much as the kernels'.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.timing import now  # noqa: E402  the one clock
TARGETS = {"--quick": 2.5, "default": 1.5}
TARGET_REPEAT = 0.05
ROOFLINE = [sys.executable, "-m", "profiler.cli"]   # this checkout's code, whatever is on PATH


def overhead(out: Path, quick: bool) -> dict:
    env = dict(os.environ)
    cmd = ROOFLINE + ["profile", "--quiet", "--overwrite", "--out", str(out)] + (["--quick"] if quick else [])
    t0 = now()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = now() - t0
    if r.returncode:
        sys.exit(f"profile failed ({r.returncode}):\n{r.stderr}")
    from roofline.records import read_results

    rf = read_results(out / "results.jsonl")
    kernel = sum(sum(m.times_s) for m in rf.measurements if m.ok)
    m = re.search(r"([\d.]+) s of sweep", r.stdout)
    sweep = float(m.group(1)) if m else float("nan")
    stages = {k: float(v) for k, v in re.findall(r"(checks|ceilings|flop check|report) ([\d.]+) s", r.stdout)}
    return {"command": "roofline " + " ".join(cmd[3:]), "wall_s": wall, "sweep_s": sweep, "kernel_s": kernel,
            "stages": stages, "points": len(rf.measurements), "ratio": wall / kernel, "sweep_ratio": sweep / kernel,
            "stdout": r.stdout, "target": TARGETS["--quick" if quick else "default"]}


def repeatability() -> list:
    from kernels.runners import make_runners
    from profiler.run import BUDGET_MS
    from profiler.timing import measure
    from roofline.models import load_model

    budget = BUDGET_MS["quick-cpu"] / 1e3
    rows = []
    for phase, batch, ctx, op in (("decode", 4, 256, "layer"), ("prefill", 1, 64, "q_proj")):
        (r,) = make_runners(load_model("small"), phase, batch, ctx, dtype="fp32", backend="torch", ops=[op])
        a = measure(r.fn, budget_s=budget, warmup_s=budget / 4)
        b = measure(r.fn, budget_s=budget, warmup_s=budget / 4)
        rows.append({"point": f"{phase} b={batch} ctx={ctx} {op}", "first_s": a.median_s, "second_s": b.median_s,
                     "diff": abs(a.median_s - b.median_s) / min(a.median_s, b.median_s)})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--append", action="store_true", help="append the figures to benchmarks/RESULTS.md")
    args = ap.parse_args()
    from profiler.probes import cpu_info

    info = cpu_info()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        # warm the caches: the ceilings and the FLOP cross-check are measured once per machine and model
        subprocess.run(ROOFLINE + ["profile", "--quick", "--quiet", "--overwrite", "--no-report", "--out",
                                   str(Path(tmp) / "warm"), "--phases", "decode", "--batches", "1", "--contexts", "64"],
                       check=True, capture_output=True, cwd=ROOT)
        runs = [overhead(Path(tmp) / "quick", True), overhead(Path(tmp) / "default", False)]
    rep = repeatability()
    load1 = os.getloadavg()[0]
    lines = []
    for o in runs:
        verdict = "MET" if o["ratio"] <= o["target"] else "MISSED"
        lines.append(f"`{o['command']}`: wall {o['wall_s']:.1f} s, sweep {o['sweep_s']:.1f} s, timed samples "
                     f"{o['kernel_s']:.1f} s over {o['points']} points -> wall / kernel = **{o['ratio']:.2f}x** "
                     f"(target <= {o['target']}x: {verdict}), sweep / kernel = {o['sweep_ratio']:.2f}x; the rest: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in o["stages"].items())
                     + f", start-up and reading back {o['wall_s'] - o['sweep_s'] - sum(o['stages'].values()):.1f} s")
    for r in rep:
        lines.append(f"same point twice ({r['point']}): {r['first_s'] * 1e3:.3f} ms vs {r['second_s'] * 1e3:.3f} ms "
                     f"-> **{r['diff']:.1%}** apart (target <= {TARGET_REPEAT:.0%})")
    machine = (f"{info['name']}, {info['usable_cpus']} cores, torch threads {info['torch_threads']}, "
               f"python {platform.python_version()}; 1-min load average {load0:.1f} before, {load1:.1f} after")
    print("\n".join(lines))
    print(machine)
    if args.append:
        date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        text = (f"\n## Profiler overhead and repeatability ({date})\n\n"
                f"Command: `python benchmarks/profile_overhead.py --append`. Machine: {machine}.\n\n"
                + "\n".join(f"- {x}" for x in lines) + "\n")
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(text)
    print(json.dumps({"overhead": [{k: v for k, v in o.items() if k != "stdout"} for o in runs], "repeat": rep}),
          file=sys.stderr)


if __name__ == "__main__":
    main()
