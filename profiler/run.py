"""Orchestration in the library: ``run_profile`` and ``run_latency``, which the CLI, notebooks and tests call.

    from profiler.run import ProfileRun, run_profile
    from profiler.sweep import SweepPlan
    from roofline.models import load_model
    plan = SweepPlan(model=load_model("tiny"), phases=("decode",), batches=(1,), contexts=(32,))
    result = run_profile(ProfileRun(plan, out="roofline-out", mode="overwrite", report=False))
    print(result.table)

A run, in order (nothing is measured before every input is checked, nothing measured is lost):

1. the plan is validated (shapes, sizes against the device's memory, the interpreter's limits);
2. the result file is opened by the one writer (``roofline.writer.ResultWriter``): locked,
   refused if it holds results and the mode is "new", repaired and compared on "resume";
3. the kernels are validated against their references (any failure: nothing is timed);
4. ceilings are measured (or read from the cache), the FLOP cross-check run (cached);
5. the header is written, outputs derived from an older file (report, CSV) are removed;
6. the sweep writes one line per op as it finishes; Ctrl-C raises ``Interrupted`` after the
   file is closed, with the command that resumes it;
7. the file is read back through ``roofline.analysis`` for the table, the CSV and the report.

``run_latency`` follows the same rules for a serving run: each request is written the moment
it finishes; a resumed run skips the configurations already complete in the file. Those rules
live in ``run_configs``, which ``profiler.endpoint_run.run_endpoint`` (``roofline latency
--endpoint``) shares. Secrets (``--api-key``) never reach a recorded command line (``redact``).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from roofline.errors import RooflineError
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

from .timing import cpu_threads, now

DERIVED = ("report.html", "report.md", "results.csv", "figures")   # made from results.jsonl: stale when it changes
MODES = ("new", "resume", "overwrite")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the file is closed and holds every finished record; ``resume`` continues it."""

    def __init__(self, path: Path, kept: int, resume: str, what: str = "points"):
        super().__init__(f"interrupted: {kept} {what} are kept in {path}")
        self.path, self.kept, self.resume, self.what = path, kept, resume, what

    @property
    def message(self) -> str:
        return f"interrupted: {self.kept} {self.what} are kept in {self.path}. Resume with:\n  {self.resume}"


def quiet(msg: str) -> None:
    """The default ``say``: notes go nowhere."""


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


SECRET_OPTIONS = ("--api-key",)   # their values never reach a result file or a printed command


def redact(args) -> list:
    """``args`` with the value of every ``SECRET_OPTIONS`` option replaced by ``***``."""
    out, hide = [], False
    for a in args:
        if hide:
            out.append("***")
            hide = False
        elif a in SECRET_OPTIONS:
            out.append(a)
            hide = True
        elif any(a.startswith(o + "=") for o in SECRET_OPTIONS):
            out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(a)
    return out


def command_line(equivalent: str) -> str:
    """The one recorded command line: as typed when run as ``roofline`` (secrets redacted), else the equivalent."""
    if sys.argv and Path(sys.argv[0]).name == "roofline":
        return shlex.join(["roofline", *redact(sys.argv[1:])])
    return equivalent


