"""Nsight Compute counters -> a result file of kind "counters" (what ``roofline counters`` and
``roofline profile --counters`` run).

    from profiler.counters_run import CountersRun, run_counters
    r = run_counters(CountersRun("ncu.csv", join="roofline-out/results.jsonl", out="roofline-counters"))

Reading and joining are pure (``roofline.counters``, ``roofline.verdicts.counters_join``); this module picks the
device (the file's device name in the catalogue, else ``--device``; Nsight Compute's own DRAM peak when the
file has it), writes the file with ``ResultWriter`` and renders the report.

``profile_counters`` (``roofline profile --counters``) needs ``ncu`` on PATH: without it, it says how to install
Nsight Compute and stops (and names the PyTorch profiler's CUPTI metrics as the alternative where torch sees a
GPU; nothing is collected in its place). With it, it writes the sweep's triton points to OUT/manifest.json and
runs ``ncu_command``: one process, ``--replay-mode kernel`` (each kernel replayed once per metric pass, memory
saved and restored between passes), ``--cache-control all`` (caches flushed before each pass) and
``--profile-from-start off``: the child (``python -m profiler.counters_run --child MANIFEST``) warms each point up
outside the profiled range and launches it once inside ``cudaProfilerStart``/``Stop``, so ncu sees one call per
point, in the manifest's order. The raw-page CSV it prints is OUT/ncu.csv, joined to the manifest.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from roofline import units as U
from roofline.analysis import analyze
from roofline.counters import METRICS, PROGRESS_ROWS, read_counters
from roofline.verdicts.counters_join import COUNTERS, counter_measurements, join, ratio_line
from roofline.devices import find_device
from roofline.errors import RooflineError
from roofline.models import ModelConfig
from roofline.records import RunHeader, WorkloadPoint, read_results
from roofline.writer import ResultWriter

from reports import write_report

from . import probes
from .run import started
from .timing import now
from .sweep import formula_cost, point_for

REPLAY_MODE = "kernel"
NCU_INSTALL = ("Nsight Compute's `ncu` is not on PATH: install it (it ships with the CUDA toolkit as "
               "/usr/local/cuda/bin/ncu, or `apt install nsight-compute`, or NVIDIA's download page) and put its folder "
               "on PATH, then run `roofline profile --counters` again")


@dataclass
class CountersRun:
    csv: str                        # an ncu --csv export (either layout)
    out: str = "roofline-counters"
    join: str | None = None         # a results.jsonl or manifest.json whose points were launched, in order
    device: object = None           # a Device that overrides the file's device name
    mode: str = "new"
    report: bool = True
    command: str = ""


@dataclass
class CountersResult:
    path: Path
    header: RunHeader
    measurements: list
    notes: list = field(default_factory=list)
    report: dict | None = None

    def text(self) -> str:
        h = self.header
        lines = [f"device: {h.device.name} ({h.settings['device_from']}); {h.settings['launches']} launch(es), "
                 f"{h.settings['joined']} joined to model points"]
        lines.append(f"{'op / kernel':<40}{'time':>10}{'DRAM':>11}{'L2':>11}{'L1':>11}{'FLOPs':>12}{'FLOP/B':>8}")
        for m in self.measurements:
            lv = m.config.get("levels", {})
            name = (f"{m.point.op} {m.point.phase} b{m.point.batch} ctx{m.point.context}" if m.point.model
                    else f"{m.point.op} (unjoined, {len(m.config['launch_ids'])} launch(es))")
            cost = m.point.cost
            lines.append(f"{name[:39]:<40}{U.seconds(m.instance_s) if m.ok else '-':>10}"
                         + "".join(f"{U.nbytes(lv[k]) if k in lv else 'missing':>11}" for k in ("DRAM", "L2", "L1"))
                         + f"{U.flops(cost.flops) if 'uncosted' not in m.flags else 'missing':>12}"
                         + f"{cost.intensity if cost.bytes else float('nan'):>8.1f}")
        joined = [ratio_line(m) for m in self.measurements]
        lines += [f"measured vs model: {x}" for x in joined if x]
        methods = sorted({m.config.get("tensor_method") for m in self.measurements} - {""})
        lines += [f"tensor FLOPs: {x}" for x in methods]
        lines.append(f"results: {self.path}")
        if self.report:
            lines.append(f"report: {self.report['html']}")
        return "\n".join(lines)


def points_from(path) -> list:
    """The workload points launched, in order: a manifest.json ({"points": [...]}) or a result file's triton
    measurements (file order)."""
    p = Path(path)
    if p.suffix == ".json":
        try:
            d = json.loads(p.read_text())
            return [WorkloadPoint.from_dict(x) for x in d["points"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RooflineError(f"{p}: not a counters manifest ({type(e).__name__}); give the manifest.json "
                                "`roofline profile --counters` wrote, or a results.jsonl.") from None
    rf = read_results(p)
    return [m.point for m in rf.measurements if m.point.backend == "triton" and m.point.op != "layer"]


def _device(run: CountersRun, cf) -> tuple:
    if run.device is not None:
        return run.device, run.device if run.device.source == "datasheet" else None, f"{run.device.name} as given"
    if not cf.device:
        raise RooflineError(f"{cf.path} names no device (no 'Device' column): pass --device (h100, a100, ...).")
    try:
        sheet = find_device(cf.device)
    except RooflineError:
        raise RooflineError(f"{cf.path} ran on {cf.device!r}, which the device catalogue does not know: pass --device "
                            "(a catalogue name) or --device-file.") from None
    how = f"the file's device {cf.device!r} -> {sheet.name}"
    if cf.peaks.get("bandwidth"):
        dev = sheet.with_ceilings(bandwidth=cf.peaks["bandwidth"], source="ncu",
                                  provenance="DRAM bandwidth: Nsight Compute's dram__bytes.sum.peak_sustained x "
                                             "dram__cycles_elapsed.avg.per_second; peaks: datasheet")
        how += f"; DRAM peak {U.bandwidth(cf.peaks['bandwidth'])} from the file"
        return dev, sheet, how
    return sheet, sheet, how


def run_counters(run: CountersRun, say=lambda m: None, clock=None) -> CountersResult:
    clock = clock or now
    t0 = clock()

    def progress(done: int, total: int) -> None:
        spent = clock() - t0
        left = spent / done * (total - done) if done else 0.0
        say(f"reading {run.csv}: {done:,} of {total:,} rows in {spent:.0f} s, about {left:.0f} s left")

    cf = read_counters(run.csv, progress)
    if len(cf.launches) >= PROGRESS_ROWS:
        say(f"read {len(cf.launches):,} launches in {clock() - t0:.0f} s; joining them and writing the results ...")
    notes = list(cf.notices)
    points = points_from(run.join) if run.join else []
    joined, jn = join(cf.launches, points)
    notes += jn
    dev, sheet, how = _device(run, cf)
    dtype = next((p.dtype for p in points), "bf16")
    ms = counter_measurements(joined, dev.name, dtype)
    settings = {"counters": str(run.csv), "layout": cf.layout, "cc": cf.cc, "launches": len(cf.launches),
                "joined": sum(1 for j in joined if j.point is not None), "join": str(run.join or ""),
                "device_from": how, "replay_mode": REPLAY_MODE, "notices": notes}
    header = RunHeader(device=dev, datasheet=sheet, kind=COUNTERS, dtype=dtype, settings=settings,
                       versions=probes.light_versions(), git_sha=probes.git_sha(), command=run.command,
                       started=started())
    path = Path(run.out) / "results.jsonl"
    with ResultWriter(path, mode=run.mode) as w:
        w.begin(header)
        for m in ms:
            w.write(m)
    rf = read_results(path)
    report = None
    if run.report and any(m.ok and "uncosted" not in m.flags for m in ms):
        analyze(rf)
        report = write_report([rf], Path(run.out))
    return CountersResult(path, header, rf.measurements, notes, report)


# ---------------------------------------------------------------- roofline profile --counters

def cupti_note() -> str:
    """The alternative where torch sees a GPU, said and not run."""
    try:
        import torch

        if torch.cuda.is_available():
            return ("; without ncu, the PyTorch profiler can collect CUPTI metrics on this GPU "
                    "(torch.profiler._ExperimentalConfig(profiler_metrics=[...])), which this toolkit does not read")
    except ImportError:  # pragma: no cover
        pass
    return ""


def ncu_command(ncu: str, manifest: Path) -> list:
    """The ncu command line: the metrics of ``roofline.counters.METRICS``, raw page CSV, kernel replay."""
    return [ncu, "--csv", "--page", "raw", "--metrics", ",".join(METRICS), "--replay-mode", REPLAY_MODE,
            "--cache-control", "all", "--profile-from-start", "off", "--target-processes", "all",
            sys.executable, "-m", "profiler.counters_run", "--child", str(manifest)]


def profile_counters(plan, out: str, mode: str = "new", say=lambda m: None, report: bool = True,
                     command: str = "") -> CountersResult:
    """``roofline profile --counters``: the plan's triton points under ncu, joined (module docstring)."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise RooflineError(NCU_INSTALL + cupti_note() + ".")
    points = []
    for phase, backend, batch, context in plan.combos():
        if backend != "triton":
            continue
        for n in plan.op_names:
            if n == "layer":
                continue
            cost, cdt = formula_cost(plan, n, phase, batch, context)
            points.append(point_for(plan, n, phase, backend, batch, context, cost, cdt))
    if not points:
        raise RooflineError("--counters profiles our own Triton kernels: add triton to --backends.")
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    manifest = outp / "manifest.json"
    manifest.write_text(json.dumps({"model": plan.model.to_dict(), "device": plan.device,
                                    "points": [p.to_dict() for p in points]}))
    cmd = ncu_command(ncu, manifest)
    say(f"running {len(points)} point(s) under Nsight Compute (replay mode {REPLAY_MODE}): {' '.join(cmd[:4])} ...")
    csv_path = outp / "ncu.csv"
    with open(csv_path, "w") as f:
        status = subprocess.call(cmd, stdout=f)
    if status != 0:
        raise RooflineError(f"ncu exited with status {status}; its output is in {csv_path} (ncu needs permission to "
                            "read GPU counters: run as root or set NVreg_RestrictProfilingToAdminUsers=0).")
    return run_counters(CountersRun(str(csv_path), out=out, join=str(manifest), mode=mode, report=report,
                                    command=command), say)


def child(manifest: str) -> None:  # pragma: no cover - runs under ncu on a GPU
    """Launch each manifest point once inside a profiled range, after warm-up (autotuning) outside it."""
    import torch

    from kernels.runners import make_runners

    d = json.loads(Path(manifest).read_text())
    cfg = ModelConfig.from_dict(d["model"])
    cudart = torch.cuda.cudart()
    for p in (WorkloadPoint.from_dict(x) for x in d["points"]):
        r = make_runners(cfg, p.phase, p.batch, p.context, dtype=p.dtype, backend="triton", device=d["device"],
                         seed=0, ops=[p.op])[0]
        for _ in range(3):
            r.fn()
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()
        r.fn()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
