"""``run_profile``: one ``roofline profile`` as a library call (the CLI, notebooks and tests call it).

    from profiler.run import ProfileRun, default_plan, run_profile
    plan, _ = default_plan(quick=True)
    result = run_profile(ProfileRun(plan, out="roofline-out", mode="overwrite", report=False))
    print(result.table)

A run, in order (nothing is measured before every input is checked, nothing measured is lost):

1. the plan is validated (shapes, sizes against the device's memory, the interpreter's limits);
2. the result file is opened by the one writer (``roofline.writer.ResultWriter``): locked,
   refused if it holds results and the mode is "new", repaired and compared on "resume";
3. the kernels are validated against their references (``profiler.kernel_checks``; any
   failure: nothing is timed);
4. ceilings are measured (or read from the cache), the FLOP cross-check run (cached);
5. the header is written, outputs derived from an older file (report, CSV) are removed;
6. the sweep writes one line per op as it finishes; Ctrl-C raises ``Interrupted`` after the
   file is closed, with the command that resumes it;
7. the file is read back through ``roofline.analysis`` for the table, the CSV and the report.

With ``--tp N`` (and ``--ep N``) the same stages run around N ranks (``profiler.tp_run``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from roofline.errors import RooflineError
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

from . import kernel_checks
from .run import Interrupted, check_output, check_writable, command_line, quiet, remove_derived, started
from .timing import cpu_threads, now


GPU_DEFAULTS = dict(model="llama-3-8b", batches=(1, 2, 4, 8, 16, 32, 64, 128),
                    contexts=(128, 256, 512, 1024, 2048, 4096, 8192), backends=("triton", "torch"), dtype="bf16")


GPU_QUICK = dict(model="llama-3-8b", batches=(1, 16), contexts=(512, 2048), backends=("triton", "torch"), dtype="bf16")


CPU_DEFAULTS = dict(model="small", batches=(1, 4, 16), contexts=(64, 256), backends=("torch",), dtype="fp32")


CPU_QUICK = dict(model="small", batches=(1, 4), contexts=(64, 256), backends=("torch",), dtype="fp32")


BUDGET_MS = {"gpu": 50.0, "cpu": 40.0, "quick-gpu": 20.0, "quick-cpu": 25.0}


def default_plan(*, model=None, phases=("prefill", "decode"), batches=None, contexts=None, backends=None, dtype=None,
                 device=None, quick=False, budget_ms=None, flush_cache=False, weight_dtypes=None, kv_dtypes=None,
                 group_size=None, zero_point=False):
    """(SweepPlan, model name as given): this machine's defaults (a GPU's or a CPU's) for what is not given.

    ``weight_dtypes`` / ``kv_dtypes``: a dtype or a tuple of them (the activation dtype = not quantized, "int8",
    "int4"; KV "int8", "fp8"); each runs in the same file (``SweepPlan.variants``)."""
    import torch

    from roofline.models import load_model

    from .probes import llc_bytes
    from .sweep import SweepPlan

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    d = (GPU_QUICK if quick else GPU_DEFAULTS) if gpu else (CPU_QUICK if quick else CPU_DEFAULTS)
    model = model or d["model"]
    cfg = load_model(model) if isinstance(model, str) else model
    dtype = dtype or d["dtype"]
    if dtype not in ("fp32", "bf16", "fp16"):
        raise RooflineError(f"--dtype must be fp32, bf16 or fp16 for a sweep, but {dtype!r} was given.")
    budget_ms = budget_ms or BUDGET_MS[("quick-" if quick else "") + ("gpu" if gpu else "cpu")]
    as_tuple = lambda v: () if v is None else ((v,) if isinstance(v, str) else tuple(v))  # noqa: E731
    ws, kvs = as_tuple(weight_dtypes), as_tuple(kv_dtypes)
    if zero_point and "int4" not in ws:
        raise RooflineError("--zero-point goes with int4 weights (--weight-dtype int4): int8 weights are symmetric.")
    if group_size is not None and "int4" not in ws:
        raise RooflineError("--group-size goes with int4 weights (--weight-dtype int4).")
    plan = SweepPlan(model=cfg, phases=tuple(phases), batches=tuple(batches or d["batches"]),
                     contexts=tuple(contexts or d["contexts"]), backends=tuple(backends or d["backends"]),
                     dtype=dtype, device=device, budget_s=budget_ms / 1e3,
                     warmup_s=budget_ms / (4e3 if gpu else 8e3),  # a GPU also ramps its clocks
                     flush_bytes=2 * llc_bytes()[0] if flush_cache and not gpu else 0,
                     weight_dtypes=ws if ws != (dtype,) else (), kv_dtypes=kvs if kvs != (dtype,) else (),
                     group_size=group_size or 128, zero_point=bool(zero_point))
    return plan, (model if isinstance(model, str) else cfg.name)


@dataclass(frozen=True)
class ProfileRun:
    """One ``roofline profile``: the sweep plan plus what the run does around it."""

    plan: object                  # profiler.sweep.SweepPlan
    out: Path = Path("roofline-out")
    mode: str = "new"             # "new" | "resume" | "overwrite"
    threads: int | None = None    # CPU: torch threads (fixed for the run, recorded)
    quick: bool = False
    csv: bool = False
    report: bool = True
    check_kernels: bool = True
    flop_check: bool = True
    model_arg: str = ""           # how the model was named (for the resume command); default: its name
    device: object = None         # a roofline Device to classify against instead of measured ceilings
    tp: int = 1                   # tensor-parallel ranks (profiler.tp_run): per-rank shards and collectives
    ep: int = 1                   # expert-parallel ranks (1, or = tp: E / ep whole experts per rank, all-to-alls)

    def __post_init__(self):
        check_output(self)

    @property
    def path(self) -> Path:
        return self.out / "results.jsonl"

    def command(self, resume: bool = False) -> str:
        p = self.plan
        args = ["roofline", "profile", "--model", self.model_arg or p.model.name, "--phases", ",".join(p.phases),
                "--batches", ",".join(map(str, p.batches)), "--contexts", ",".join(map(str, p.contexts)),
                "--backends", ",".join(p.backends), "--dtype", p.dtype, "--device", p.device,
                "--out", str(self.out), "--budget-ms", f"{p.budget_s * 1e3:g}"]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if p.flush_bytes:
            args += ["--flush-cache"]
        if p.weight_dtypes:
            args += ["--weight-dtype", ",".join(p.weight_dtypes)]
        if p.kv_dtypes:
            args += ["--kv-dtype", ",".join(p.kv_dtypes)]
        if "int4" in p.weight_dtypes and p.group_size != 128:
            args += ["--group-size", str(p.group_size)]
        if "int4" in p.weight_dtypes and p.zero_point:
            args += ["--zero-point"]
        if self.quick:
            args += ["--quick"]
        if self.tp > 1:
            args += ["--tp", str(self.tp)]
        if self.ep > 1:
            args += ["--ep", str(self.ep)]
        if resume:
            args += ["--resume"]
        elif self.mode == "overwrite":
            args += ["--overwrite"]
        return shlex.join(args)


@dataclass
class ProfileResult:
    path: Path
    stats: object                 # profiler.sweep.SweepStats
    result_file: object           # roofline.records.ResultFile, read back
    stages: dict = field(default_factory=dict)   # seconds per stage: checks, ceilings, flop check, sweep, report
    report: dict | None = None    # reports.write_report's paths
    csv: Path | None = None
    notes: list = field(default_factory=list)
    repaired_bytes: int = 0

    @property
    def table(self) -> str:
        from .export import phase_table

        return phase_table(self.result_file)


def _settings(run: ProfileRun, threads: int) -> dict:
    extra = ({"tp": run.tp} if run.tp > 1 else {}) | ({"ep": run.ep} if run.ep > 1 else {})
    return {**run.plan.settings(), "threads": threads, "quick": run.quick, "budget_ms": run.plan.budget_s * 1e3,
            **extra}


def run_profile(run: ProfileRun, *, say=quiet, progress=None, probe=None, make_runners=None) -> ProfileResult:
    """Validate, measure the ceilings, sweep, write the result file and (optionally) its report.

    ``say(msg)`` receives notes (stderr in the CLI); ``progress(advance, description)`` each op;
    ``probe``/``make_runners`` are injectable for tests. Raises RooflineError for bad input
    (before anything is measured) and ``Interrupted`` on Ctrl-C (after the file is closed).
    ``run.tp`` > 1 runs the tensor-parallel sweep (``profiler.tp_run``): same rules, N ranks.
    """
    if run.tp != 1:
        from .tp_run import run_profile_tp

        return run_profile_tp(run, say=say, progress=progress, make_runners=make_runners)

    from . import probes
    from .sweep import run_sweep

    plan = run.plan
    gpu = plan.device.startswith("cuda")
    check_inputs(run, say)
    if "triton" in plan.backends and not gpu:
        say("note: triton on a CPU runs in the Triton interpreter: its times measure the interpreter, not a kernel.")
    stages: dict = {}
    writer = open_writer(run, say)
    own_probe = probe is None
    stats = None
    try:
        with cpu_threads(run.threads if not gpu else None) as n_threads:
            writer.check(early_header(run, n_threads))   # a resume that cannot match fails before anything runs
            probe = probe or probes.open_probe(plan.device)
            if probe.note:
                say(f"note: {probe.note}")
            check_kernels(run, say, stages)
            header = _profile_header(run, probe, n_threads, say, stages)
            writer.begin(header)
            remove_derived(run.out)
            if writer.done:
                say(f"resuming: {len(writer.done)} points already in {run.path}")
            stats = run_sweep(plan, writer, probe=probe, device_name=header.device.name, progress=progress,
                              make_runners=make_runners)
            stages["sweep"] = stats.wall_s
    except KeyboardInterrupt:
        writer.close()
        raise Interrupted(run.path, len(writer.done), run.command(resume=True)) from None
    finally:
        writer.close()
        if own_probe and probe is not None:
            probe.close()
    rf = read_results(run.path)
    result = ProfileResult(run.path, stats, rf, stages, repaired_bytes=writer.repaired_bytes)
    _finish_profile(run, result, say)
    return result


def check_inputs(run: ProfileRun, say) -> None:
    """Everything checked before a file is touched: ``check_plan``, then ``check_folder``; the whole model's
    fit is said (``capacity_note``)."""
    check_plan(run)
    check_folder(run, say)
    note = capacity_note(run.plan)
    if note:
        say(note)


def capacity_note(plan) -> str:
    """Whether the whole model fits this device at the plan's largest batch and context (``roofline.capacity``);
    the sweep times one layer at a time, so it runs either way: a model that does not fit is said, not refused."""
    from types import SimpleNamespace

    from roofline.capacity import capacity

    from .sweep import device_memory_bytes

    have = device_memory_bytes(plan.device)
    if not have:
        return ""
    cap = capacity(plan.model, SimpleNamespace(name=plan.device, memory_bytes=have), max(plan.batches),
                   max(plan.contexts), act_dtype=plan.dtype, weight_dtype=plan.dtype, kv_dtype=plan.dtype)
    if cap.fits:
        return ""
    return (f"note: {cap.sentence} This sweep times one layer at a time and runs anyway; serving the whole model "
            "needs what the sentence says.")


def check_plan(run: ProfileRun) -> None:
    """The device is there and the plan can run on it (one-line errors)."""
    import torch

    plan = run.plan
    if plan.device.startswith("cuda") and not torch.cuda.is_available():
        raise RooflineError(f"--device {plan.device}: no CUDA GPU is visible to torch here; use --device cpu.")
    plan.validate()


def check_folder(run: ProfileRun, say) -> None:
    """The output folder can be written; the model's notes are said."""
    check_writable(run.out)
    for n in run.plan.model.notes:
        say(f"note: {n}")


