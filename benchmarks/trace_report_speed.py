"""`roofline trace FILE` with its report on a small serving trace: this tree against an earlier commit, side by side.

    python benchmarks/trace_report_speed.py                  # against BEFORE (the commit before the report cuts)
    python benchmarks/trace_report_speed.py --before HEAD~3 --reps 7
    python benchmarks/trace_report_speed.py --no-report        # the command without its report, the same way

The trace is the SGLang Qwen3-8B decode step the tests write (tests/test_trace_engines_sglang.py: 469 kernels,
335 kB). The earlier commit's tree is ``git archive``d into a temporary folder; then the same command (the default
``roofline trace FILE --model qwen3-8b --mix decode=8x4096``: read, cost, report with its three figures: PNG and
SVG by matplotlib before 5c8adf8, SVG by our own writer since, PNG only with --png) runs in a fresh process alternately from each tree, ``--reps`` times each, with
``ROOFLINE_RENDER_PROCESSES=1`` (the figures drawn in the command's own process), so both see the same machine
load. Printed: each run's CPU seconds (user + system of the child: on a shared machine its wall time mostly
measures the other processes) and wall seconds, the medians and after / before of each.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.timing import now  # noqa: E402  the one clock

BEFORE = "deee709"        # the last commit before the report's layout was solved once per figure


def fixture(d: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_trace_engines_sglang as sgl

    sgl.build(d)
    return d / "sglang_qwen3_decode.json"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(tree: Path, trace: Path, out: Path, extra=()) -> tuple:
    cmd = [sys.executable, "-m", "profiler.cli", "trace", str(trace), "--model", "qwen3-8b", "--mix", "decode=8x4096",
           "--out", str(out), "--overwrite", "--quiet", *extra]
    env = {**os.environ, "PYTHONPATH": str(tree), "ROOFLINE_RENDER_PROCESSES": "1"}
    c0, t0 = _cpu(), now()
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall, cpu = now() - t0, _cpu() - c0
    if p.returncode:
        sys.exit(f"{tree}: the command failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
    return cpu, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=BEFORE, help=f"the commit to compare with (default {BEFORE})")
    ap.add_argument("--reps", type=int, default=5, help="runs of each tree (default 5)")
    ap.add_argument("--no-report", action="store_true", help="time the command with --no-report")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        old = d / "before"
        old.mkdir()
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", a.before, "profiler", "roofline", "reports",
                               "kernels"], capture_output=True, check=False)
        if arch.returncode:
            sys.exit(f"--before {a.before}: git archive failed ({arch.stderr.decode().strip()}); give a commit of "
                     "this repository.")
        subprocess.run(["tar", "-x", "-C", str(old)], input=arch.stdout, check=True)
        trace = fixture(d)
        print(f"trace: {trace.name}, {trace.stat().st_size / 1e3:.0f} kB{', --no-report' if a.no_report else ''}; "
              f"before = {a.before}, after = this tree; "
              f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        times = {"before": [], "after": []}
        extra = ("--no-report",) if a.no_report else ()
        run_once(ROOT, trace, d / "warm", extra)     # both trees' first run pays for cold caches: not counted
        run_once(old, trace, d / "warm", extra)
        for i in range(a.reps):
            for name, tree in (("before", old), ("after", ROOT)) if i % 2 == 0 else (("after", ROOT),
                                                                                    ("before", old)):
                times[name].append(run_once(tree, trace, d / f"out_{name}", extra))
    med = {}
    for name, ts in times.items():
        med[name] = [statistics.median(t[k] for t in ts) for k in (0, 1)]
        print(f"{name:<7} CPU median {med[name][0]:.2f} s (runs " + " ".join(f"{t[0]:.2f}" for t in ts)
              + f"); wall median {med[name][1]:.2f} s (runs " + " ".join(f"{t[1]:.2f}" for t in ts) + ")")
    cpu, wall = (med["after"][k] / med["before"][k] for k in (0, 1))
    print(f"after / before: CPU {cpu:.2f}x, wall {wall:.2f}x")


if __name__ == "__main__":
    main()
