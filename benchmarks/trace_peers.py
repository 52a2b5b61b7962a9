"""Side by side: `roofline trace` against AMD TraceLens and Meta's Holistic Trace Analysis (HTA).

    python benchmarks/trace_peers.py                      # a generated 100 MB GPU trace
    python benchmarks/trace_peers.py --mb 20
    python benchmarks/trace_peers.py --trace FILE.json    # your own trace (one rank)
    python benchmarks/trace_peers.py --peers-python /tmp/peers-venv/bin/python
    python benchmarks/trace_peers.py --fixtures --peers-python /tmp/tlvenv/bin/python   # coverage beside speed

The trace is ``trace_speed.py``'s (a captured tiny-Llama prefill + decode repeated, a launch and a kernel per
innermost op), with what Kineto also writes and the peers need: an ``ac2g`` flow pair per launch (TraceLens
links a launch to its kernel only through these) and ``distributedInfo`` (HTA reads the rank from it). Then,
one after another, each in a fresh process on the same file, it times (wall seconds, peak RSS):

* ours: the whole ``roofline trace FILE --no-report --json`` command (read, join, cost, phases, idle, write);
* TraceLens: what its perf report starts with: ``TreePerfAnalyzer.from_file(path)``, ``get_df_gpu_timeline()``,
  ``get_df_kernel_launchers()`` and ``get_df_kernel_launchers_summary(...)``;
* HTA: ``TraceAnalysis(trace_dir=...)`` (parse), ``get_temporal_breakdown()`` and ``get_idle_time_breakdown()``,
  on a folder holding a link to the file (made before the timing), with ``HTA_DISABLE_NS_ROUNDING=1``: by
  default HTA rounds each event inward to whole microseconds (start up, end down), which gives a kernel
  under 1 us a duration of 0 or -1 and fails its own ``assert idle_time <= kernel_time`` on this trace
  (and skips a per-row Python ``apply``, so HTA is, if anything, favoured).

``--fixtures``: instead, the serving-engine traces the tests write from the engines' sources (tests/engine_traces.py:
vLLM FP8 Llama mixed step, vLLM gpt-oss MXFP4 decode replay + its capture, SGLang Qwen3 decode eager and replayed
without its capture, DeepSeek MLA decode), each with Kineto's ac2g flows added, and per tool its wall time and its
*coverage*: the share of GPU kernel time that has FLOPs and bytes. Ours is the default command, report included
(``roofline trace FILE --model M --mix MIX [--capture-trace CAP]``), its coverage ``1 - uncosted_share`` from
``--json`` (communication counted as costed). TraceLens's is its full report
(``generate_perf_report_pytorch(path, output_csvs_dir=...)``, timed), then, untimed, its perf models on every op
it models (``op_to_perf_model_class_map``) through ``build_df_perf_metrics``: a kernel is covered when an op
above it has a finite ``GFLOPS`` and ``Data Moved (MB)`` (each kernel once, however many modelled ops are
around it), NCCL kernels counted as covered (its collective analysis gives their bytes). HTA has no FLOPs model:
its time only. A tool that is not installed is printed as "not installed".

Each peer's wall time counts its interpreter start and imports, as ours does; its own work (from its first
call to its last) is printed beside it. Then ours / peer, and the figures both count (GPU kernel time sum,
busy time, idle time, kernel count) side by side with their difference. The peers run under
``--peers-python`` (a separate virtual environment: they are never installed into ours); one that does not
import there is skipped with the line that installs it.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))   # trace_speed (the generator)

PEERS_PYTHON = "/tmp/peers-venv/bin/python"
INSTALL = {"TraceLens": "pip install git+https://github.com/AMD-AGI/TraceLens",
           "HTA": "pip install HolisticTraceAnalysis"}
IMPORTS = {"TraceLens": "from TraceLens import TreePerfAnalyzer", "HTA": "from hta.trace_analysis import TraceAnalysis"}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

# Each child prints one JSON line: its own work time and the figures it counted (microseconds, as the peers
# report them). The clock is profiler.timing.now (only the stdlib is imported from it).
TRACELENS = """
import json, sys
sys.path.insert(0, {root!r})
from profiler.timing import now
from TraceLens import TreePerfAnalyzer
t0 = now()
pa = TreePerfAnalyzer.from_file({path!r})
tl = pa.get_df_gpu_timeline()
kl = pa.get_df_kernel_launchers()
summary = pa.get_df_kernel_launchers_summary(kl)
work = now() - t0
t = dict(zip(tl["type"], tl["time ms"] * 1e3))
gpu = [e for e in pa.tree.events if e.get("cat") in {cats!r}]
print(json.dumps({{"work_s": work, "kernel_sum_us": sum(e["dur"] for e in gpu), "kernels": len(gpu),
                  "linked_kernels": sum(1 for e in gpu if e.get("tree")),
                  "busy_us": t["busy_time"], "idle_us": t["idle_time"], "window_us": t["total_time"],
                  "launcher_kernel_sum_us": float(kl["total_direct_kernel_time"].sum()),
                  "launchers": len(kl), "launcher_names": len(summary)}}))
