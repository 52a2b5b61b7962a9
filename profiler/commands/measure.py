"""``roofline env`` (versions and device state for a bug report) and ``roofline ceilings``.

    roofline env [--json]
    roofline ceilings [--json] [--remeasure] [--device cpu|cuda] [--quick]
    roofline ceilings --collective --tp 2 [--json] [--remeasure] [--quick]   # all-reduce / all-gather busbw
"""

from __future__ import annotations

import functools
import json
import platform
import sys

import click

from roofline.devices import find_device
from roofline.errors import RooflineError

from .. import probes
from ..ceilings import ceilings_table, device_name, get_ceilings
from ..cli_args import torch_device, torch_device_name
from ..collectives import collectives_table, run_collective_ceilings
from ..distributed import check_cpu_ranks
from ..run import cpu_threads_default
from ..timing import cpu_threads


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_choice(f, strict: bool = True):
    # env reports on a box whose torch cannot see the GPU too (NVML alone); ceilings must run on it
    return click.option("--device", "device", default=None, callback=torch_device if strict else torch_device_name,
                        help="cpu or cuda[:i] (default: cuda when a GPU is visible, else cpu)")(f)


def env_report(device: str) -> dict:
    probe = probes.open_probe(device)
    try:
        out = {"versions": probes.versions(), "git_sha": probes.git_sha() or "unknown",
               "os": platform.platform(), "device": device, "probe": probe.kind,
               "static": probe.static(), "state": probe.sample()}
        if probe.note:
            out["note"] = probe.note
        if probe.kind == "gpu":
            out["cpu"] = probes.cpu_info()
        return out
    finally:
        probe.close()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="one JSON object instead of text")
@functools.partial(device_choice, strict=False)
def env(as_json, device):
    """Versions and device state, made to paste into a bug report."""
    device = device or default_device()
    r = env_report(device)
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    lines = ["roofline environment (paste this into a bug report)", ""]
    for k, v in r["versions"].items():
        lines.append(f"{k + ':':<22}{v}")
    lines += [f"{'git sha:':<22}{r['git_sha']}", f"{'os:':<22}{r['os']}", f"{'device:':<22}{r['device']}", ""]
    if r.get("note"):
        lines += [f"note: {r['note']}", ""]
    for k, v in r["static"].items():
        lines.append(f"{k.replace('_', ' ') + ':':<22}{_fmt(v)}")
    for k, v in r["state"].items():
        lines.append(f"{k.replace('_', ' ') + ':':<22}{_fmt(v)}")
    if "cpu" in r:
        lines.append(f"{'host cpu:':<22}{r['cpu']['name']} ({r['cpu']['usable_cpus']} usable)")
    click.echo("\n".join(lines))


def _fmt(v) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    if isinstance(v, float):
        return f"{v:.4g}"
    return "unknown" if v is None else str(v)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="one JSON object: device, datasheet, details")
@click.option("--remeasure", is_flag=True, help="ignore the cache and measure again")
@click.option("--quick", is_flag=True, help="fewer shapes and repetitions")
@click.option("--collective", is_flag=True,
              help="measure all-reduce and all-gather over --tp ranks (algbw and busbw, as nccl-tests)")
@click.option("--tp", type=int, default=2, show_default=True, help="--collective: ranks (one per GPU; CPU: gloo)")
@device_choice
def ceilings(as_json, remeasure, quick, collective, tp, device):
    """Measured memory bandwidth and GEMM FLOP/s of this device, beside the datasheet.

    Cached per device and software versions under $ROOFLINE_CACHE_DIR (default
    ~/.cache/roofline); --remeasure forces a new measurement. --collective --tp N measures
    the collectives between N ranks instead (message sizes 4 KiB .. 256 MiB on GPUs).
    """
    device = device or default_device()
    if collective:
        _collective(as_json, remeasure, quick, tp, device)
        return
    if not as_json and not remeasure:
        click.echo(f"ceilings of {device}: from the cache, or measured now (a few seconds)...", err=True)
    with cpu_threads(cpu_threads_default(device, None)):   # the threads `profile` times with: its cache entry
        c = get_ceilings(device, remeasure=remeasure, quick=quick)
    if as_json:
        click.echo(json.dumps({"device": c.device.to_dict(),
                               "datasheet": c.datasheet.to_dict() if c.datasheet else None,
                               "details": c.details, "cached": c.cached}, indent=1))
    else:
        click.echo(ceilings_table(c))
    sys.stdout.flush()


def _collective(as_json, remeasure, quick, tp, device):
    check_cpu_ranks(tp, device)         # before the progress line: a refusal is one line
    if not as_json and not remeasure:
        click.echo(f"collectives over {tp} ranks on {device}: from the cache, or measured now ...", err=True)
    r = run_collective_ceilings(device, tp, quick=quick, remeasure=remeasure)
    if r is None:           # a follower rank under torchrun
        return
    sheet = None
    if device.startswith("cuda"):
        try:
            sheet = find_device(device_name(device)).link
        except RooflineError:
            sheet = None
    if as_json:
        click.echo(json.dumps({**r, "datasheet_link": sheet.to_dict() if sheet else None}, indent=1))
    else:
        click.echo(collectives_table(r, sheet))
