"""``run_profile``: one ``roofline profile`` as a library call (the CLI, notebooks and tests call it).

    from profiler.run import RunSpec, default_plan, run_profile
    plan, _ = default_plan(quick=True)
    result = run_profile(RunSpec(plan, out="roofline-out", mode="overwrite", report=False))
    print(result.table)

One pipeline for one rank and N (``spec.tp``; one rank is the trivial group). A run, in order (nothing is
measured before every input is checked, nothing measured is lost):

1. the spec is validated once (``check_plan``: the plan's shapes, sizes against the device's memory, the
   interpreter's limits; ``run_spec.validate_tp``: --tp / --ep against the machine and the model's split);
2. the result file is opened by the one writer (``roofline.writer.ResultWriter``): locked,
   refused if it holds results and the mode is "new", repaired and compared on "resume" (another
   --tp / --ep is refused in one line: ``run_spec.check_resume``);
3. the kernels are validated against their references (``profiler.kernel_checks``; any
   failure: nothing is timed);
4. ceilings are measured (or read from the cache), the FLOP cross-check run (cached);
5. under N ranks, the ranks start (``profiler.distributed.run_ranks``: torchrun's, or spawned here) and
   measure the collectives (cached: ``profiler.collectives``): their link goes into the header;
6. the header is written, outputs derived from an older file (report, CSV) are removed;
7. the sweep (``profiler.sweep.run_sweep``, on every rank) writes one line per op (and rank) as it
   finishes; Ctrl-C raises ``Interrupted`` after the file is closed, with the command that resumes it; a
   rank that dies or stops answering ends the run with a one-line ``RooflineError`` (``RankLost``) saying
   which rank, how many points are kept and the command that resumes;
8. the file is read back through ``roofline.analysis`` for the table, the CSV and the report.

On a CPU each of N ranks gets ``cores / N`` threads (``--threads`` overrides), gloo over 127.0.0.1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from roofline.analysis import analyze
from roofline.capacity import capacity
from roofline.devices import Device
from roofline.errors import RooflineError
from roofline.interconnect import Interconnect
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

from reports import write_report

from . import ceilings as C
from . import kernel_checks, probes, sweep
from .collectives import collective_ceilings
from .distributed import OneRank, RankLost, run_ranks, torchrun_env
from .export import phase_table, write_csv
from .flopcheck import cached_flop_check
from .run import Interrupted, check_writable, command_line, cpu_threads_default, quiet, remove_derived, started
from .run_spec import RunSpec, check_resume, rank_threads, validate_tp
from .timing import cpu_threads, now


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
        return phase_table(self.result_file)


def run_profile(spec: RunSpec, *, say=quiet, progress=None, probe=None, make_runners=None) -> ProfileResult | None:
    """Validate, measure the ceilings, sweep (on one rank or ``spec.tp``), write the result file and (optionally)
    its report; None on a follower rank under torchrun.

    ``say(msg)`` receives notes (stderr in the CLI); ``progress(advance, description)`` each op;
    ``probe``/``make_runners`` are injectable for tests. Raises RooflineError for bad input
    (before anything is measured) and ``Interrupted`` on Ctrl-C (after the file is closed).
    """
    check_plan(spec)
    threads = profile_threads(spec)
    ranks = (spec.plan, spec.quick, make_runners, spec.ep)
    env = torchrun_env() if spec.tp > 1 else None
    if env is not None and env["rank"] != 0:      # a follower under torchrun: no file, no output
        run_ranks(spec.tp, spec.plan.device, None, _follow, ranks, threads=threads)
        return None
    check_inputs(spec, say)
    writer = open_writer(spec, say)
    stages, box, own_probe = {}, {}, probe is None
    try:
        check_resume(spec, writer.old.header if writer.old is not None else None)
        with cpu_threads(threads) as n_threads:
            if spec.tp == 1 and not spec.gpu:
                say(threads_line(spec, n_threads))
            writer.check(early_header(spec, n_threads))   # a resume that cannot match fails before anything runs
            probe = probe or probes.open_probe(spec.plan.device)
            if probe.note:
                say(f"note: {probe.note}")
            check_kernels(spec, say, stages)
            header = profile_header(spec, probe, n_threads, say, stages)
            lead = _Lead(spec, writer, header, say, progress, stages, box, probe)
            if spec.tp == 1:
                lead(OneRank(spec.plan.device), *ranks)
        if spec.tp > 1:
            say(f"starting {spec.tp} ranks ({'nccl' if spec.gpu else 'gloo'}"
                f"{', ' + str(threads) + ' threads each' if threads else ''}) ...")
            run_ranks(spec.tp, spec.plan.device, lead, _follow, ranks, threads=threads)
    except KeyboardInterrupt:
        writer.close()
        raise Interrupted(spec.path, len(writer.done), spec.command(resume=True)) from None
    except RankLost as e:
        writer.close()
        raise RooflineError(f"{e}: {_kept(spec.path)} measurements are kept in {spec.path}; resume with: "
                            f"{spec.command(resume=True)}") from None
    finally:
        writer.close()
        if own_probe and probe is not None:
            probe.close()
    result = ProfileResult(spec.path, box.get("stats"), read_results(spec.path), stages,
                           repaired_bytes=writer.repaired_bytes)
    finish_profile(spec, result, say)
    return result


def _kept(path) -> int:
    try:
        return sum(1 for m in read_results(path).measurements if m.ok)
    except RooflineError:
        return 0


class _Lead:
    """Rank 0's part, run inside the group: (under N ranks) the collectives' ceilings into the header, the header,
    the sweep."""

    def __init__(self, spec, writer, header, say, progress, stages, box, probe):
        self.spec, self.writer, self.header, self.say = spec, writer, header, say
        self.progress, self.stages, self.box, self.probe = progress, stages, box, probe

    def __call__(self, ctx, plan, quick, make_runners, ep=1):
        header = self.header if ctx.world == 1 else self._with_collectives(ctx, quick)
        self.writer.begin(header)
        remove_derived(self.spec.out)
        if self.writer.done:
            self.say(f"resuming: {len(self.writer.done)} points already in {self.spec.path}")
        ctx.bcast("go")
        self.box["stats"] = s = sweep.run_sweep(plan, self.writer, make_runners=make_runners, progress=self.progress,
                                          device_name=header.device.name, group=ctx, ep=ep,
                                          probe=self.probe if ctx.world == 1 else None)
        self.stages["sweep"] = s.wall_s
        return s

    def _with_collectives(self, ctx, quick) -> RunHeader:
        self.say("collectives: from the cache, or measured now ...")
        t = now()
        coll = collective_ceilings(ctx, self.header.device.name, quick=quick)
        self.stages["collectives"] = now() - t
        link = Interconnect.from_dict(coll["link"], "measured link")
        h = self.header
        settings = {**h.settings, "dist_backend": ctx.backend, "launcher": ctx.launcher, "world_size": ctx.world,
                    "threads_per_rank": h.settings.get("threads")}
        return replace(h, device=h.device.with_link(link), settings=settings,
                       ceilings={**h.ceilings, "collective": coll})


def _follow(ctx, plan, quick, make_runners, ep=1):
    """Ranks 1..N-1: the same steps as rank 0, in the same order; they write nothing."""
    collective_ceilings(ctx, "", quick=quick)
    ctx.bcast()
    sweep.run_sweep(plan, None, make_runners=make_runners, group=ctx, ep=ep)


def check_inputs(run: RunSpec, say) -> None:
    """After ``check_plan``, before a file is touched: ``check_folder``, ``check_checkpoint``; on one rank the whole
    model's fit is said (``capacity_note``), and what triton on a CPU measures."""
    check_folder(run, say)
    check_checkpoint(run.plan)
    if run.tp > 1:
        return
    note = capacity_note(run.plan)
    if note:
        say(note)
    if "triton" in run.plan.backends and not run.gpu:
        say("note: triton on a CPU runs in the Triton interpreter: its times measure the interpreter, not a kernel.")