def open_writer(run: ProfileRun, say) -> ResultWriter:
    """The one writer of ``run.path`` (locked; refused, repaired or truncated by ``run.mode``)."""
    writer = ResultWriter(run.path, mode=run.mode)
    if writer.repaired_bytes:
        say(f"note: the last line of {run.path} was cut off ({writer.repaired_bytes} bytes, an interrupted "
            "write): it was removed before resuming.")
    return writer


def early_header(run: ProfileRun, n_threads: int) -> RunHeader:
    """What a resume is compared against before any work: device name, model, dtype, settings."""
    from .ceilings import device_name

    return RunHeader(device=_named(device_name(run.plan.device)), model=run.plan.model, dtype=run.plan.dtype,
                     settings=_settings(run, n_threads))


def check_kernels(run: ProfileRun, say, stages: dict) -> None:
    """Validate the kernels (``profiler.kernel_checks``) unless the run says not to; timed in ``stages``."""
    plan = run.plan
    if not run.check_kernels:
        return
    say(f"validating kernels ({', '.join(plan.backends)}, {plan.dtype}) ...")
    t = now()
    kernel_checks.validate_kernels(plan.backends, plan.dtype, plan.device,
                                   **({"quant": True} if plan.quantized else {}))
    stages["checks"] = now() - t