def started() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_writable(out: Path) -> None:
    """RooflineError unless ``out`` is a folder this process can create files in (checked before any work)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".roofline-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RooflineError(f"--out {out}: the output folder cannot be written ({e.strerror or e}); give a folder "
                            "you can write to.") from None


def remove_derived(out: Path, names=DERIVED) -> None:
    """Delete outputs made from an older result file (a report, a CSV): they would describe other data."""
    import shutil

    for n in names:
        p = out / n
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        except OSError as e:
            raise RooflineError(f"cannot remove the stale {p} ({e.strerror or e}); remove it by hand.") from None


def _mode(resume: bool, overwrite: bool) -> str:
    if resume and overwrite:
        raise RooflineError("--resume and --overwrite contradict each other: give one of them.")
    return "resume" if resume else "overwrite" if overwrite else "new"


# ================================================================ profile

GPU_DEFAULTS = dict(model="llama-3-8b", batches=(1, 2, 4, 8, 16, 32, 64, 128),
                    contexts=(128, 256, 512, 1024, 2048, 4096, 8192), backends=("triton", "torch"), dtype="bf16")
GPU_QUICK = dict(model="llama-3-8b", batches=(1, 16), contexts=(512, 2048), backends=("triton", "torch"), dtype="bf16")
CPU_DEFAULTS = dict(model="small", batches=(1, 4, 16), contexts=(64, 256), backends=("torch",), dtype="fp32")
CPU_QUICK = dict(model="small", batches=(1, 4), contexts=(64, 256), backends=("torch",), dtype="fp32")
BUDGET_MS = {"gpu": 50.0, "cpu": 40.0, "quick-gpu": 20.0, "quick-cpu": 25.0}


def default_plan(*, model=None, phases=("prefill", "decode"), batches=None, contexts=None, backends=None, dtype=None,
                 device=None, quick=False, budget_ms=None, flush_cache=False):
    """(SweepPlan, model name as given): this machine's defaults (a GPU's or a CPU's) for what is not given."""
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
    plan = SweepPlan(model=cfg, phases=tuple(phases), batches=tuple(batches or d["batches"]),
                     contexts=tuple(contexts or d["contexts"]), backends=tuple(backends or d["backends"]),
                     dtype=dtype, device=device, budget_s=budget_ms / 1e3,
                     warmup_s=budget_ms / (4e3 if gpu else 8e3),  # a GPU also ramps its clocks
                     flush_bytes=2 * llc_bytes()[0] if flush_cache and not gpu else 0)
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

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        if self.mode not in MODES:
            raise RooflineError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}.")

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
        if self.quick:
            args += ["--quick"]
        if self.tp > 1:
            args += ["--tp", str(self.tp)]
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


def validate_kernels(backends, dtype, device="cpu") -> list:
    """Run kernels.check quickly for each backend; refuse (RooflineError) if any check fails.

    A pass is remembered (beside the ceilings) for the exact kernel sources, software versions,
    device and dtype: the checks are deterministic (seeded inputs), so the same code on the same
    box passes again. A failure is never cached, and any change to ``kernels/`` re-runs them.
    """
    from kernels.check import run_checks

    results, failed = [], []
    for be in backends:
        key = _check_key(be, dtype, device)
        if _check_cached(key):
            continue
        rs = run_checks(backend=be, dtype=dtype, device=device, quick=True)
        results += [(be, r) for r in rs]
        bad = [r for r in rs if not r.passed]
        failed += [f"{be} {r.name} (max rel err {r.max_rel_err:.3g} > tol {r.tol:.3g}"
                   + (f": {r.detail}" if r.detail else "") + ")" for r in bad]
        if not bad:
            _check_store(key, rs)
    if failed:
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        raise RooflineError(f"kernel validation failed, so nothing was timed: {'; '.join(failed[:3])}{more}. "
                            f"Run `roofline check --dtype {dtype}` for details.")
    return results


def _check_key(backend: str, dtype: str, device: str) -> dict:
    import hashlib

    import kernels

    from . import probes
    from .ceilings import device_name

    src = hashlib.sha1()
    for f in sorted(Path(kernels.__file__).parent.glob("*.py")):
        src.update(f.name.encode() + f.read_bytes())
    return {"kernels": src.hexdigest(), "versions": probes.versions(), "device": device_name(device),
            "backend": backend, "dtype": dtype, "method": 1}


def _check_path(key: dict) -> Path:
    import hashlib

    from .ceilings import cache_dir

    return cache_dir() / f"kernelcheck-{hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"


def _check_cached(key: dict) -> bool:
    try:
        return json.loads(_check_path(key).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


def _check_store(key: dict, results) -> None:
    try:
        p = _check_path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "passed": [[r.name, r.max_rel_err, r.tol] for r in results]},
                                  default=str))
        tmp.replace(p)
    except OSError:
        pass  # an unwritable cache only costs the checks again next time


def _settings(run: ProfileRun, threads: int) -> dict:
    extra = {"tp": run.tp} if run.tp > 1 else {}
    return {**run.plan.settings(), "threads": threads, "quick": run.quick, "budget_ms": run.plan.budget_s * 1e3,
            **extra}


