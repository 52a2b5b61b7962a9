"""``roofline profile``: parse the options into one ``RunSpec`` (``profiler.run_spec.spec_from_options``), then
``profiler.run.run_profile`` does the work.

    roofline profile --quick                          # CPU: ~10 s; GPU: a short sweep
    roofline profile --model llama-3-8b --phases decode --batches 1,8,64 --contexts 512,4096
    roofline profile --resume --out roofline-out      # continue an interrupted sweep
    roofline profile --phases decode --spec 1,3,5     # verify steps of 1, 3 and 5 drafts beside plain decode
    roofline profile --tp 2 --model tiny              # tensor parallel: 2 ranks (gloo on a CPU, NCCL on GPUs)
    roofline profile --tp 2 --ep 2 --model tiny-moe   # expert parallel: 4 whole experts per rank, all-to-alls
    roofline profile --weight-dtype fp32,int8 --phases decode   # float and int8 weights in one file (CPU: fp32)
    roofline profile --weight-dtype bf16,int4 --group-size 64 --kv-dtype bf16,int8   # GPU: 4 passes
    torchrun --nproc-per-node 8 -m profiler.cli profile --tp 8   # the same ranks started by torchrun

Everything the user typed is validated before anything is measured (usage errors name
the rule). Progress goes to stderr (rich, with an ETA); stdout gets the result paths
and a short table of phase verdicts. Results: OUT/results.jsonl (JSON Lines, a line per
op and point, flushed as each finishes); --csv adds OUT/results.csv.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from roofline.errors import RooflineError

from ..cli_args import (allow_unknown_option, budget_option, device_arg, ep_option, float_dtype_option, int_list,
                        mode_of, mode_options, model_arg_option, names, quant_options, say_for, threads_option)
from ..counters_run import profile_counters
from ..profile_run import run_profile
from ..run import Interrupted, command_line
from ..run_spec import spec_from_options
from ..sweep import sweep_ops


@click.command()
@model_arg_option("preset (llama-3-8b, small, tiny, ...) or a local config.json [default: llama-3-8b on a GPU, "
                  "small on a CPU]")
@click.option("--phases", default="prefill,decode", show_default=True, callback=names(("prefill", "decode")),
              help="prefill and/or decode")
@click.option("--spec", "spec", default=None, callback=int_list,
              help="also time verify steps of speculative decoding with K drafts each (e.g. 1,3,5), beside decode")
@click.option("--batches", default=None, callback=int_list, help="e.g. 1,4,16 [GPU: 1..128 by 2x; CPU: 1,4,16]")
@click.option("--contexts", default=None, callback=int_list,
              help="prompt length (prefill) / cached tokens (decode) [GPU: 128..8192 by 2x; CPU: 64,256]")
@click.option("--backends", default=None, callback=names(("triton", "torch")),
              help="triton and/or torch [GPU: triton,torch; CPU: torch (triton = the interpreter, tiny only)]")
@float_dtype_option("--dtype", None, "the dtype the sweep runs in [GPU: bf16; CPU: fp32]",
                    why="{key} is costed by `roofline explain`, not run; quantization: --weight-dtype, --kv-dtype")
@click.option("--device", default=None, callback=device_arg("torch"), help="cpu or cuda[:i] [default: cuda when visible]")
@click.option("--out", "out_dir", default="roofline-out", show_default=True, type=click.Path(file_okay=False),
              help="output directory: results.jsonl, results.csv, the report")
@mode_options("OUT/results.jsonl")
@click.option("--quick", is_flag=True, help="a small sweep (under a minute on a 2-core CPU)")
@allow_unknown_option
@click.option("--quiet", is_flag=True, help="no progress bar or notes on stderr")
@click.option("--csv", "csv_out", is_flag=True, help="also write OUT/results.csv")
@budget_option("timed repetitions per op, in ms of run time [GPU 50, CPU 40; --quick 20/25]")
@threads_option("CPU: torch threads (fixed, recorded)")
@click.option("--flush-cache", is_flag=True,
              help="CPU: write 2x the last-level cache between repetitions, so weights come from DRAM "
                   "(slower; a GPU's L2 is always flushed)")
@click.option("--no-report", is_flag=True, help="skip the report at the end (an older report in OUT is removed)")
@click.option("--tp", type=int, default=1, show_default=True,
              help="tensor-parallel ranks: each times its shard and the collectives (spawned here, or by torchrun); "
                   "rank 0 writes the file")
@ep_option
@quant_options(several=True)
@click.option("--counters", "counters", is_flag=True, help="run the triton points once each under Nsight Compute "
              "(ncu on PATH) and put its measured bytes and FLOPs beside the model's (profiler.counters_run)")
def profile(**opts):
    """Sweep prefill and decode over batch sizes and context lengths, timing every op of one layer.

    Each point times every op of one transformer layer, the embedding, final norm and
    lm_head, and the whole layer, with formula FLOPs and bytes. Kernels are validated
    first; ceilings are measured (cached) first; Ctrl-C keeps what was measured.
    """
    quiet, mode = opts["quiet"], mode_of(opts["resume"], opts["overwrite"])
    say = say_for(quiet)
    run = spec_from_options(opts, mode)        # the run, described once: every later step reads it
    if opts.get("counters"):
        if run.plan.spec:
            raise RooflineError("--counters reads the prefill and decode points only, not --spec's verify steps: "
                                "run --counters without --spec, and --spec without --counters.")
        result = profile_counters(run.plan, opts["out_dir"], mode, say, report=run.report,
                                  command=command_line("roofline profile --counters"))
        click.echo(result.text())
        return
    try:
        with _progress(run, quiet) as progress:
            result = run_profile(run, say=say, progress=progress)
    except Interrupted as e:
        click.echo("\n" + e.message, err=True)
        raise SystemExit(130) from None
    if result is None:               # a follower rank under torchrun: rank 0 reports
        return
    s = result.stats
    click.echo(f"results: {result.path} ({s.measured} measured, {s.skipped} skipped, {s.resumed} resumed; "
               f"{s.wall_s:.1f} s of sweep, {s.kernel_time_s:.1f} s timed)")
    if result.csv:
        click.echo(f"csv: {result.csv}")
    if result.report:
        click.echo(f"report: {result.report['html']}")
    click.echo("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.stages.items())
               + f" (of the sweep, {s.kernel_time_s:.1f} s in timed samples)")
    click.echo(result.table)
    for n in result.notes:
        say(f"note: {n}")


class _progress:
    """A rich progress bar on stderr, started at the first op (nothing when quiet): ``progress(n, desc)``."""

    def __init__(self, run, quiet: bool):
        self.run, self.quiet, self.bar, self.task = run, quiet, None, None

    def __enter__(self):
        return None if self.quiet else self.update

    def update(self, n: int, desc: str) -> None:
        if self.bar is None:
            plan = self.run.plan
            cols = (TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn())
            self.bar = Progress(*cols, console=Console(stderr=True), transient=False)
            self.bar.__enter__()
            names = sweep_ops(plan, self.run.tp, self.run.ep)
            self.task = self.bar.add_task("sweep", total=plan.points * len(plan.variants()) * len(names))
        self.bar.update(self.task, advance=n, description=desc)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
