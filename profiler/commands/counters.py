"""``roofline counters FILE``: Nsight Compute counters on the roofline (``profiler.counters_run`` does the work).

    roofline counters ncu.csv                                   # ncu --csv or ncu --csv --page raw output
    roofline counters ncu.csv --join roofline-out/results.jsonl # joined to the points that were launched
    roofline counters ncu.csv --device a100 --out roofline-counters --overwrite

Writes OUT/results.jsonl (kind "counters": ``report``, ``diagnose`` and ``compare`` read it) and the report;
prints each launch's time, bytes per memory level and FLOPs, and measured against modelled bytes and FLOPs.
"""

from __future__ import annotations

import click

from roofline.devices import find_device

from ..cli_args import mode_of, say_for
from ..counters_run import CountersRun, run_counters
from ..run import command_line


@click.command()
@click.argument("csv_file", type=click.Path(dir_okay=False))
@click.option("--join", "join_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="a results.jsonl (its triton points) or the manifest.json of `profile --counters`: the points "
                   "launched, in order")
@click.option("--device", "device_name", default=None, help="the GPU, when the file names none or another "
              "(a catalogue name) [default: the file's Device column]")
@click.option("--out", "out_dir", default="roofline-counters", show_default=True, type=click.Path(file_okay=False))
@click.option("--overwrite", is_flag=True, help="replace OUT/results.jsonl if it exists")
@click.option("--no-report", is_flag=True, help="write the results file only")
@click.option("--quiet", is_flag=True, help="no notes on stderr")
def counters(csv_file, join_file, device_name, out_dir, overwrite, no_report, quiet):
    """Put Nsight Compute's measured bytes and FLOPs on the roofline, beside the model's."""
    say = say_for(quiet)
    run = CountersRun(csv_file, out=out_dir, join=join_file, device=find_device(device_name) if device_name else None,
                      mode=mode_of(False, overwrite), report=not no_report,
                      command=command_line(f"roofline counters {csv_file}"))
    result = run_counters(run, say)
    for n in result.notes:
        say(f"note: {n}")
    click.echo(result.text())