def run_profile(run: ProfileRun, *, say=quiet, progress=None, probe=None, make_runners=None) -> ProfileResult:
    """Validate, measure the ceilings, sweep, write the result file and (optionally) its report.

    ``say(msg)`` receives notes (stderr in the CLI); ``progress(advance, description)`` each op;
    ``probe``/``make_runners`` are injectable for tests. Raises RooflineError for bad input
    (before anything is measured) and ``Interrupted`` on Ctrl-C (after the file is closed).
    ``run.tp`` > 1 runs the tensor-parallel sweep (``profiler.tp_run``): same rules, N ranks.
    """
    import torch

    if run.tp != 1:
        from .tp_run import run_profile_tp

        return run_profile_tp(run, say=say, progress=progress, make_runners=make_runners)

    from . import probes
    from .ceilings import device_name
    from .sweep import run_sweep

    plan = run.plan
    gpu = plan.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise RooflineError(f"--device {plan.device}: no CUDA GPU is visible to torch here; use --device cpu.")
    plan.validate()
    check_writable(run.out)
    stages: dict = {}
    if "triton" in plan.backends and not gpu:
        say("note: triton on a CPU runs in the Triton interpreter: its times measure the interpreter, not a kernel.")
    for n in plan.model.notes:
        say(f"note: {n}")
    writer = ResultWriter(run.path, mode=run.mode)
    own_probe = probe is None
    stats = None
    try:
        if writer.repaired_bytes:
            say(f"note: the last line of {run.path} was cut off ({writer.repaired_bytes} bytes, an interrupted "
                "write): it was removed before resuming.")
        with cpu_threads(run.threads if not gpu else None) as n_threads:
            dev_name = device_name(plan.device)
            early = RunHeader(device=_named(dev_name), model=plan.model, dtype=plan.dtype,
                              settings=_settings(run, n_threads))
            writer.check(early)          # a resume that cannot match fails before anything runs
            probe = probe or probes.open_probe(plan.device)
            if probe.note:
                say(f"note: {probe.note}")
            if run.check_kernels:
                say(f"validating kernels ({', '.join(plan.backends)}, {plan.dtype}) ...")
                t = now()
                validate_kernels(plan.backends, plan.dtype, plan.device)
                stages["checks"] = now() - t
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


# ================================================================ latency

@dataclass(frozen=True)
class LatencyRun:
    """One ``roofline latency``: the model, the requests, the configurations, where it goes."""

    model: object                 # roofline.models.ModelConfig
    backend: str = "torch"
    dtype: str = "fp32"
    device: str = "cpu"           # torch device
    prompt_tokens: int = 256
    output_tokens: int = 32
    requests: int = 8
    rate: float = 4.0
    arrival: str = "poisson"
    seed: int = 0
    budgets: tuple = (64,)        # token budget per step; None = whole prompts
    shared_prefix: int = 0
    prefix_cache: bool = True
    block_size: int = 16
    max_slots: int = 8
    threads: int | None = None
    slo: dict = field(default_factory=dict)   # seconds
    out: Path = Path("roofline-out")
    mode: str = "new"
    model_arg: str = ""

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        if self.mode not in MODES:
            raise RooflineError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}.")

    @property
    def path(self) -> Path:
        return self.out / "latency.jsonl"

    @property
    def configs(self) -> list:
        """(budget, prefix cache, label): with a shared prefix and the cache on, a no-reuse baseline runs too."""
        caches = [False, True] if (self.prefix_cache and self.shared_prefix >= self.block_size) else [self.prefix_cache]
        return [(b, c, config_label(b, c)) for b in self.budgets for c in caches]

    def settings(self, threads: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "requests": self.requests,
                "rate": self.rate, "arrival": self.arrival, "seed": self.seed, "chunk_budgets": list(self.budgets),
                "shared_prefix": self.shared_prefix, "block_size": self.block_size, "max_slots": self.max_slots,
                "backend": self.backend, "torch_device": self.device, "threads": threads, "slo": dict(self.slo),
                "timestamps": "profiler.timing.timestamp after a device sync; seconds since the loop started; "
                              "arrival = scheduled offset"}

    def command(self, resume: bool = False) -> str:
        args = ["roofline", "latency", "--model", self.model_arg or self.model.name, "--backend", self.backend,
                "--dtype", self.dtype, "--device", self.device, "--prompt-tokens", str(self.prompt_tokens),
                "--output-tokens", str(self.output_tokens), "--requests", str(self.requests),
                "--rate", f"{self.rate:g}", "--arrival", self.arrival, "--seed", str(self.seed),
                "--sweep-chunks", ",".join("none" if b is None else str(b) for b in self.budgets),
                "--shared-prefix", str(self.shared_prefix),
                "--prefix-cache" if self.prefix_cache else "--no-prefix-cache", "--block-size", str(self.block_size),
                "--max-slots", str(self.max_slots), "--out", str(self.out)]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if self.slo:
            from roofline.latency import format_slo

            args += ["--slo", format_slo(self.slo)]
        args += ["--resume"] if resume else (["--overwrite"] if self.mode == "overwrite" else [])
        return shlex.join(args)


