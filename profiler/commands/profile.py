"""``roofline profile``: validate the kernels, measure the ceilings, sweep, write results and the report.

    roofline profile --quick                          # CPU: ~30 s; GPU: a short sweep
    roofline profile --model llama-3-8b --phases decode --batches 1,8,64 --contexts 512,4096
    roofline profile --resume --out roofline-out      # continue an interrupted sweep

Everything the user typed is validated before anything is measured (usage errors name
the rule). Progress goes to stderr (rich, with an ETA); stdout gets the result paths
and a short table of phase verdicts. Results: OUT/results.jsonl (JSON Lines, a line per
op and point, flushed as each finishes); --csv adds OUT/results.csv.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from roofline.errors import RooflineError

from ..cli_args import _dtype_cb, int_list

GPU_DEFAULTS = dict(model="llama-3-8b", batches=(1, 2, 4, 8, 16, 32, 64, 128),
                    contexts=(128, 256, 512, 1024, 2048, 4096, 8192), backends=("triton", "torch"), dtype="bf16")
GPU_QUICK = dict(model="llama-3-8b", batches=(1, 16), contexts=(512, 2048), backends=("triton", "torch"), dtype="bf16")
CPU_DEFAULTS = dict(model="small", batches=(1, 4, 16), contexts=(64, 256), backends=("torch",), dtype="fp32")
CPU_QUICK = dict(model="small", batches=(1, 4), contexts=(64, 256), backends=("torch",), dtype="fp32")
BUDGET_MS = {"gpu": 50.0, "cpu": 40.0, "quick-gpu": 20.0, "quick-cpu": 25.0}


def _names(choices):
    def cb(ctx, param, value):
        if value is None:
            return None
        parts = [p.strip().lower() for p in str(value).split(",") if p.strip()]
        bad = [p for p in parts if p not in choices]
        if not parts or bad:
            raise click.BadParameter(f"must be a comma-separated list of {', '.join(choices)}, "
                                     f"but {value!r} was given.")
        return tuple(dict.fromkeys(parts))
    return cb


def _llc() -> int:
    from ..probes import llc_bytes

    return llc_bytes()[0]


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".roofline-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise click.UsageError(f"--out {out}: the output directory cannot be written ({e.strerror or e}).") from None


def validate_kernels(backends, dtype, device="cpu") -> list:
    """Run kernels.check quickly for each backend; refuse (RooflineError) if any check fails."""
    try:
        from kernels.check import run_checks
    except ImportError as e:
        raise RooflineError(f"kernels.check is not available ({e}): the kernels cannot be validated, so nothing "
                            "is timed.") from None
    results, failed = [], []
    for be in backends:
        for r in run_checks(backend=be, dtype=dtype, device=device, quick=True):
            results.append((be, r))
            if not r.passed:
                failed.append(f"{be} {r.name} (max rel err {r.max_rel_err:.3g} > tol {r.tol:.3g}"
                              + (f": {r.detail}" if r.detail else "") + ")")
    if failed:
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        raise RooflineError(f"kernel validation failed, so nothing was timed: {'; '.join(failed[:3])}{more}. "
                            f"Run `roofline check --dtype {dtype}` for details.")
    return results


def resume_command(model_arg, plan, out, budget_ms, threads) -> str:
    args = ["roofline", "profile", "--model", model_arg, "--phases", ",".join(plan.phases),
            "--batches", ",".join(map(str, plan.batches)), "--contexts", ",".join(map(str, plan.contexts)),
            "--backends", ",".join(plan.backends), "--dtype", plan.dtype, "--device", plan.device,
            "--out", str(out), "--budget-ms", f"{budget_ms:g}"]
    if threads:
        args += ["--threads", str(threads)]
    if plan.flush_bytes:
        args += ["--flush-cache"]
    return shlex.join(args + ["--resume"])


@click.command()
@click.option("--model", "model_arg", default=None,
              help="preset (llama-3-8b, small, tiny, ...) or a local config.json [default: llama-3-8b on a GPU, "
                   "small on a CPU]")
@click.option("--phases", default="prefill,decode", show_default=True, callback=_names(("prefill", "decode")),
              help="prefill and/or decode")
@click.option("--batches", default=None, callback=int_list, help="e.g. 1,4,16 [GPU: 1..128 by 2x; CPU: 1,4,16]")
@click.option("--contexts", default=None, callback=int_list,
              help="prompt length (prefill) / cached tokens (decode) [GPU: 128..8192 by 2x; CPU: 64,256]")
@click.option("--backends", default=None, callback=_names(("triton", "torch")),
              help="triton and/or torch [GPU: triton,torch; CPU: torch (triton = the interpreter, tiny only)]")
@click.option("--dtype", default=None, callback=_dtype_cb, help="fp32, bf16, fp16 [GPU: bf16; CPU: fp32]")
@click.option("--device", default=None, help="cpu or cuda[:i] [default: cuda when visible]")
@click.option("--out", "out_dir", default="roofline-out", show_default=True, type=click.Path(file_okay=False),
              help="output directory: results.jsonl, results.csv, the report")
@click.option("--resume", is_flag=True, help="skip points already in OUT/results.jsonl")
@click.option("--quick", is_flag=True, help="a small sweep (under a minute on a 2-core CPU)")
@click.option("--quiet", is_flag=True, help="no progress bar or notes on stderr")
@click.option("--csv", "csv_out", is_flag=True, help="also write OUT/results.csv")
@click.option("--budget-ms", type=click.FloatRange(min=1.0), default=None,
              help="timed repetitions per op, in ms of run time [GPU 50, CPU 40; --quick 20/25]")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU: torch threads (fixed, recorded)")
@click.option("--flush-cache", is_flag=True,
              help="CPU: write 2x the last-level cache between repetitions, so weights come from DRAM "
                   "(slower; a GPU's L2 is always flushed)")
@click.option("--no-report", is_flag=True, help="skip the report at the end")
def profile(model_arg, phases, batches, contexts, backends, dtype, device, out_dir, resume, quick, quiet, csv_out,
            budget_ms, threads, flush_cache, no_report):
    """Sweep prefill and decode over batch sizes and context lengths, timing every op of one layer.

    Each point times every op of one transformer layer, the embedding, final norm and
    lm_head, and the whole layer, with formula FLOPs and bytes. Kernels are validated
    first; ceilings are measured (cached) first; Ctrl-C keeps what was measured.
    """
    import torch

    from roofline.models import load_model
    from roofline.records import ResultWriter, RunHeader, read_results, resume_mismatch
    from roofline.devices import Device

    from ..ceilings import device_name
    from ..sweep import SweepPlan

    say = (lambda *a, **k: None) if quiet else (lambda msg: click.echo(msg, err=True))
    # ---- resolve and validate everything before measuring anything ----
    device = (device or ("cuda" if torch.cuda.is_available() else "cpu")).strip().lower()
    if device != "cpu" and not device.startswith("cuda"):
        raise click.UsageError(f"--device must be cpu or cuda[:i], but {device!r} was given.")
    gpu = device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise click.UsageError("--device cuda: no CUDA GPU is visible to torch; use --device cpu.")
    d = (GPU_QUICK if quick else GPU_DEFAULTS) if gpu else (CPU_QUICK if quick else CPU_DEFAULTS)
    model_arg = model_arg or d["model"]
    try:
        cfg = load_model(model_arg)
    except RooflineError as e:
        raise click.UsageError(f"--model: {e}") from None
    dtype = dtype or d["dtype"]
    if dtype not in ("fp32", "bf16", "fp16"):
        raise click.UsageError(f"--dtype must be fp32, bf16 or fp16 for a sweep, but {dtype!r} was given.")
    budget_ms = budget_ms or BUDGET_MS[("quick-" if quick else "") + ("gpu" if gpu else "cpu")]
    plan = SweepPlan(model=cfg, phases=phases, batches=tuple(batches or d["batches"]),
                     contexts=tuple(contexts or d["contexts"]), backends=tuple(backends or d["backends"]),
                     dtype=dtype, device=device, budget_s=budget_ms / 1e3,
                     warmup_s=budget_ms / (4e3 if gpu else 8e3),  # a GPU also ramps its clocks
                     flush_bytes=2 * _llc() if flush_cache and not gpu else 0)
    try:
        plan.validate()
    except RooflineError as e:
        raise click.UsageError(str(e)) from None
    out = Path(out_dir)
    _writable(out)
    path = out / "results.jsonl"
    dev_name = device_name(device)
    if resume and path.exists() and path.stat().st_size > 0:
        old = read_results(path)  # a corrupt line: RooflineError naming the line
        diff = resume_mismatch(old.header, RunHeader(device=Device(key="x", name=dev_name, kind="cpu"),
                                                     model=cfg.to_dict(), dtype=dtype))
        if diff:
            raise RooflineError(f"cannot resume {path}: {diff}. Use another --out, or drop --resume to start over.")
    elif path.exists() and path.stat().st_size > 0:
        say(f"note: {path} exists and will be overwritten (use --resume to continue it).")
    if "triton" in plan.backends and not gpu:
        say("note: triton on a CPU runs in the Triton interpreter: its times measure the interpreter, not a kernel.")

    from .. import probes
    from ..timing import cpu_threads, now

    probe = probes.open_probe(device)
    if probe.note:
        say(f"note: {probe.note}")
    resume_cmd = resume_command(model_arg, plan, out, budget_ms, threads)
    stages = {}
    same = resume_cmd.removesuffix(" --resume") + (" --resume" if resume else "")  # equivalent to what was typed
    writer = None
    try:
        with cpu_threads(threads if not gpu else None) as n_threads:
            say(f"validating kernels ({', '.join(plan.backends)}, {dtype}) ...")
            t = now()
            validate_kernels(plan.backends, dtype, device)
            stages["checks"] = now() - t
            header = _header(plan, probe, cfg, dtype, device, n_threads, quick, budget_ms, say, stages, same)
            writer = ResultWriter(path, header, resume=resume)
            if writer.done:
                say(f"resuming: {len(writer.done)} points already in {path}")
            stats = _run(plan, writer, probe, header.device.name, quiet)
            stages["sweep"] = stats.wall_s
    except KeyboardInterrupt:
        if writer is not None:
            writer.close()
            n = len(writer.done)
            click.echo(f"\ninterrupted: {n} points are kept in {path}. Resume with:\n  {resume_cmd}", err=True)
        else:
            click.echo("\ninterrupted before anything was measured.", err=True)
        sys.exit(130)
    finally:
        probe.close()
    writer.close()
    _finish(path, out, stats, csv_out, no_report, say, stages)


def _header(plan, probe, cfg, dtype, device, n_threads, quick, budget_ms, say, stages, equivalent):
    from roofline.records import RunHeader

    from .. import probes
    from ..ceilings import CPU_DTYPES, GPU_DTYPES, get_ceilings
    from ..flopcheck import flop_check
    from ..timing import now

    gpu = device.startswith("cuda")
    wanted = tuple(dict.fromkeys((GPU_DTYPES if gpu else CPU_DTYPES) + (dtype,)))
    say("ceilings: from the cache, or measured now ...")
    t = now()
    c = get_ceilings(device, dtypes=wanted, quick=quick)
    stages["ceilings"] = now() - t
    t = now()
    try:
        fc = flop_check(cfg, dtype=dtype, device=device, prompt=min(plan.contexts))
    except Exception as e:  # noqa: BLE001 - a cross-check must never stop a sweep; say why it is missing
        fc = {"error": f"{type(e).__name__}: {e}"}
        say(f"note: FLOP cross-check failed ({fc['error']}); continuing without it.")
    stages["flop check"] = now() - t
    host = {"probe": probe.kind, "static": probe.static(), "state": probe.sample()}
    if gpu:
        host["cpu"] = probes.cpu_info()
    return RunHeader(device=c.device, datasheet=c.datasheet, ceilings=c.details, model=cfg.to_dict(), kind="profile",
                     dtype=dtype, settings={**plan.settings(), "threads": n_threads, "quick": quick,
                                            "budget_ms": budget_ms},
                     versions=probes.versions(), git_sha=probes.git_sha(), command=_command_line(equivalent),
                     started=datetime.now(timezone.utc).isoformat(timespec="seconds"), host=host, flop_check=fc)


def _command_line(equivalent: str) -> str:
    """The command as typed when run as `roofline`; else (in-process, tests) the equivalent one."""
    if sys.argv and Path(sys.argv[0]).name == "roofline":
        return shlex.join(["roofline", *sys.argv[1:]])
    return equivalent


def _run(plan, writer, probe, dev_name, quiet):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from ..sweep import run_sweep

    total = len(plan.combos()) * len(plan.op_names)
    cols = (TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn())
    with Progress(*cols, console=Console(stderr=True), disable=quiet, transient=False) as bar:
        task = bar.add_task("sweep", total=total)
        return run_sweep(plan, writer, probe=probe, device_name=dev_name,
                         progress=lambda n, desc: bar.update(task, advance=n, description=desc))


def _finish(path, out, stats, csv_out, no_report, say, stages):
    from roofline.records import read_results

    from ..export import phase_table, write_csv
    from ..timing import now

    rf = read_results(path)
    click.echo(f"results: {path} ({stats.measured} measured, {stats.skipped} skipped, {stats.resumed} resumed; "
               f"{stats.wall_s:.1f} s of sweep, {stats.kernel_time_s:.1f} s timed)")
    if csv_out:
        write_csv(rf, out / "results.csv")
        click.echo(f"csv: {out / 'results.csv'}")
    if not no_report:
        try:
            from reports import write_report
        except ImportError:
            say("report skipped: the reports package has no write_report yet; run `roofline report "
                f"{path}` once it does.")
        else:
            try:
                t = now()
                written = write_report([path], out)
                stages["report"] = now() - t
                shown = written.get("html", out) if isinstance(written, dict) else out
                click.echo(f"report: {shown}")
            except Exception as e:  # noqa: BLE001 - the measurements are safe; say what failed
                say(f"report failed ({type(e).__name__}: {e}); the results are intact: "
                    f"`roofline report {path}` retries it.")
    click.echo("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items())
               + f" (of the sweep, {stats.kernel_time_s:.1f} s in timed samples)")
    click.echo(phase_table(rf))
    warm_above = [m for m in rf.measurements if m.l2_policy == "warm" and m.above_roof(rf.device)]
    if warm_above:
        say(f"note: {len(warm_above)} ops ran above the memory roof with warm caches: their working set fits in "
            "this CPU's last-level cache, so they never touched DRAM. --flush-cache times them cold.")
    busy = sum("host-busy" in m.flags for m in rf.measurements)
    if busy:
        say(f"note: {busy} of {len(rf.measurements)} points were measured while other processes wanted the CPUs "
            "(flag host-busy): their times include waiting for a core. On a shared machine, --threads "
            f"{max(1, (os.cpu_count() or 2) - 1)} keeps OpenMP from waiting on a busy core.")