"""

HTA = """
import json, logging, sys
sys.path.insert(0, {root!r})
logging.disable(logging.WARNING)
from profiler.timing import now
from hta.trace_analysis import TraceAnalysis
t0 = now()
a = TraceAnalysis(trace_dir={dir!r})
tb = a.get_temporal_breakdown(visualize=False)
idle = a.get_idle_time_breakdown(visualize=False)
work = now() - t0
df = a.t.get_trace(0)
k = df[df["stream"] >= 0]
row = tb.iloc[0]
idle_df = idle[0] if isinstance(idle, tuple) else idle
print(json.dumps({{"work_s": work, "kernel_sum_us": float(k["dur"].sum()), "kernels": int(len(k)),
                  "busy_us": float(row["kernel_time(us)"] - row["idle_time(us)"]),
                  "idle_us": float(row["idle_time(us)"]), "window_us": float(row["kernel_time(us)"]),
                  "compute_us": float(row["compute_time(us)"]),
                  "idle_by_category_us": {{str(c): float(v) for c, v in
                                          idle_df.groupby("idle_category")["idle_time"].sum().items()}}}}))
"""

# TraceLens on a fixture: its full report (timed), then its perf models' coverage (untimed; see the docstring)
TRACELENS_COVERAGE = """
import json, math, sys, tempfile, warnings, logging, contextlib, io
sys.path.insert(0, {root!r})
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from profiler.timing import now
t0 = now()
from TraceLens.Reporting.generate_perf_report_pytorch import generate_perf_report_pytorch
with contextlib.redirect_stdout(io.StringIO()), tempfile.TemporaryDirectory() as d:
    generate_perf_report_pytorch({path!r}, output_csvs_dir=d)
work = now() - t0
from TraceLens import TreePerfAnalyzer
with contextlib.redirect_stdout(io.StringIO()):
    pa = TreePerfAnalyzer.from_file({path!r})
    names = set(pa.op_to_perf_model_class_map)
    events = [e for e in pa.tree.events if e.get("name") in names]
    df = pa.build_df_perf_metrics(events, include_kernel_details=True) if events else None
covered = set()
if df is not None and len(df):
    for _, row in df.iterrows():
        fl, mb = row.get("GFLOPS"), row.get("Data Moved (MB)")
        if isinstance(fl, float) and isinstance(mb, float) and math.isfinite(fl) and math.isfinite(mb):
            covered.update(k["gpu_op_uid"] for k in (row.get("kernel_details") or []))