def config_label(budget, cache: bool) -> str:
    return f"chunk={budget if budget else 'none'},prefix-cache={'on' if cache else 'off'}"


@dataclass
class LatencyResult:
    path: Path
    summaries: list               # LatencySummary per configuration run now, in order
    skipped: list = field(default_factory=list)   # configurations already complete in the file (resume)
    result_file: object = None

    def to_json(self) -> dict:
        from roofline.latency import FORMULAS

        formulas = self.summaries[0].formulas if self.summaries else FORMULAS
        return {"file": str(self.path), "formulas": list(formulas), "summaries": [s.to_dict() for s in self.summaries],
                "skipped": self.skipped}


def _cpu_threads_default(device: str, threads: int | None) -> int | None:
    """On a CPU, one thread fewer than the cores: torch's OpenMP threads spin-wait, and with every
    core busy one other process stretches each step many times over (3 s -> 25 s on 2 cores)."""
    if threads is None and device == "cpu":
        return max(1, (os.cpu_count() or 2) - 1)
    return threads


def _latency_device_header(torch_device: str):
    """The device as `roofline profile` records it: the catalogue entry for a known GPU, else its name."""
    from roofline.devices import Device, cpu_device, find_device

    from .ceilings import device_name

    name = device_name(torch_device)
    if not torch_device.startswith("cuda"):
        return cpu_device(name=name)
    try:
        return find_device(name)
    except RooflineError:
        return Device(key="gpu", name=name, kind="gpu", source="unknown", provenance="not in the catalogue")


def run_latency(run: LatencyRun, *, say=quiet) -> LatencyResult:
    """Serve ``run.requests`` requests per configuration; write each request as it finishes."""
    import torch

    if run.device.startswith("cuda") and not torch.cuda.is_available():
        raise RooflineError(f"--device {run.device}: no CUDA GPU is visible to torch here; use --device cpu.")
    check_writable(run.out)
    for n in run.model.notes:
        say(f"note: {n}")
    with cpu_threads(_cpu_threads_default(run.device, run.threads)) as n_threads:
        from roofline.latency import arrival_times, summarize

        from . import probes
        from .serving import RequestSpec, serve
        from .tokenizer import make_prompt

        header = RunHeader(device=_latency_device_header(run.device), model=run.model, kind="latency",
                           dtype=run.dtype, settings=run.settings(n_threads), versions=probes.versions(),
                           git_sha=probes.git_sha(), command=command_line(run.command(run.mode == "resume")),
                           started=started())
        specs = [RequestSpec(i, a, make_prompt(run.prompt_tokens, seed=run.seed * 1000 + i,
                                               shared_prefix=run.shared_prefix), run.output_tokens)
                 for i, a in enumerate(arrival_times(run.requests, run.rate, run.arrival, run.seed))]
        configs = {label: (budget, cache) for budget, cache, label in run.configs}
        model = []

        def prepare(todo):
            model.append(_build_model(run) if todo else None)

        def one(label, sink):
            budget, cache = configs[label]
            say(f"running {label}: {run.requests} requests, {run.model.name} {run.backend} {run.dtype} on "
                f"{run.device}")
            m = model[0]
            for s in range(run.max_slots):
                m.reset(s)
            result = serve(m, specs, chunk_budget=budget, prefix_cache=cache, block_size=run.block_size,
                           config=label, on_finish=sink.request)
            for st in result.steps:
                sink.record({"type": "latency-step", "config": label, **st})
            return summarize(result.timelines, run.slo, label, {"chunk_budget": budget, "prefix_cache": cache,
                                                                "block_size": run.block_size})

        return run_configs(run.path, run.mode, header, list(configs), one, say=say,
                           resume=lambda: run.command(resume=True), prepare=prepare)


