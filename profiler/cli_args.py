"""Shared click options and their validation (mlflow's cli_args habit): one place per kind of input.

Callbacks turn bad values into ``click.BadParameter`` naming the option, the rule and the
allowed range, before anything runs. Values that are fine but odd (a duplicate in a list)
are cleaned and said once on stderr.
"""

from __future__ import annotations

import math
import os
import re

import click

from roofline.devices import custom_device, find_device, load_device_file
from roofline.dtypes import BYTES_PER_ELEMENT, normalize_dtype
from roofline.errors import RooflineError
from roofline.models import load_model

DTYPES = tuple(BYTES_PER_ELEMENT)
MAX_BUDGET_MS = 60_000.0     # one minute of timed repetitions per op is already far more than enough


def say_for(quiet: bool):
    """Notes on stderr, or nowhere with --quiet."""
    return (lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True))


def _bad(value, rule: str):
    raise click.BadParameter(f"{rule}, but {value!r} was given.")


def _dtype_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return normalize_dtype(value)
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None


def _model_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return load_model(value)            # its notes (e.g. unmodelled RoPE scaling) are the command's to say
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None


def _model_arg_cb(ctx, param, value):
    """--model kept as typed (for the resume command), checked now so a bad one stops before any work."""
    if value is None:
        return None
    try:
        load_model(value)
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None
    return value


def int_list(ctx, param, value):
    """'1,2,4' -> [1, 2, 4]; every entry a positive integer; a repeated value runs once (said on stderr)."""
    if value is None or isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if not parts:
        _bad(value, "give a comma-separated list of positive integers, e.g. 1,4,16")
    out = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise click.BadParameter(f"{p!r} is not a positive integer; give e.g. 1,4,16.")
        out.append(int(p))
    return dedupe(out, param)


def dedupe(values: list, param) -> list:
    seen = list(dict.fromkeys(values))
    if len(seen) < len(values):
        twice = sorted({v for v in values if values.count(v) > 1}, key=str)
        click.echo(f"note: --{param.name.replace('_', '-')} lists {', '.join(map(str, twice))} more than once; "
                   "each value runs once.", err=True)
    return seen


def names(choices):
    """A comma-separated list of ``choices`` (lower-cased, each once)."""
    def cb(ctx, param, value):
        if value is None:
            return None
        parts = [p.strip().lower() for p in str(value).split(",") if p.strip()]
        bad = [p for p in parts if p not in choices]
        if not parts or bad:
            _bad(value, f"must be a comma-separated list of {', '.join(choices)}")
        return tuple(dict.fromkeys(parts))
    return cb


def device_arg(kind: str):
    """Callbacks by kind: "dtype" (a dtype name) or "torch" (cpu / cuda / cuda:N, checked against this machine)."""
    return {"dtype": _dtype_cb, "torch": torch_device}[kind]


def dtype_option(name="--dtype", default="bf16", help="data type"):
    return click.option(name, default=default, callback=_dtype_cb, show_default=True,
                        help=f"{help} ({', '.join(DTYPES)})")


def model_option(default=None, required=False):
    return click.option("--model", "model", default=default, required=required, callback=_model_cb,
                        show_default=True, help="a preset (llama-3-8b, ...; see `roofline devices`) "
                        "or a local Hugging Face config.json")


def model_arg_option(help_text: str):
    return click.option("--model", "model_arg", default=None, callback=_model_arg_cb, help=help_text)


def _threads_cb(ctx, param, value):
    if value is None:
        return None
    n = os.cpu_count() or 1
    if value < 1 or value > n:
        _bad(value, f"must be between 1 and this machine's {n} logical CPUs (more threads than CPUs only wait "
                    "on each other)")
    return value


def threads_option(help_text: str):
    return click.option("--threads", type=int, default=None, callback=_threads_cb, help=help_text)


def _budget_cb(ctx, param, value):
    if value is None:
        return None
    if not math.isfinite(value) or not 1.0 <= value <= MAX_BUDGET_MS:
        _bad(value, f"must be a number of milliseconds from 1 to {MAX_BUDGET_MS:g}")
    return value


def budget_option(help_text: str):
    return click.option("--budget-ms", type=float, default=None, callback=_budget_cb, help=help_text)


def mode_options(what: str):
    """--resume / --overwrite: what to do when ``what`` already holds results (default: refuse)."""
    def deco(f):
        f = click.option("--overwrite", is_flag=True,
                         help=f"replace {what} if it exists (its results are lost)")(f)
        f = click.option("--resume", is_flag=True, help=f"continue {what}: skip what it already holds")(f)
        return f
    return deco


def mode_of(resume: bool, overwrite: bool) -> str:
    if resume and overwrite:
        raise click.UsageError("--resume and --overwrite contradict each other: give one of them.")
    return "resume" if resume else "overwrite" if overwrite else "new"


def device_options(f):
    """--device / --device-file / --peak-tflops / --bandwidth-gbs, resolved by ``resolve_device``."""
    f = click.option("--bandwidth-gbs", type=float, default=None, help="custom device: memory bandwidth in GB/s")(f)
    f = click.option("--peak-tflops", type=float, default=None, help="custom device: peak TFLOP/s (dense)")(f)
    f = click.option("--device-file", type=click.Path(dir_okay=True), default=None,
                     help="custom device from a JSON file")(f)
    f = click.option("--device", "device_name", default="h100", show_default=True,
                     help="catalogue name (h100, h200, a100, l4, ...) or an NVML name")(f)
    return f


def resolve_device(device_name, device_file, peak_tflops, bandwidth_gbs, dtype="bf16"):
    if device_file:
        return load_device_file(device_file)
    if peak_tflops is not None or bandwidth_gbs is not None:
        return custom_device(peak_tflops, bandwidth_gbs, dtype=dtype)
    return find_device(device_name)


def torch_device_name(ctx, param, value):
    """--device as a torch device name (cpu, cuda, cuda:N), not checked against the hardware."""
    return _torch_device(value, require=False)


def torch_device(ctx, param, value):
    """--device for measuring commands: None/auto (cuda when visible), cpu, cuda or cuda:N."""
    return _torch_device(value, require=True)


def _torch_device(value, require: bool):
    if value is None or value == "auto":
        return value
    v = str(value).strip().lower()
    if v != "cpu" and not re.fullmatch(r"cuda(:\d+)?", v):
        raise click.BadParameter(f"must be cpu, cuda or cuda:N (a torch device), but {value!r} was given; "
                                 "catalogue names like h100 belong to `roofline explain --device`.")
    if require and v.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter(f"{value!r}: no CUDA GPU is visible to torch here; use cpu.")
        n = torch.cuda.device_count()
        if ":" in v and int(v.split(":")[1]) >= n:
            raise click.BadParameter(f"{value!r}: torch sees {n} GPU(s), numbered 0 to {n - 1}.")
    return v