gpu = [e for e in pa.tree.events if e.get("cat") in {cats!r}]
total = sum(e["dur"] for e in gpu)
cov = sum(e["dur"] for e in gpu if e.get("UID") in covered or "nccl" in e["name"].lower())
print(json.dumps({{"work_s": work, "coverage": cov / total if total else 0.0, "kernels": len(gpu),
                  "modelled_ops": 0 if df is None else len(df)}}))
"""

HTA_TIME = """
import json, logging, sys
sys.path.insert(0, {root!r})
logging.disable(logging.WARNING)
from profiler.timing import now
t0 = now()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir={dir!r})
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(visualize=False)
print(json.dumps({{"work_s": now() - t0}}))
"""

# The wrapper: a fresh process whose only child is the command, so RUSAGE_CHILDREN's peak is that command's.
WRAP = """
import resource, subprocess, sys, json
sys.path.insert(0, {root!r})
from profiler.timing import now
t0 = now()
p = subprocess.run({cmd!r}, cwd={root!r}, capture_output=True, text=True, env={env!r})
wall = now() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({{"wall_s": wall, "peak_rss": ru.ru_maxrss * 1024, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "rc": p.returncode, "stdout": p.stdout[-200000:], "stderr": p.stderr[-2000:]}}))
"""


def flow_pair(launch: dict, kernel: dict) -> list:
    """The ac2g flow events Kineto writes for one launch -> kernel (start at the launch, finish at the kernel)."""
    corr = kernel["args"]["correlation"]
    return [{"ph": "s", "id": corr, "pid": launch["pid"], "tid": launch["tid"], "ts": launch["ts"], "cat": "ac2g",
             "name": "ac2g"},
            {"ph": "f", "id": corr, "pid": kernel["pid"], "tid": kernel["tid"], "ts": kernel["ts"], "cat": "ac2g",
             "name": "ac2g", "bp": "e"}]


def _line(e: dict) -> str:
    return json.dumps(e, separators=(",", ":"))


def with_flows(src: Path, dst: Path) -> None:
    """Copy ``trace_speed.write_big``'s file (one event a line) adding distributedInfo and a flow pair per kernel."""
    launches = {}
    with open(src) as f, open(dst, "w") as out:
        head = f.readline()
        if not head.rstrip().endswith('"traceEvents": ['):
            raise ValueError(f"{src}: not a file trace_speed.write_big wrote (one event a line)")
        out.write(head.replace('"traceEvents": [', '"distributedInfo": {"backend": "nccl", "rank": 0, '
                                                   '"world_size": 1}, "traceEvents": [', 1))
        first = True
        for line in f:
            body = line.rstrip().rstrip(",")
            if not body.startswith("{"):
                continue                                  # the closing "]}"
            items = [body]
            if '"cat":"cuda_runtime"' in body:
                e = json.loads(body)
                launches[e["args"]["correlation"]] = e
            elif '"cat":"kernel"' in body:
                k = json.loads(body)
                launch = launches.pop(k["args"]["correlation"], None)
                if launch is not None:
                    items += [_line(e) for e in flow_pair(launch, k)]
            for item in items:
                out.write(("" if first else ",\n") + item)
                first = False
        out.write("\n]}\n")


def flow_share(base: dict) -> float:
    """Bytes with the flow pairs over bytes without, for one repetition of the captured events."""
    from trace_speed import gpu_like

    events = [e for e in gpu_like(base["traceEvents"]) if e.get("ph") == "X"]
    plain = sum(len(_line(e)) + 2 for e in events)
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    flows = sum(len(_line(p)) + 2 for e in events if e.get("cat") == "kernel"
                for p in flow_pair(launches[e["args"]["correlation"]], e))
    return (plain + flows) / plain


def make_trace(path: Path, mb: float) -> int:
    """A GPU-like trace of about ``mb`` MB with flows and distributedInfo (see the module docstring)."""
    from trace_speed import captured, write_big

    tmp = path.parent
    base = captured(tmp)
    plain = tmp / "plain.json"
    write_big(plain, base, mb / flow_share(base))
    with_flows(plain, path)
    plain.unlink()
    return path.stat().st_size


