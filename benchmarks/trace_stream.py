"""Streamed against whole-document trace reading: time and peak memory (issue 24).

    python benchmarks/trace_stream.py            # a 64 MB generated GPU trace
    python benchmarks/trace_stream.py --mb 256
    python benchmarks/trace_stream.py --mb 256 --against c55e8c3   # also that revision's reader, same file

Generates a GPU trace (tests/data/traces/make_traces.Builder events: per step an aten::linear >
aten::mm with shapes, its cudaLaunchKernel and kernel, and a python_function frame; the ops and kernels
carry the other args Kineto writes: Sequence number, Fwd thread id, Input Strides, grid, block, registers,
occupancy, ...) until the file reaches the size asked, then reads it in two fresh processes, ``_read(p, stream=False)`` (one
json.loads) and ``_read(p, stream=True)`` (roofline.traces.stream), each timed with the one clock
and its peak resident memory (ru_maxrss) printed, with the ratios. ``--against REV`` also reads it (streamed) with roofline/ and profiler/ as of git revision
REV, for a before/after of a reader change. TraceLens and HTA are not run:
they are not installed here (pip install them and time them on the same file to compare).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import resource, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from profiler.timing import now
from roofline.traces.events import _read
t0 = now(); t = _read(Path({path!r}), stream={stream}); dt = now() - t0
print(dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, len(t.ops), len(t.gpu))
"""


KERNEL_ARGS = {"queued": 0, "registers per thread": 128, "shared memory": 49152, "blocks per SM": 1.2,
               "warps per SM": 9.6, "grid": [32, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %": 12}


def _op_args(seq: int, inputs: int) -> dict:
    """The args Kineto writes on a cpu_op beside the shapes (record_shapes=True)."""
    return {"Sequence number": seq, "Fwd thread id": 0, "Ev Idx": seq,
            "Input Strides": [[4096, 1], [1, 4096], []][:inputs]}


def generate(path: Path, mb: float) -> int:
    sys.path.insert(0, str(ROOT / "tests" / "data" / "traces"))
    from make_traces import BF, GEMM, PID, TID, Builder

    b = Builder()
    target, n, step = mb * 1e6, 0, 0
    with path.open("w") as f:
        f.write(json.dumps(b.head)[:-1] + ', "traceEvents": [\n')
        first = True
        while f.tell() < target:
            b.events = []
            t = step * 100
            b.op("aten::linear", t, 40, [[8, 4096], [4096, 4096], []], [BF, BF, ""], **_op_args(2 * step, 3))
            e = b.op("aten::mm", t + 5, 30, [[8, 4096], [4096, 4096]], [BF, BF], **_op_args(2 * step + 1, 2))
            b.launch(e, t + 10, t + 50, 20, GEMM, extra=KERNEL_ARGS)
            b.events.append({"ph": "X", "cat": "python_function", "name": "model.py(120): forward", "pid": PID,
                             "tid": TID, "ts": t, "dur": 45, "args": {"Python id": step}})
            for ev in b.events:
                f.write(("" if first else ",\n") + json.dumps(ev))
                first = False
                n += 1
            step += 1
        f.write("\n]}\n")
    return n


def run(path: Path, stream: bool, root: Path = ROOT) -> tuple:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(root), path=str(path), stream=stream)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1]), int(out[2]), int(out[3])


COMMAND = """
import os, resource, subprocess, sys
sys.path.insert(0, {root!r})
from profiler.timing import now
t0 = now()
subprocess.run([sys.executable, "-m", "profiler.cli", "trace", {path!r}, "--no-report", "--json",
                "--out", {out!r}], cwd={root!r},
               stdout=subprocess.DEVNULL, check=True, env={{**os.environ, "PYTHONPATH": {root!r}}})
print(now() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def command(path: Path) -> tuple:
    """(seconds, peak RSS bytes) of the whole ``roofline trace FILE --no-report --json``, run as the only child
    of a fresh process (so the peak is that command's alone)."""
    out = subprocess.run([sys.executable, "-c", COMMAND.format(root=str(ROOT), path=str(path), out=str(path.parent / "trace-out"))],
                         stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=64)
    ap.add_argument("--streamed-only", action="store_true",
                    help="skip the whole-document read (json.loads of 1 GB needs ~10 GB and minutes)")
    ap.add_argument("--command", action="store_true",
                    help="also time the whole `roofline trace FILE --no-report --json` (read, cost, phases, idle)")
    ap.add_argument("--against", metavar="REV", help="also read the file streamed with this git revision's reader")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "big.json"
        n = generate(p, a.mb)
        size = p.stat().st_size
        streamed = run(p, True)
        whole = None if a.streamed_only else run(p, False)
        rows = ([] if whole is None else [("whole document (json.loads)", whole)]) + \
            [("streamed (trace_stream)", streamed)]
        if a.against:
            old = Path(d) / "old"
            old.mkdir()
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", a.against, "roofline", "profiler"],
                                 capture_output=True, check=False)
            if tar.returncode:
                sys.exit(f"git archive {a.against} failed: {tar.stderr.decode().strip().splitlines()[-1:]}")
            subprocess.run(["tar", "-x", "-C", str(old)], input=tar.stdout, check=True)
            rows.append((f"streamed at {a.against}", run(p, True, old)))
        cmd = command(p) if a.command else None
    print(f"trace: {size / 1e6:.1f} MB, {n:,} events ({streamed[2]:,} ops, {streamed[3]:,} GPU activities)")
    for name, r in rows:
        print(f"{name:<30} {r[0]:7.2f} s   peak RSS {r[1] / 1e6:8.0f} MB")
    if cmd is not None:
        print(f"{'roofline trace --no-report':<30} {cmd[0]:7.2f} s   peak RSS {cmd[1] / 1e6:8.0f} MB   (the whole command)")
    if whole is not None:
        print(f"streamed / whole: time {streamed[0] / whole[0]:.2f}x, peak memory {streamed[1] / whole[1]:.2f}x")
    if a.against:
        old = rows[-1][1]
        print(f"streamed / streamed at {a.against}: time {streamed[0] / old[0]:.2f}x, peak memory "
              f"{streamed[1] / old[1]:.2f}x")
    print(f"at this rate 1 GB streams in {streamed[0] * 1e9 / size:.0f} s")


if __name__ == "__main__":
    main()
