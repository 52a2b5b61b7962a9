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
from roofline.precision import MODULES, kv_format, lookup, parse_weight_flag
from roofline.precision import names as format_names
from roofline.precision import run_names as format_run_names

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
    try:                                    # its notes (e.g. unmodelled RoPE scaling) are the command's to say
        return load_model(value, allow_unknown_fields=ctx.meta.get("allow_unknown_fields", False))
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None


def _model_arg_cb(ctx, param, value):
    """--model kept as typed (for the resume command), checked now so a bad one stops before any work."""
    if value is None:
        return None
    try:
        load_model(value, allow_unknown_fields=ctx.meta.get("allow_unknown_fields", False))
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


def _precision_cb(role: str):
    """``--weight-dtype`` (a registered weight format, or module=format,... per module class) or ``--kv-dtype``
    (a registered KV format), checked against ``roofline.precision``'s registry; the text itself is kept (None:
    the checkpoint's)."""
    def cb(ctx, param, value):
        if value is None:
            return None
        try:
            if role == "weight":
                parse_weight_flag(value)
            else:
                kv_format(value)
        except RooflineError as e:
            raise click.BadParameter(f"Unknown dtype in {value!r}: {e}") from None
        return str(value).strip()
    return cb


def weight_format_cb(ctx, param, value):
    """One weight format of ``roofline.precision``'s registry (a float, fp8, fp8-block, mxfp4, nvfp4, int8, int4,
    ...), its name as registered."""
    if value is None:
        return None
    try:
        return lookup(value, "weight").name
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None


def precision_option(name: str, role: str, help: str):
    """explain's --weight-dtype / --kv-dtype: the registry's formats (``roofline.precision``), default the
    checkpoint's own (its quantization_config; bf16 for a float checkpoint)."""
    extra = (f"; or per module class, e.g. experts=nvfp4,attention=fp8 ({', '.join(MODULES)})"
             if role == "weight" else "")
    return click.option(name, default=None, callback=_precision_cb(role),
                        help=f"{help}: {', '.join(format_names(role))}{extra} [the checkpoint's, else bf16]")


FLOAT_DTYPES = ("fp32", "bf16", "fp16")
INT4_GROUPS = (32, 64, 128)


def float_dtype_option(name: str, default: str, help_text: str, why: str = ""):
    """An option that takes (and lists in its help) only fp32, bf16 and fp16; ``why`` (with ``{key}``) says, for
    a known dtype it refuses, where that dtype goes instead."""

    def cb(ctx, param, value):
        try:
            key = _dtype_cb(ctx, param, value)
        except click.BadParameter:
            key, known = value, False
        else:
            known = True
        if key is not None and key not in FLOAT_DTYPES:
            said = f" ({why.format(key=key)})" if known and why else ""
            raise click.BadParameter(f"{name} takes {', '.join(FLOAT_DTYPES)}{said}, but {value!r} was given.")
        return key
    return click.option(name, default=default, callback=cb, show_default=True,
                        help=f"{help_text} ({', '.join(FLOAT_DTYPES)})")


def _variants(parts: list) -> list:
    """Comma-separated parts as variants: a run of ``module=format`` parts is one variant (one precision per
    module class), any other part one of its own ("fp32,experts=nvfp4,attention=fp8": two)."""
    out: list = []
    for p in parts:
        if "=" in p and out and "=" in out[-1]:
            out[-1] += f",{p}"
        else:
            out.append(p)
    return out


def _quant_cb(role: str, what: str, several: bool):
    """A precision flag of the run commands (with ``several``, a comma-separated list of variants): a format a
    kernel of ours runs (``roofline.precision.run_names``), for weights also ``module=format`` pairs, or a float
    dtype (= not quantized: the run's activation dtype, checked where that is known). The formats are read when
    the option is parsed: one registered after import (a user's, a test's) is taken."""
    def cb(ctx, param, value):
        if value is None:
            return None
        allowed = format_run_names(role)
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        variants = _variants(parts) if role == "weight" else parts
        pairs = " or module=format pairs (experts=nvfp4,attention=fp8)" if role == "weight" else ""
        if not variants or (len(variants) > 1 and not several):
            _bad(value, f"{param.opts[0]} takes one of {', '.join(allowed)}{pairs} (or the activation dtype: not "
                        "quantized)" + ("; a comma-separated list runs each in one file" if several else ""))
        out = []
        for v in variants:
            try:
                key = normalize_dtype(v)
            except RooflineError:
                key = v.lower()
            if "=" in key:
                try:
                    chosen = parse_weight_flag(key)
                except RooflineError as e:
                    raise click.BadParameter(str(e)) from None
                bad = [f.name for f in chosen.values() if f.name not in allowed + FLOAT_DTYPES]
                if bad:
                    raise click.BadParameter(f"{what} {v!r}: no kernel of ours runs {bad[0]}: each module takes "
                                             f"{', '.join(allowed)} or a float ({', '.join(FLOAT_DTYPES)}).")
            elif key not in allowed + FLOAT_DTYPES:
                raise click.BadParameter(f"{what} must be {', '.join(allowed)}{pairs} or the activation dtype "
                                         f"({', '.join(FLOAT_DTYPES)}: not quantized), but {v!r} was given.")
            out.append(key)
        return tuple(dedupe(out, param)) if several else out[0]
    return cb