class ConfigSink:
    """What a configuration's runner writes through: ``request(timeline)`` the moment a request finishes,
    ``record(dict)`` for any other line; both stamped with the configuration's attempt number."""

    def __init__(self, writer, attempt: int, counter: list):
        self.writer, self.attempt, self._n = writer, attempt, counter

    def request(self, t) -> None:
        self.writer.write(replace(t, attempt=self.attempt))
        self._n[0] += 1

    def record(self, d: dict) -> None:
        self.writer.write({**d, "attempt": self.attempt})


def run_configs(path: Path, mode: str, header: RunHeader, labels: list, run_one, *, say=quiet, resume,
                prepare=None) -> LatencyResult:
    """The part every latency run shares (in-process loop, endpoint client): one file, resumed by configuration.

    Opens ``path`` with the one writer in ``mode``, refuses a resume whose header differs, skips
    the configurations already complete in the file (a resumed one runs again as the next
    attempt), calls ``prepare(todo labels)`` before the header is written (build what the run
    needs: nothing is written when it fails), then ``run_one(label, sink)`` per configuration,
    which writes each request through ``sink.request`` as it finishes and returns the
    ``LatencySummary``. Ctrl-C raises ``Interrupted`` after the file is closed, with
    ``resume()`` as the command that continues it.
    """
    from roofline.latency import latency_runs

    writer = ResultWriter(path, mode=mode)
    summaries, skipped, written = [], [], [0]
    try:
        if writer.repaired_bytes:
            say(f"note: the last line of {path} was cut off ({writer.repaired_bytes} bytes): removed before resuming.")
        writer.check(header)
        attempts, complete = {}, set()
        if writer.old is not None:
            for t in writer.old.requests:
                attempts[t.config] = max(attempts.get(t.config, 0), t.attempt)
            for s in writer.old.summaries:
                attempts[s.config] = max(attempts.get(s.config, 0), s.attempt)
            complete = {r.config for r in latency_runs(writer.old) if r.complete}
        todo = [label for label in labels if label not in complete]
        skipped = [label for label in labels if label in complete]
        if skipped:
            say(f"resuming: {len(skipped)} configuration(s) already complete in {path}: {', '.join(skipped)}")
        if prepare is not None:
            prepare(todo)
        writer.begin(header)
        remove_derived(path.parent, ("report.html", "report.md", "figures"))
        for label in todo:
            sink = ConfigSink(writer, attempts.get(label, 0) + 1, written)
            s = replace(run_one(label, sink), attempt=sink.attempt)
            writer.write(s)
            summaries.append(s)
    except KeyboardInterrupt:
        writer.close()
        raise Interrupted(path, written[0], resume(), what="requests") from None
    finally:
        writer.close()
    return LatencyResult(path, summaries, skipped, read_results(path))


def _build_model(run: LatencyRun):
    from kernels.model import LlamaModel

    from .serving import warmup

    try:
        m = LlamaModel(run.model, dtype=run.dtype, backend=run.backend, device=run.device, seed=run.seed,
                       max_slots=run.max_slots, max_len=run.prompt_tokens + run.output_tokens + 1)
    except (ValueError, RuntimeError) as e:
        raise RooflineError(f"cannot build {run.model.name} ({run.backend}, {run.dtype}, {run.device}): {e}") from None
    warmup(m)
    return m


def strict_json(obj) -> str:
    """JSON for stdout: strict (NaN and infinities as null), as every JSON parser expects."""
    from roofline.records import strict

    return json.dumps(strict(obj), allow_nan=False)


def finite_or_none(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