def check_checkpoint(plan) -> None:
    """A checkpoint's weights of the layers the sweep times are read once (onto the meta device: nothing is kept)
    before the result file is touched: a tensor the files lack, a shape the config contradicts, is refused while an
    --overwrite's old file is still whole (the sweep itself reads them only after the header is written)."""
    if not plan.model.checkpoint:
        return
    from kernels._common import torch_dtype        # kernels imports torch: deferred
    from kernels.checkpoint import load_weights
    from kernels.runner_context import timed_layers

    load_weights(plan.model, plan.model.checkpoint, torch_dtype(plan.dtype), "meta",
                 layers=list(timed_layers(plan.model)))


def capacity_note(plan) -> str:
    """Whether the whole model fits this device at the plan's largest batch and context (``roofline.capacity``);
    the sweep times one layer at a time, so it runs either way: a model that does not fit is said, not refused."""
    have = sweep.device_memory_bytes(plan.device)
    if not have:
        return ""
    cap = capacity(plan.model, SimpleNamespace(name=plan.device, memory_bytes=have), max(plan.batches),
                   max(plan.contexts), act_dtype=plan.dtype, weight_dtype=plan.dtype, kv_dtype=plan.dtype)
    if cap.fits:
        return ""
    return (f"note: {cap.sentence} This sweep times one layer at a time and runs anyway; serving the whole model "
            "needs what the sentence says.")