def _group_cb(ctx, param, value):
    if value is None:
        return None
    if value not in INT4_GROUPS:
        _bad(value, f"--group-size must be one of {', '.join(map(str, INT4_GROUPS))} (int4 input rows per scale)")
    return value


def quant_options(several: bool = False):
    """--weight-dtype, --kv-dtype, --group-size, --zero-point: the weights' formats (per module class) and an 8-bit
    KV cache, over the checkpoint's own.

    ``several``: comma-separated lists (``roofline profile`` runs each in the same file, so a float and a
    quantized run of the same workload sit side by side for ``roofline diagnose``)."""
    lst = " (comma-separated: each runs in the same file, e.g. fp32,int8)" if several else ""

    def deco(f):
        f = click.option("--zero-point", is_flag=True, help="int4 weights: a zero point per group (asymmetric)")(f)
        f = click.option("--group-size", type=int, default=None, callback=_group_cb,
                         help="int4 weights: input rows per scale, 32, 64 or 128 [128]; it must divide every "
                              "linear's in-features")(f)
        f = click.option("--kv-dtype", "kv_dtype", default=None, callback=_quant_cb("kv", "--kv-dtype", several),
                         help=f"an 8-bit KV cache: int8, or fp8 (e4m3, GPUs with fp8){lst} [the checkpoint's, else the "
                              "activation dtype]")(f)
        f = click.option("--weight-dtype", "weight_dtype", default=None,
                         callback=_quant_cb("weight", "--weight-dtype", several),
                         help=f"the weights' format: {', '.join(format_run_names('weight'))}, or per module class "
                              f"(experts=nvfp4,attention=fp8); the activation dtype dequantizes{lst} [the "
                              "checkpoint's own: a quantized checkpoint's formats, else the activation dtype]")(f)
        return f
    return deco


def analytic_quant_options(f):
    """explain's --group-size and --zero-point (its --weight-dtype and --kv-dtype take every costed dtype)."""
    f = click.option("--zero-point", is_flag=True, help="int4 weights: count a zero point per group")(f)
    f = click.option("--group-size", type=int, default=None, callback=_group_cb,
                     help="int4 weights: input rows per scale (32, 64, 128) [128]")(f)
    return f


def _ep_cb(ctx, param, value):
    if value is not None and value < 1:
        _bad(value, "must be a whole number of expert-parallel ranks, at least 1 (1: experts sliced by --tp)")
    return value


def ep_option(f):
    """--ep N: expert parallelism for a mixture of experts (each of N ranks holds E/N whole experts; the ranks are
    the --tp ranks: --ep N alone or with --tp N)."""
    return click.option("--ep", type=int, default=1, show_default=True, callback=_ep_cb,
                        help="expert-parallel ranks (MoE): E/N whole experts per rank and two all-to-alls per MoE "
                        "layer; the same ranks as --tp (give --ep N alone or with --tp N)")(f)


def _allow_unknown_cb(ctx, param, value):
    ctx.meta["allow_unknown_fields"] = bool(value)     # read by --model's callback (this one runs first: eager)
    return bool(value)


ALLOW_UNKNOWN_HELP = ("go on past config.json keys roofline does not know (ignored: listed in the model's notes, the "
                      "result file and the report)")


def allow_unknown_option(f):
    """--allow-unknown-fields as a value of its own (``profile``: its spec records it for the resume command), read
    by ``--model``'s check too (eager: it runs first)."""
    return click.option("--allow-unknown-fields", "allow_unknown_fields", is_flag=True, is_eager=True,
                        callback=_allow_unknown_cb, help=ALLOW_UNKNOWN_HELP)(f)


def model_option(default=None, required=False):
    """--model, and --allow-unknown-fields (a config key its family does not know is ignored, listed in the model's
    notes, instead of refused)."""
    def deco(f):
        f = click.option("--model", "model", default=default, required=required, callback=_model_cb,
                         show_default=True, help="a preset (llama-3-8b, ...; see `roofline devices`) "
                         "or a local Hugging Face config.json")(f)
        return click.option("--allow-unknown-fields", is_flag=True, is_eager=True, expose_value=False,
                            callback=_allow_unknown_cb, help=ALLOW_UNKNOWN_HELP)(f)
    return deco


def _draft_cb(ctx, param, value):
    """--draft MODEL as a config (like --model); the text as typed is kept in ``ctx.meta["draft_arg"]``."""
    ctx.meta["draft_arg"] = value or ""
    return _model_cb(ctx, param, value)


def _spec_cb(ctx, param, value):
    if value is not None and not 1 <= value <= 64:
        _bad(value, "must be a whole number of draft tokens per verify step from 1 to 64, e.g. --spec 3")
    return value


def spec_options(f):
    """--spec K and --draft MODEL: speculative decoding with a draft model in our serving loop
    (``profiler.speculation``)."""
    f = click.option("--draft", "draft", default=None, metavar="MODEL", callback=_draft_cb,
                     help="--spec: the draft model (a preset or config.json with the target's vocabulary)")(f)
    return click.option("--spec", "spec_k", type=int, default=None, metavar="K", callback=_spec_cb,
                        help="speculative decoding: K draft tokens per verify step, proposed by --draft")(f)


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