def _named(name: str):
    from roofline.devices import Device

    return Device(key="x", name=name, kind="cpu")


def _profile_header(run: ProfileRun, probe, n_threads, say, stages) -> RunHeader:
    from . import probes
    from .ceilings import CPU_DTYPES, GPU_DTYPES, get_ceilings
    from .flopcheck import cached_flop_check

    plan = run.plan
    gpu = plan.device.startswith("cuda")
    if run.device is not None:
        dev, sheet, details = run.device, None, {"note": "ceilings given by the caller, not measured"}
    else:
        wanted = tuple(dict.fromkeys((GPU_DTYPES if gpu else CPU_DTYPES) + (plan.dtype,)))
        say("ceilings: from the cache, or measured now ...")
        t = now()
        c = get_ceilings(plan.device, dtypes=wanted, quick=run.quick)
        stages["ceilings"] = now() - t
        dev, sheet, details = c.device, c.datasheet, c.details
    fc = {}
    if run.flop_check:
        t = now()
        try:
            fc = cached_flop_check(plan.model, dtype=plan.dtype, device=plan.device, prompt=min(plan.contexts))
        except Exception as e:  # noqa: BLE001 - a cross-check must never stop a sweep; say why it is missing
            fc = {"error": f"{type(e).__name__}: {e}"}
            say(f"note: FLOP cross-check failed ({fc['error']}); continuing without it.")
        stages["flop check"] = now() - t
    host = {"probe": probe.kind, "static": probe.static(), "state": probe.sample()}
    if gpu:
        host["cpu"] = probes.cpu_info()
    return RunHeader(device=dev, datasheet=sheet, ceilings=details, model=plan.model, kind="profile",
                     dtype=plan.dtype, settings=_settings(run, n_threads), versions=probes.versions(),
                     git_sha=probes.git_sha(), command=command_line(run.command(resume=run.mode == "resume")),
                     started=started(), host=host, flop_check=fc)


