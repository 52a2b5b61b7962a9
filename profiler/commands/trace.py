"""``roofline trace``: a PyTorch profiler trace on the roofline (``profiler.trace_run.run_trace`` does the work).

    roofline trace trace.json.gz                        # a trace file (.json or .json.gz)
    roofline trace ./profiles/                          # a folder of per-rank traces
    roofline trace decode.json --capture-trace ./capture/ --model config.json --device h100
    roofline trace trace.json --ceilings roofline-out/results.jsonl   # ceilings measured on that box
    roofline trace vllm.json --model gpt-oss-20b --mix decode=27x2048 --rules my_rules.py   # engine steps' KV lengths
    roofline trace --capture --out roofline-trace -- python my_script.py ARGS

Writes OUT/results.jsonl (kind "trace": ``roofline report`` and ``roofline diagnose`` read it
like a profile), OUT/report.html, OUT/report.md and the figures as SVG (OUT/figures/*.svg, drawn by
``reports.svg_figures`` without matplotlib; ``--png``: their PNGs too, drawn by matplotlib); prints GPU time, the shares of costed and uncosted time,
each phase's verdict and the top ops (``--json``: one JSON object instead).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from roofline.errors import RooflineError
from roofline.records import strict
from roofline.traces.engine_steps import parse_mix
from roofline.traces.registry import load_rules

from ..capture import script_argv, script_problem
from ..cli_args import mode_of, model_option, resolve_device, say_for
from ..run import command_line
from ..trace_run import TraceRun, run_trace


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--capture", is_flag=True, help="run `-- python SCRIPT.py ARGS` under the profiler first, then read "
              "the trace it wrote (OUT/trace.json.gz)")
@click.option("--skip-forwards", type=click.IntRange(min=0), default=0, show_default=True,
              help="--capture: top-level forward calls to run before recording (warm-up)")
@click.option("--capture-trace", "captures", multiple=True, type=click.Path(exists=True),
              help="a graph-capture trace (file or folder) to map CUDA-graph replays back to ops; repeatable")
@click.option("--phase-marker", "markers", multiple=True, metavar="PHASE=NAME",
              help="record_function names that mark a phase, e.g. decode=decode_step; repeatable")
@click.option("--mix", default=None, metavar="prefill=NxQ@C,decode=NxC",
              help="the KV lengths of the engine's steps (vLLM / SGLang step annotations give counts only), e.g. "
              "prefill=1x512@1536,decode=31x2048: applied to each step whose counts agree")
@click.option("--rules", "rule_files", multiple=True, type=click.Path(dir_okay=False),
              help="a Python file of your own trace cost rules (@rule from roofline.traces.registry; priority= "
              "to be tried before a built-in rule); repeatable")
@model_option()
@click.option("--device", "device_name", default=None, help="the GPU it ran on, when the trace does not say or says "
              "otherwise: a catalogue name (h100, a100, mi300x, ...) [default: the trace's deviceProperties]")
@click.option("--device-file", type=click.Path(dir_okay=False), default=None, help="your own device: a JSON file")
@click.option("--peak-tflops", type=float, default=None, help="custom device: peak TFLOP/s (dense)")
@click.option("--bandwidth-gbs", type=float, default=None, help="custom device: memory bandwidth in GB/s")
@click.option("--ceilings", type=click.Path(exists=True, dir_okay=False), default=None,
              help="a results.jsonl `roofline profile` wrote on the traced machine: classify against its ceilings")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="the rank written to the results (default: "
              "the lowest); every rank's GPU time is printed")
@click.option("--out", "out_dir", default="roofline-trace", show_default=True, type=click.Path(file_okay=False),
              help="folder for results.jsonl and the report")
@click.option("--overwrite", is_flag=True, help="replace OUT/results.jsonl if it exists")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (summary, steps, paths) on stdout")
@click.option("--no-report", is_flag=True, help="write the results file only")
@click.option("--png", is_flag=True, help="also write the report's figures as PNG (drawn by matplotlib: about 1 s "
              "more); by default they are SVG only, drawn without matplotlib, which the HTML embeds and report.md "
              "links")
@click.option("--quiet", is_flag=True, help="no notes on stderr")
def trace(args, capture, skip_forwards, captures, markers, mix, rule_files, model, device_name, device_file, peak_tflops,
          bandwidth_gbs, ceilings, rank, out_dir, overwrite, as_json, no_report, png, quiet):
    """Put the ops of a PyTorch profiler (Kineto) trace on the roofline.

    \b
    roofline trace TRACE.json[.gz] | FOLDER [options]
    roofline trace --capture [options] -- python SCRIPT.py ARGS
    """
    say = say_for(quiet or as_json)
    out = Path(out_dir)
    step_mix = parse_mix(mix) if mix else None
    for f in rule_files:
        say(f"rules: {len(load_rules(f))} from {f}")
    if capture:
        path = _capture(list(args), out, skip_forwards, overwrite, say)
    else:
        if len(args) != 1:
            raise click.UsageError("give one trace file or folder (or --capture -- python SCRIPT.py ARGS).")
        path = args[0]
    device = None
    if device_file or peak_tflops is not None or bandwidth_gbs is not None or device_name is not None:
        device = resolve_device(device_name, device_file, peak_tflops, bandwidth_gbs)
    given_peak = device is not None and not device_file and peak_tflops is not None   # its dtype: the trace's
    run = TraceRun(trace=str(path), out=str(out), captures=tuple(captures), markers=tuple(markers), model=model,
                   device=device, peak_of_trace_dtype=given_peak, ceilings=ceilings, rank=rank, mix=step_mix,
                   mode=mode_of(False, overwrite),
                   report=not no_report, png=png, command=command_line(f"roofline trace {path}"))
    result = run_trace(run, say=say)
    for n in result.notes:
        say(f"note: {n}")
    if as_json:
        click.echo(json.dumps(strict(result.to_json()), default=str, allow_nan=False))
    else:
        click.echo(result.text())


def _capture(cmd: list, out: Path, skip: int, overwrite: bool, say) -> Path:
    if not cmd:
        raise click.UsageError("--capture needs the command to run after `--`: -- python SCRIPT.py ARGS")
    path = out / "trace.json.gz"
    if path.exists() and not overwrite:
        raise RooflineError(f"{path} already exists: add --overwrite to record it again, or give another --out.")
    script = script_argv(cmd)
    problem = script_problem(script[0]) if script and script[0] != "-m" else None
    if problem:
        raise RooflineError(problem)
    out.mkdir(parents=True, exist_ok=True)
    say(f"recording {' '.join(cmd)} -> {path}")
    status, last = _run_teeing_stderr([sys.executable, "-m", "profiler.capture", "--out", str(path),
                                       "--skip-forwards", str(skip), "--", *cmd])
    if status != 0:
        said = f" (it said: {last})" if last else ""
        raise RooflineError(f"the captured command exited with status {status}{said}; its trace is not read.")
    if not path.exists():
        raise RooflineError(f"the captured command wrote no trace at {path}.")
    return path


def _run_teeing_stderr(argv: list) -> tuple[int, str]:
    """Run ``argv``, passing its stderr through as it comes; returns its status and last non-empty stderr line."""
    last, err = "", sys.__stderr__      # the process's own stderr, where the child's would have gone
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        for line in proc.stderr:
            if err is not None:
                err.write(line)
                err.flush()
            if line.strip():
                last = line.strip()
    return proc.returncode, last.removeprefix("Error: ")