def check_plan(run: RunSpec) -> None:
    """The device is there, the plan can run on it and so can its ranks (``run_spec.validate_tp``): every check
    of the spec, once, before anything starts (one-line errors)."""
    import torch

    plan = run.plan
    if plan.device.startswith("cuda") and not torch.cuda.is_available():
        raise RooflineError(f"--device {plan.device}: no CUDA GPU is visible to torch here; use --device cpu.")
    plan.validate()
    validate_tp(run)


def check_folder(run: RunSpec, say) -> None:
    """The output folder can be written; the model's notes are said."""
    check_writable(run.out)
    for n in run.plan.model.notes:
        say(f"note: {n}")


def open_writer(run: RunSpec, say) -> ResultWriter:
    """The one writer of ``run.path`` (locked; refused, repaired or truncated by ``run.mode``)."""
    writer = ResultWriter(run.path, mode=run.mode)
    if writer.repaired_bytes:
        say(f"note: the last line of {run.path} was cut off ({writer.repaired_bytes} bytes, an interrupted "
            "write): it was removed before resuming.")
    return writer


def profile_threads(spec: RunSpec) -> int | None:
    """The CPU threads the run fixes: per rank under tensor parallelism (``rank_threads``), none on a GPU, else
    --threads or, as ``latency`` and ``serve`` default, one fewer than the cores (``run.cpu_threads_default``):
    with every core taken, one other process stretches each timed step many times over."""
    if spec.tp > 1:
        return rank_threads(spec)
    return None if spec.gpu else cpu_threads_default(spec.plan.device, spec.threads)


def threads_line(spec: RunSpec, n_threads: int) -> str:
    """The run's first line on a CPU: the threads it times with, and why when they are the default."""
    if spec.threads:
        return f"CPU: {n_threads} torch thread(s), as given (--threads)"
    return (f"CPU: {n_threads} torch thread(s), one fewer than the {os.cpu_count()} cores as latency and serve use "
            "(a busy core stalls every OpenMP thread); --threads N sets it")


def early_header(run: RunSpec, n_threads: int) -> RunHeader:
    """What a resume is compared against before any work: device name, model, dtype, settings."""
    return RunHeader(device=_named(C.device_name(run.plan.device)), model=run.plan.model, dtype=run.plan.dtype,
                     settings=run.to_header(n_threads))


def check_kernels(run: RunSpec, say, stages: dict) -> None:
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
    return Device(key="x", name=name, kind="cpu")


def profile_header(run: RunSpec, probe, n_threads, say, stages) -> RunHeader:
    """The header of ``run``'s file: ceilings (given, cached or measured now), the FLOP cross-check, the host."""
    plan = run.plan
    gpu = plan.device.startswith("cuda")
    if run.device is not None:
        dev, sheet, details = run.device, None, {"note": "ceilings given by the caller, not measured"}
    else:
        wanted = tuple(dict.fromkeys((C.GPU_DTYPES if gpu else C.CPU_DTYPES) + (plan.dtype,)))
        say("ceilings: from the cache, or measured now ...")
        t = now()
        c = C.get_ceilings(plan.device, dtypes=wanted, quick=run.quick)
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
                     dtype=plan.dtype, settings=run.to_header(n_threads), versions=probes.versions(),
                     git_sha=probes.git_sha(), command=command_line(run.command(resume=run.mode == "resume")),
                     started=started(), host=host, flop_check=fc)


def finish_profile(run: RunSpec, result: ProfileResult, say) -> None:
    """The CSV, the report and the notes of a finished run, from the file read back."""
    rf = result.result_file
    result.notes += list(rf.notices)
    if run.csv:
        write_csv(rf, run.out / "results.csv")
        result.csv = run.out / "results.csv"
    if run.report:
        t = now()
        try:
            result.report = write_report([rf], run.out)
        except Exception as e:  # noqa: BLE001 - the measurements are on disk; say what failed, keep going
            say(f"report failed ({type(e).__name__}: {e}); the results are intact: `roofline report {result.path}` "
                "retries it.")
        result.stages["report"] = now() - t
    a = analyze(rf)
    warm_above = [r for r in a.results if r.m.l2_policy == "warm" and r.above_roof]
    if warm_above:
        result.notes.append(f"{len(warm_above)} ops ran above the memory roof with warm caches: their working set "
                            "fits in this CPU's last-level cache, so they never touched DRAM. --flush-cache times "
                            "them cold.")
    busy = sum("host-busy" in r.m.flags for r in a.results)
    n = int(rf.header.settings.get("threads") or 1)
    if busy:
        result.notes.append(f"{busy} of {len(a.results)} points were measured while other processes wanted the "
                            "CPUs (flag host-busy): their times include waiting for a core. For numbers to trust, "
                            "measure again when the machine is quiet"
                            + (f", or with fewer threads (this run used {n}: --threads {n - 1})." if n > 1 else "."))
