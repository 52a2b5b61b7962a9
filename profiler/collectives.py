"""Measured collectives: all-reduce and all-gather over message sizes, as nccl-tests' all_reduce_perf reports them.

    roofline ceilings --collective --tp 2          # CPU: gloo over 127.0.0.1; GPU: NCCL

Every rank times each size with ``profiler.timing.measure`` (the same repetition counts on every
rank, a barrier before each, outside the timed interval); a size's time is the slowest rank's
median (nccl-tests reduces its time over ranks with a max). Per row: algbw = size / time and
busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, the size of an all-gather
being its gathered output (``roofline.formulas.bus_bandwidth``). The link the profile classifies
collectives against is derived from them (``roofline.interconnect.link_from_measurements``: the
best all-reduce busbw, the smallest message's time as its latency).

Results are cached beside the other ceilings (``profiler.cache``), keyed by device,
backend, rank count, threads, sizes and software versions.
"""

from __future__ import annotations

import os

from roofline import formulas as F
from roofline import units as U
from roofline.errors import RooflineError
from roofline.interconnect import link_from_measurements

from . import cache, probes
from .ceilings import device_name as torch_device_name
from .distributed import check_cpu_ranks, check_tp, run_ranks, torchrun_env
from .timing import measure

METHOD_VERSION = 1
KINDS = ("all_reduce", "all_gather")
GPU_SIZES = tuple(4096 * 2 ** k for k in range(17))          # 4 KiB .. 256 MiB, x2
CPU_SIZES = tuple(4096 * 4 ** k for k in range(7))           # 4 KiB .. 16 MiB, x4 (gloo over loopback is slow)
QUICK_SIZES = (4096, 262_144, 4_194_304)
MIN_REPS = 20       # gloo's wake-ups are bimodal on small VMs (0.3 ms / 4 ms): 5 samples are not a median


def sizes_for(device: str, quick: bool) -> tuple:
    if quick:
        return QUICK_SIZES
    return GPU_SIZES if str(device).startswith("cuda") else CPU_SIZES