def run_wrapped(cmd: list, env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    out = subprocess.run([sys.executable, "-c", WRAP.format(root=str(ROOT), cmd=cmd, env=env)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def peer_missing(python: str, name: str) -> str | None:
    """None when ``name`` imports under ``python``, else the line saying how to install it."""
    if not Path(python).exists():
        return f"{name}: skipped, {python} does not exist (make a venv there, then: {INSTALL[name]})"
    p = subprocess.run([python, "-c", IMPORTS[name]], check=False, capture_output=True, text=True)
    if p.returncode:
        why = (p.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"{name}: skipped, not importable with {python} ({why}); install it: {INSTALL[name]}"
    return None


def ours(path: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "profiler.cli", "trace", str(path), "--no-report", "--json", "--out", str(out),
           "--overwrite", "--quiet"]
    r = run_wrapped(cmd, {**os.environ, "PYTHONPATH": str(ROOT)})
    if r["rc"]:
        return {**r, "error": r["stderr"].strip()[-300:]}
    rank = json.loads(r["stdout"])["ranks"][0]
    t, us = rank["time"], 1e6
    causes = {k: v * us for k, v in rank.get("idle", {}).get("by_cause_s", {}).items()}
    return {**r, "kernel_sum_us": t["kernel_sum_s"] * us, "busy_us": t["busy_s"] * us, "idle_us": t["idle_s"] * us,
            "window_us": t["window_s"] * us, "kernels": t["kernels"], "idle_by_cause_us": causes}


def peer(python: str, script: str, env: dict | None = None) -> dict:
    r = run_wrapped([python, "-c", script], env)
    if r["rc"]:
        return {**r, "error": r["stderr"].strip()[-300:]}
    return {**r, **json.loads(r["stdout"].strip().splitlines()[-1])}


def hta_dir(path: Path, d: Path) -> Path:
    """HTA reads every trace file in a folder: one link to the file, named as Kineto names a rank's trace."""
    d.mkdir(exist_ok=True)
    link = d / "rank-0.pt.trace.json"
    if not link.exists():
        link.symlink_to(path.resolve())
    return d


def _mb(b: float) -> str:
    return f"{b / 1e6:,.0f} MB"


def _num(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_num(x)}" for k, x in v.items()) + "}"
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"


def table(rows: dict) -> list:
    lines = [f"{'':<11}{'wall s':>9}{'work s':>9}{'peak RSS':>11}   ours/peer time   ours/peer memory"]
    mine = rows.get("roofline")
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"{name:<11}FAILED (exit {r['rc']}): {r['error']}")
            continue
        work = f"{r['work_s']:9.2f}" if "work_s" in r else f"{'':>9}"
        ratio = ""
        if name != "roofline" and mine and "error" not in mine:
            ratio = f"   {mine['wall_s'] / r['wall_s']:14.2f}x   {mine['peak_rss'] / r['peak_rss']:15.2f}x"
        lines.append(f"{name:<11}{r['wall_s']:9.2f}{work}{_mb(r['peak_rss']):>11}{ratio}")
    return lines


def agreement(rows: dict) -> list:
    keys = [("kernel_sum_us", "GPU kernel time sum (us)"), ("busy_us", "GPU busy time (us)"),
            ("idle_us", "GPU idle time (us)"), ("window_us", "GPU window (us)"), ("kernels", "kernels")]
    ok = {n: r for n, r in rows.items() if "error" not in r}
    names = list(ok)
    lines = [f"{'':<26}" + "".join(f"{n:>16}" for n in names) + "   peer - ours"]
    for key, label in keys:
        vals = [ok[n].get(key) for n in names]
        cells = "".join(f"{v:>16,.1f}" if isinstance(v, float) else f"{v if v is not None else '-':>16}"
                        for v in vals)
        diffs = []
        mine = ok.get("roofline", {}).get(key)
        for n in names[1:]:
            v = ok[n].get(key)
            if mine is not None and v is not None:
                rel = f" ({(v - mine) / mine:+.3%})" if mine else ""
                diff = f"{v - mine:+,}" if isinstance(v, int) and isinstance(mine, int) else f"{v - mine:+,.2f}"
                diffs.append(f"{n} {diff}{rel}")
        lines.append(f"{label:<26}{cells}   {'; '.join(diffs)}")
    for n in names:
        extra = {k: v for k, v in ok[n].items() if k in ("launcher_kernel_sum_us", "launchers", "linked_kernels",
                                                         "compute_us", "idle_by_category_us", "idle_by_cause_us")}
        if extra:
            lines.append(f"{n} also: " + ", ".join(f"{k} {_num(v)}" for k, v in extra.items()))
    return lines


def add_flows(path: Path) -> None:
    """Add Kineto's ac2g flow pair for each launch -> kernel of a fixture trace (TraceLens links only through them);
    a graph launch gets one pair per kernel it replays."""
    d = json.loads(path.read_text())
    launches = {e["args"]["correlation"]: e for e in d["traceEvents"]
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    flows = [f for e in d["traceEvents"] if e.get("cat") == "kernel"
             and e["args"].get("correlation") in launches for f in flow_pair(launches[e["args"]["correlation"]], e)]
    d["traceEvents"] += flows
    d.setdefault("distributedInfo", {"backend": "nccl", "rank": 0, "world_size": 1})
    path.write_text(json.dumps(d))


def fixtures(d: Path) -> list:
    """[(name, trace, --model, --mix, capture trace or None)]: the engine fixtures the tests write."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_trace_engines_deepseek_mla as mla
    import test_trace_engines_gpt_oss as oss
    import test_trace_engines_sglang as sgl
    import test_trace_engines_sglang_replay as sgr
    import test_trace_engines_vllm_fp8 as fp8

    out = []
    for name, mod, stem in (("vLLM FP8 Llama-3-8B mixed step", fp8, "vllm_fp8_mixed"),
                            ("vLLM gpt-oss-20b decode replay + capture", oss, "gpt_oss_replay"),
                            ("SGLang Qwen3-8B decode, eager", sgl, "sglang_qwen3_decode"),
                            ("SGLang Qwen3-8B decode, replay only", sgr, "sglang_qwen3_replay"),
                            ("DeepSeek-V3 MLA decode (1 rank of 8)", mla, "deepseek_mla_decode")):
        mod.build(d)
        cap = d / "gpt_oss_cap.json" if mod is oss else None
        for p in (d / f"{stem}.json", cap):
            if p is not None:
                add_flows(p)
        out.append((name, d / f"{stem}.json", mod.M.name, mod.MIX, cap))
    return out


def ours_coverage(path: Path, out: Path, model: str, mix: str, cap) -> dict:
    cmd = [sys.executable, "-m", "profiler.cli", "trace", str(path), "--model", model, "--mix", mix, "--json",
           "--out", str(out), "--overwrite", "--quiet"] + (["--capture-trace", str(cap)] if cap else [])
    r = run_wrapped(cmd, {**os.environ, "PYTHONPATH": str(ROOT)})
    if r["rc"]:
        return {**r, "error": r["stderr"].strip()[-300:]}
    rank = json.loads(r["stdout"])["ranks"][0]
    return {**r, "coverage": 1 - rank["uncosted_share"]}


def fixture_table(peers_python: str) -> None:
    skipped = {n: peer_missing(peers_python, n) for n in ("TraceLens", "HTA")}
    print(f"fixtures: tests/engine_traces.py's engine traces; machine load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; peers under {peers_python}")
    for n, why in skipped.items():
        if why:
            print(f"{n}: not installed ({why})")
    print("wall and CPU seconds (user + system) of each tool's whole process; cov: share of GPU time with FLOPs "
          "and bytes")
    head = f"{'trace':<42}" + "".join(f"{n + ' wall/CPU s':>22}{n + ' cov':>15}" for n in ("roofline", "TraceLens")) \
        + f"{'HTA wall/CPU s':>17}"
    print(head)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for name, path, model, mix, cap in fixtures(d):
            cells = []
            r = ours_coverage(path, d / "out", model, mix, cap)
            cells += [f"{r['wall_s']:16.2f}/{r['cpu_s']:5.2f}", f"{r['coverage']:15.1%}"] if "error" not in r else \
                [f"{'failed':>22}", f"{'-':>15}"]
            if skipped["TraceLens"] is None:
                t = peer(peers_python, TRACELENS_COVERAGE.format(root=str(ROOT), path=str(path), cats=set(GPU_CATS)))
                cells += [f"{t['wall_s']:16.2f}/{t['cpu_s']:5.2f}", f"{t['coverage']:15.1%}"] if "error" not in t \
                    else [f"{'failed':>22}", f"{'-':>15}"]
                if "error" in t:
                    print(f"  TraceLens failed on {path.name}: {t['error']}")
            else:
                cells += [f"{'not installed':>22}", f"{'-':>15}"]
            if skipped["HTA"] is None:
                h = peer(peers_python, HTA_TIME.format(root=str(ROOT), dir=str(hta_dir(path, d / f"hta_{path.stem}"))),
                         {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"})
                cells.append(f"{h['wall_s']:11.2f}/{h['cpu_s']:5.2f}" if "error" not in h else f"{'failed':>17}")
            else:
                cells.append(f"{'not installed':>17}")
            print(f"{name:<42}" + "".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", action="store_true",
                    help="the engine fixture traces: each tool's time and coverage (share of GPU time with FLOPs "
                         "and bytes)")
    ap.add_argument("--mb", type=float, default=100.0, help="generated trace size in MB (default 100)")
    ap.add_argument("--trace", type=Path, help="time this trace (.json, one rank) instead of a generated one")
    ap.add_argument("--peers-python", default=PEERS_PYTHON,
                    help=f"the interpreter with TraceLens and HTA installed (default {PEERS_PYTHON})")
    a = ap.parse_args()
    if a.fixtures:
        fixture_table(a.peers_python)
        return
    if a.trace is not None and not a.trace.is_file():
        sys.exit(f"--trace {a.trace}: no such file; pass an existing one-rank Kineto trace (.json), "
                 "or leave --trace out to generate one.")
    if a.trace is not None and not a.trace.name.endswith(".json"):
        sys.exit(f"--trace {a.trace}: not a .json file; the three readers are compared on an uncompressed "
                 "one-rank Kineto trace (.json): gunzip it first, or leave --trace out to generate one.")
    skipped = {n: peer_missing(a.peers_python, n) for n in ("TraceLens", "HTA")}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        if a.trace is None:
            path = d / "trace.json"
            size = make_trace(path, a.mb)
        else:
            path, size = a.trace.resolve(), a.trace.stat().st_size
        print(f"trace: {path if a.trace else 'generated'}, {size / 1e6:.1f} MB; machine load "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        rows = {"roofline": ours(path, d / "out")}
        if skipped["TraceLens"] is None:
            rows["TraceLens"] = peer(a.peers_python, TRACELENS.format(root=str(ROOT), path=str(path),
                                                                      cats=set(GPU_CATS)))
        if skipped["HTA"] is None:
            rows["HTA"] = peer(a.peers_python, HTA.format(root=str(ROOT), dir=str(hta_dir(path, d / "hta"))),
                               {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"})
    for line in [s for s in skipped.values() if s]:
        print(line)
    print("\n".join(table(rows)))
    print()
    print("\n".join(agreement(rows)))


if __name__ == "__main__":
    main()
