"""How long `roofline trace` takes on a 100 MB profiler trace (target: parsed in 10 s on this machine).

    python benchmarks/trace_speed.py               # 100 MB
    python benchmarks/trace_speed.py --mb 20

Generates the trace by repeating a captured one: our tiny Llama (torch backend, fp32) runs a
prefill and a decode step under ``profiler.capture`` (record_shapes=True, phases marked);
its events are repeated with shifted timestamps and fresh External ids until the file
reaches the size asked. Each innermost op also gets a ``cudaLaunchKernel`` runtime event and
a kernel on stream 7 joined by correlation and External id, so the file reads like a GPU
trace and the join path is exercised (a CPU trace alone has only ``cpu_op`` events).
Then it times, in this process with the one clock, ``read_trace`` (JSON load, index, join)
and ``analyze_trace`` (costing, phases, grouping), and, as a separate process, the whole
``roofline trace FILE --no-report`` command; each beside the target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.timing import now  # noqa: E402  the one clock

TARGET_S = 10.0


def captured(tmp: Path) -> dict:
    import torch

    from kernels.model import LlamaModel
    from profiler.capture import capture
    from roofline.models import load_model

    m = LlamaModel(load_model("tiny"), dtype="fp32", backend="torch", max_slots=2, max_len=64)
    m.prefill(torch.arange(1, 9), slot=1)
    path = tmp / "captured.json"
    with capture(path) as cap:
        with cap.phase("prefill"):
            m.prefill(torch.arange(1, 9), slot=0)
        with cap.phase("decode"):
            m.decode_step(torch.tensor([3]), torch.tensor([0]))
    return json.loads(path.read_text())


def gpu_like(events: list) -> list:
    """The captured events plus a runtime launch and a kernel for each innermost cpu_op."""
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"]))
    out = list(events)
    corr = 1_000_000
    for i, e in enumerate(ops):
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if nxt is not None and nxt["ts"] < e["ts"] + e["dur"]:
            continue                                   # has a child: not innermost
        corr += 1
        ext = e["args"].get("External id")
        ts = e["ts"] + e["dur"] / 2
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": e["pid"], "tid": e["tid"],
                    "ts": ts, "dur": 1.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
        out.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>",
                    "pid": 0, "tid": 7, "ts": ts + 5, "dur": max(e["dur"] / 4, 0.5),
                    "args": {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": 7,
                             "correlation": corr, "registers per thread": 32, "grid": [1, 1, 1],
                             "block": [128, 1, 1], "est. achieved occupancy %": 50}})
    return out


def write_big(path: Path, base: dict, mb: float) -> int:
    events = [e for e in gpu_like(base["traceEvents"]) if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events) + 100.0
    head = {k: v for k, v in base.items() if k != "traceEvents"}
    head["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984}]
    target = int(mb * 1e6)
    with open(path, "w") as f:
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        size, rep, first = 0, 0, True
        while size < target:
            shift, idshift = rep * span, rep * 10_000_000
            for e in events:
                d = dict(e, ts=e["ts"] + shift)
                a = e.get("args")
                if a:
                    a = dict(a)
                    for k in ("External id", "correlation"):
                        if isinstance(a.get(k), int):
                            a[k] += idshift
                    d["args"] = a
                line = ("" if first else ",\n") + json.dumps(d, separators=(",", ":"))
                first = False
                f.write(line)
                size += len(line)
            rep += 1
        f.write("\n]}\n")
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=100.0, help="trace size in MB (default 100)")
    args = ap.parse_args()
    from roofline.traces.analyze import analyze_trace
    from roofline.traces.events import read_trace

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big = tmp / "big.json"
        n = write_big(big, captured(tmp), args.mb)
        t0 = now()
        tr = read_trace(big)
        t1 = now()
        res = analyze_trace(tr)
        t2 = now()
        n_ev = len(tr.ops) + len(tr.gpu) + len(tr.launches)
        cmd = [sys.executable, "-m", "profiler.cli", "trace", str(big), "--out", str(tmp / "out"), "--no-report",
               "--quiet"]
        t3 = now()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        t4 = now()
    print(f"trace: {n / 1e6:.1f} MB, {n_ev:,} events ({len(tr.ops):,} ops, {len(tr.gpu):,} kernels), "
          f"{len(res.measurements):,} measurements")
    print(f"read (load + index + join): {t1 - t0:6.2f} s")
    print(f"analyze (cost + phases):    {t2 - t1:6.2f} s")
    parse = t2 - t0
    print(f"parse total:                {parse:6.2f} s   target <= {TARGET_S:.0f} s   "
          f"{'MET' if parse <= TARGET_S else 'MISS'}")
    whole = t4 - t3
    ok = proc.returncode == 0
    print(f"`roofline trace` command:   {whole:6.2f} s   (a separate process: imports, device, writing the "
          f"results){'' if ok else '  FAILED: ' + proc.stderr.strip()[-300:]}")


if __name__ == "__main__":
    main()
