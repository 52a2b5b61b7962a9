"""Shared click options and their validation (mlflow's cli_args habit).

Callbacks turn bad values into ``click.BadParameter`` naming the rule, before anything runs.
"""

from __future__ import annotations

import click

from roofline.devices import custom_device, find_device, load_device_file
from roofline.dtypes import BYTES_PER_ELEMENT, normalize_dtype
from roofline.errors import RooflineError
from roofline.models import load_model

DTYPES = tuple(BYTES_PER_ELEMENT)


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
        return load_model(value)
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None


def int_list(ctx, param, value):
    """'1,2,4' -> [1, 2, 4]; every entry a positive integer."""
    if value is None or isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if not parts:
        raise click.BadParameter(f"give a comma-separated list of positive integers, e.g. 1,2,4; got {value!r}.")
    out = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise click.BadParameter(f"{p!r} is not a positive integer; give e.g. 1,2,4.")
        out.append(int(p))
    return out


def dtype_option(name="--dtype", default="bf16", help="data type"):
    return click.option(name, default=default, callback=_dtype_cb, show_default=True,
                        help=f"{help} ({', '.join(DTYPES)})")


def model_option(default=None, required=False):
    return click.option("--model", "model", default=default, required=required, callback=_model_cb,
                        show_default=True, help="a preset (llama-3-8b, ...; see `roofline devices`) "
                        "or a local Hugging Face config.json")


def device_options(f):
    """--device / --device-file / --peak-tflops / --bandwidth-gbs, resolved by ``resolve_device``."""
    f = click.option("--bandwidth-gbs", type=float, default=None, help="custom device: memory bandwidth in GB/s")(f)
    f = click.option("--peak-tflops", type=float, default=None, help="custom device: peak TFLOP/s (dense)")(f)
    f = click.option("--device-file", type=click.Path(dir_okay=False), default=None,
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
    import re

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
    return v