def _finish_profile(run: ProfileRun, result: ProfileResult, say) -> None:
    rf = result.result_file
    result.notes += list(rf.notices)
    if run.csv:
        from .export import write_csv

        write_csv(rf, run.out / "results.csv")
        result.csv = run.out / "results.csv"
    if run.report:
        from reports import write_report

        t = now()
        try:
            result.report = write_report([rf], run.out)
        except Exception as e:  # noqa: BLE001 - the measurements are on disk; say what failed, keep going
            say(f"report failed ({type(e).__name__}: {e}); the results are intact: `roofline report {result.path}` "
                "retries it.")
        result.stages["report"] = now() - t
    from roofline.analysis import analyze

    a = analyze(rf)
    warm_above = [r for r in a.results if r.m.l2_policy == "warm" and r.above_roof]
    if warm_above:
        result.notes.append(f"{len(warm_above)} ops ran above the memory roof with warm caches: their working set "
                            "fits in this CPU's last-level cache, so they never touched DRAM. --flush-cache times "
                            "them cold.")
    busy = sum("host-busy" in r.m.flags for r in a.results)
    if busy:
        result.notes.append(f"{busy} of {len(a.results)} points were measured while other processes wanted the "
                            "CPUs (flag host-busy): their times include waiting for a core. On a shared machine, "
                            f"--threads {max(1, (os.cpu_count() or 2) - 1)} keeps OpenMP from waiting on a busy core.")