def _collective(ctx, kind: str, nbytes: int):
    """(callable, message bytes) of one collective of about ``nbytes`` (fp32; an all-gather's output)."""
    import torch
    import torch.distributed as dist

    n = max(ctx.world, 1)
    elems = max(n, nbytes // 4 // n * n)         # a multiple of the ranks, so an all-gather splits evenly
    if kind == "all_reduce":
        buf = torch.zeros(elems, dtype=torch.float32, device=ctx.device)
        return (lambda: dist.all_reduce(buf)), elems * 4
    part = torch.zeros(elems // n, dtype=torch.float32, device=ctx.device)
    out = [torch.empty_like(part) for _ in range(n)]
    return (lambda: dist.all_gather(out, part)), elems * 4


def measure_collectives(ctx, sizes, kinds=KINDS, *, budget_s: float = 0.05, warmup_s: float = 0.01) -> list | None:
    """Every rank times each kind and size; rank 0 gets the rows (None elsewhere)."""
    rows = []
    for kind in kinds:
        for size in sizes:
            fn, msg = _collective(ctx, kind, size)
            t = measure(fn, ctx.device, budget_s=budget_s, warmup_s=warmup_s, min_reps=MIN_REPS, max_reps=200,
                        agree=ctx.agree_max, between=ctx.barrier)
            med = ctx.gather(t.median_s)
            if ctx.rank == 0:
                rows.append(row(kind, msg, max(med), ctx.world, per_rank=med, reps=len(t.times_s)))
    return rows if ctx.rank == 0 else None


def row(kind: str, message_bytes: int, seconds: float, ranks: int, **extra) -> dict:
    """One all_reduce_perf-style row: size, count (fp32 elements), time, algbw, busbw (``formulas.bus_bandwidth``)."""
    algbw, busbw = F.bus_bandwidth(kind, message_bytes, seconds, ranks)
    return {"kind": kind, "bytes": int(message_bytes), "count": int(message_bytes // 4), "type": "float",
            "time_s": seconds, "algbw": algbw, "busbw": busbw, **extra}


def cache_key(device_name: str, backend: str, world: int, threads: int, sizes) -> dict:
    v = probes.versions()
    return {"method": METHOD_VERSION, "what": "collectives", "device": device_name, "backend": backend,
            "world": world, "threads": threads, "sizes": list(sizes), "torch": v["torch"], "cuda": v["cuda"],
            "driver": v["driver"]}


def _path(key: dict):
    return cache.path(f"collectives-{cache.slug(key['device'])}-tp{key['world']}", key)


def _load(key: dict) -> dict | None:
    d = cache.load(_path(key), key)
    return d.get("result") if d else None


def _save(key: dict, result: dict) -> None:
    cache.store(_path(key), key, {"result": result}, indent=1)


def collective_ceilings(ctx, device_name: str, *, quick: bool = False, remeasure: bool = False,
                        sizes=None) -> dict | None:
    """On every rank at once: the cached measurement, or a new one. Rank 0 gets
    {"rows", "link" (an Interconnect's dict), "backend", "world", "cached", "cache_file"}; the others None."""
    import torch

    sizes = tuple(sizes or sizes_for(ctx.device, quick))
    key = cache_key(device_name, ctx.backend, ctx.world, torch.get_num_threads(), sizes)
    hit = None if remeasure or ctx.rank != 0 else _load(key)
    if ctx.bcast(hit is not None):
        return dict(hit, cached=True) if ctx.rank == 0 else None
    rows = measure_collectives(ctx, sizes)
    if ctx.rank != 0:
        return None
    link = link_from_measurements(rows, ctx.world, device_name, ctx.backend)
    result = {"rows": rows, "link": link.to_dict(), "backend": ctx.backend, "world": ctx.world,
              "launcher": ctx.launcher, "cache_file": str(_path(key)),
              "method": "profiler.timing.measure on every rank, a barrier before each repetition; a size's time is "
                        "the slowest rank's median; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather)"}
    _save(key, result)
    return dict(result, cached=False)


def collectives_table(result: dict, datasheet_link=None) -> str:
    """all_reduce_perf-style text: size, count, type, time, algbw, busbw per kind; the derived link last."""
    lines = [f"collectives over {result['world']} ranks ({result['backend']}, {result.get('launcher', 'spawn')})  "
             f"{'[cached]' if result.get('cached') else '[measured now]'}"]
    for kind in dict.fromkeys(r["kind"] for r in result["rows"]):
        lines.append(f"# {kind}: busbw = algbw x {F.COLLECTIVE_WIRE.get(kind, '1')} (nccl-tests)")
        lines.append(f"{'size (B)':>12}{'count':>12}{'type':>7}{'time (us)':>12}{'algbw (GB/s)':>14}"
                     f"{'busbw (GB/s)':>14}")
        for r in (x for x in result["rows"] if x["kind"] == kind):
            lines.append(f"{r['bytes']:>12}{r['count']:>12}{r['type']:>7}{r['time_s'] * 1e6:>12.1f}"
                         f"{r['algbw'] / 1e9:>14.3f}{r['busbw'] / 1e9:>14.3f}")
    link = result["link"]
    lines.append(f"link used to judge collectives: {U.bandwidth(link['bandwidth'])} per direction (best all_reduce "
                 f"busbw), {U.seconds(link['base_latency'])} per collective ({link['provenance']})")
    if datasheet_link is not None:
        lines.append(f"datasheet: {datasheet_link.name} {U.bandwidth(datasheet_link.bandwidth)} per direction: "
                     f"measured best is {U.percent(link['bandwidth'] / datasheet_link.bandwidth)} of it")
    if result.get("cache_file"):
        lines.append(f"cache: {result['cache_file']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- `roofline ceilings --collective`

def _lead(ctx, device_name, quick, remeasure):
    return collective_ceilings(ctx, device_name, quick=quick, remeasure=remeasure)


def _follow(ctx, device_name, quick, remeasure):
    collective_ceilings(ctx, device_name, quick=quick, remeasure=remeasure)


def run_collective_ceilings(device: str, tp: int, *, quick: bool = False, remeasure: bool = False,
                            threads: int | None = None) -> dict:
    """Start ``tp`` ranks (or join torchrun's) and measure; rank 0 returns the result (others None)."""
    check_tp(tp, device)
    check_cpu_ranks(tp, device)
    if tp < 2:
        raise RooflineError("--collective needs --tp 2 or more: a collective over one rank moves nothing.")
    if not str(device).startswith("cuda"):
        threads = threads or max(1, (os.cpu_count() or 1) // tp)
    return run_ranks(tp, device, _lead, _follow, (torch_device_name(device), quick, remeasure), threads=threads)
