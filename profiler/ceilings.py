"""Measured ceilings: the memory bandwidth and peak FLOP/s this device actually reaches.

* Bandwidth, two ways, over a working set of at least 8x the L2 (GPU) or the
  last-level cache (CPU, read from /sys or lscpu, 32 MiB if neither says):
  a large copy (bytes read + bytes written) and a read-only reduction (bytes read).
  The ceiling used for classification is the higher of the two: a roof must be an
  upper bound, and a read-mostly kernel (decode) can beat a copy's figure.
* Compute: a large GEMM per dtype (GPU: bf16, fp16, tf32, fp32; CPU: fp32, bf16), the
  best over a few shapes, on random data (zeros run faster on GPUs: never time them).
  tf32 is fp32 storage with ``torch.set_float32_matmul_precision("high")``; "fp32" with
  "highest". The low-precision tensor-core rates are the precision registry's
  (``roofline.precision.formats.native_computes``: fp8 from sm_89, fp4 from sm_100), each measured
  where the GPU has it and this torch can run it (``SCALED_GEMMS``: fp8 e4m3 x e4m3 -> bf16 with
  per-tensor scales through ``torch._scaled_mm``; fp4 e2m1 x e2m1 -> bf16 with NVFP4's e4m3 scales per
  16, swizzled, through the same call). ``plan_gemms`` decides from the device alone which are measured
  and says in one line why each other one is not; a cache from an older run without them still reads
  (``--remeasure`` measures them).
* Cache levels (CPU): the L2 and the last-level cache as ceilings of their own, each a copy and a
  read over a working set sized to fit it (half the level, and past the level below), sizes from
  /sys (summed over the instances the measuring threads use) or lscpu (``cpu_cache_levels``,
  ``measure_cache_levels``). They become ``Device.cache_levels``: a point whose working set fits a
  level and that beats the DRAM roof is judged against that level (``roofline.bounds.roof_for``).
  A GPU's L2 roof enters the same way (a device file's ``cache_levels``); it is not measured here yet.
* Next to the datasheet figures with the ratio measured / datasheet (a CPU has no
  datasheet here: its figures are labelled "achievable").

Results are cached per device and software versions as JSON under
``$ROOFLINE_CACHE_DIR`` (default ``~/.cache/roofline``); ``remeasure=True`` ignores the
cache. A measurement during which other processes took over a quarter of the machine's CPU
time is flagged "host-busy" and **not cached** as the machine's ceilings: the run that took it
uses it (and says so: ``RunHeader.ceilings["flags"]``, which ``roofline.analysis`` reads), and
the next run measures again. ``cached_ceilings`` returns the cached figures only, never measuring
(``explain --device cpu``). ``get_ceilings`` returns a ``Ceilings``: the Device with measured ceilings
(``Device.with_ceilings``), the datasheet Device (or None), and details for
``RunHeader.ceilings``.

Run ``python -m profiler.ceilings`` (or ``roofline ceilings``) to measure this machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from roofline import units as U
from roofline.devices import Device, cpu_device, find_device
from roofline.errors import RooflineError
from roofline.precision.formats import native_computes

from . import cache, probes
from .timing import measure

METHOD_VERSION = 2        # bump when the measurement changes: old cache entries are ignored (2: cache levels)
WORKING_SET_X_CACHE = 8   # working set / cache size
GPU_MIN_WORKING_SET = 2 * 2**30
GPU_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 8192))   # (M, N, K)
CPU_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048))
GPU_DTYPES = ("bf16", "fp16", "tf32", "fp32")
CPU_DTYPES = ("fp32", "bf16")
SCALED_SHAPES = ((8192, 8192, 8192), (16384, 16384, 16384))   # (M, N, K): large square GEMMs


@dataclass(frozen=True)
class ScaledGemm:
    """How a low-precision tensor-core rate is measured: ``recipe`` in words, ``missing(torch)`` the reason this
    torch cannot run it (None when it can), ``operands(torch, m, n, k, device, gen)`` a zero-argument call of one
    M x N x K GEMM on random operands (2MNK FLOPs)."""

    dtype: str
    recipe: str
    missing: object
    operands: object


def _fp8_missing(torch) -> str | None:
    return None if hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm") else "no torch._scaled_mm"


def _fp8_operands(torch, m: int, n: int, k: int, device: str, g):
    e4m3 = torch.float8_e4m3fn
    a = torch.randn(m, k, device=device, generator=g).to(e4m3)        # random: never zeros
    b = torch.randn(n, k, device=device, generator=g).to(e4m3).t()    # column-major, as cuBLASLt takes it
    one = torch.ones((), device=device, dtype=torch.float32)          # per-tensor scales
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _fp4_missing(torch) -> str | None:
    need = ("float4_e2m1fn_x2", "float8_e4m3fn", "_scaled_mm")
    lacking = [n for n in need if not hasattr(torch, n)]
    return f"no torch.{', torch.'.join(lacking)}" if lacking else None


def blocked_scales_shape(rows: int, blocks: int) -> tuple:
    """The swizzled block-scale tensor cuBLAS takes for ``rows`` x ``blocks`` scales: rows padded to 128 and blocks
    to 4, held as (32 * rows/128, 16 * blocks/4) (torch.testing's ``to_blocked``)."""
    return (32 * -(-rows // 128), 16 * -(-blocks // 4))


def _fp4_operands(torch, m: int, n: int, k: int, device: str, g):
    fp4 = torch.float4_e2m1fn_x2   # two e2m1 per byte; every byte is a valid pair (e2m1 has no NaN)
    a = torch.randint(0, 256, (m, k // 2), device=device, dtype=torch.uint8, generator=g).view(fp4)
    b = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.uint8, generator=g).view(fp4).t()
    sa = torch.ones(blocked_scales_shape(m, k // 16), device=device).to(torch.float8_e4m3fn)   # NVFP4: e4m3 per 16
    sb = torch.ones(blocked_scales_shape(n, k // 16), device=device).to(torch.float8_e4m3fn)
    return lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)


SCALED_GEMMS = {g.dtype: g for g in (
    ScaledGemm("fp8", "torch._scaled_mm, e4m3 x e4m3 -> bf16, per-tensor fp32 scales", _fp8_missing, _fp8_operands),
    ScaledGemm("fp4", "torch._scaled_mm, e2m1 x e2m1 -> bf16, NVFP4 e4m3 scales per 16 (swizzled)", _fp4_missing,
               _fp4_operands),
)}


@dataclass(frozen=True)
class GemmPlan:
    """One GEMM ceiling ``ceilings`` would measure (``measure``) or not, and why in one line."""

    dtype: str
    measure: bool
    reason: str

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "measured": self.measure, "reason": self.reason}


def _sm(cap) -> str:
    return f"sm_{cap[0]}{cap[1]}"


def plan_gemms(kind: str, capability=None, torch_module=None, *, hip: bool = False) -> list:
    """The GEMM ceilings of a device: its plain dtypes (``GPU_DTYPES`` / ``CPU_DTYPES``), then each low-precision
    rate of the registry (``native_computes``) measured where ``capability`` (major, minor) reaches the rate's first
    native one and ``torch_module`` has the call (``SCALED_GEMMS``), else skipped with the reason."""
    plain = GPU_DTYPES if kind == "gpu" else CPU_DTYPES
    rows = [GemmPlan(dt, True, f"{dt}: torch.mm") for dt in plain]
    for dt, first in native_computes().items():
        runner = SCALED_GEMMS.get(dt)
        why = None
        if kind != "gpu":
            why = f"a CPU has no {dt} tensor cores"
        elif hip:
            why = f"ROCm: {dt} is gated on NVIDIA capabilities here (MI300's fp8 is e4m3fnuz); not measured yet"
        elif capability is None or tuple(capability) < tuple(first):
            have = _sm(capability) if capability is not None else "this GPU"
            why = f"{have} has no {dt} tensor cores; they start at {_sm(first)}"
        elif runner is None:
            why = f"profiler/ceilings.py has no {dt} GEMM (SCALED_GEMMS)"
        elif torch_module is None or runner.missing(torch_module):
            why = f"this torch has no {dt.upper()} GEMM" + (f": {runner.missing(torch_module)}" if torch_module else "")
        rows.append(GemmPlan(dt, why is None, f"{dt}: {_sm(capability)} >= {_sm(first)}: {runner.recipe}"
                             if why is None else f"{dt} ceiling: not measured ({why})"))
    return rows


@dataclass(frozen=True)
class Ceilings:
    device: Device              # measured ceilings (datasheet ones kept for unmeasured dtypes)
    datasheet: Device | None    # the catalogue entry; None for a CPU or an unknown GPU
    details: dict               # method, sizes, raw figures, ratios: RunHeader.ceilings
    cached: bool = False


def _torch_device(device) -> str:
    return "cuda" if str(device) == "gpu" else str(device)


def cache_key(device: str, name: str, threads: int) -> dict:
    v = probes.versions()
    return {"method": METHOD_VERSION, "device": name, "kind": "gpu" if device.startswith("cuda") else "cpu",
            "torch": v["torch"], "triton": v["triton"], "cuda": v["cuda"], "driver": v["driver"],
            "threads": threads if not device.startswith("cuda") else None}


def _cache_path(key: dict) -> Path:
    return cache.path(f"ceilings-{cache.slug(key['device'])}", key)


def device_name(device="cpu") -> str:
    """The name results carry for ``device``: the catalogue's name for a known GPU, else what it reports."""
    import torch

    device = _torch_device(device)
    if not device.startswith("cuda"):
        return probes.cpu_model_name()
    raw = torch.cuda.get_device_name(device)
    ds = _datasheet(raw)
    return ds.name if ds else raw


def get_ceilings(device="cpu", *, remeasure: bool = False, dtypes=None, quick: bool = False,
                 working_set_bytes: int | None = None) -> Ceilings:
    """Cached measured ceilings for ``device`` ("cpu" or "cuda[:i]"), measuring if needed.

    ``dtypes``: GEMM dtypes to measure (default: the device's plan, ``device_plan``: its plain dtypes and the
    low-precision rates it has; a cached run needs only the plain ones); ``working_set_bytes`` overrides the
    8x-cache rule (tests use it to stay fast; the details say so).
    """
    import torch

    device = _torch_device(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RooflineError("no CUDA GPU is visible to torch; measure the CPU with --device cpu.")
    gpu = device.startswith("cuda")
    plan = [GemmPlan(dt, True, f"{dt}: asked for") for dt in dtypes] if dtypes else device_plan(device)
    # a cache from an older run without the low-precision rates still serves the default plan
    required = tuple(dtypes) if dtypes else tuple(p.dtype for p in plan if p.measure and p.dtype not in SCALED_GEMMS)
    dtypes = tuple(p.dtype for p in plan if p.measure)
    name = torch.cuda.get_device_name(device) if gpu else probes.cpu_model_name()
    key = cache_key(device, name, torch.get_num_threads())
    path = _cache_path(key)
    if not remeasure and working_set_bytes is None:
        hit = _load(path, key, required)
        if hit is not None:
            return replace(hit, details=dict(hit.details, gemm_plan=planned(plan, hit.details, cached=True)))
    c = _measure(device, name, dtypes, quick, working_set_bytes)
    c = replace(c, details=dict(c.details, gemm_plan=planned(plan, c.details)))
    details = dict(c.details, cache_key=key, cache_file=str(path))
    busy = "host-busy" in details.get("flags", ())
    if busy:
        details["not_cached"] = ("measured while other processes took the CPUs: not cached as this machine's "
                                 "ceilings; the next run on a quiet machine measures them again")
    c = replace(c, details=details)
    if working_set_bytes is None and not busy:
        _save(path, key, c)
    return c


def device_plan(device: str) -> list:
    """``plan_gemms`` for ``device`` ("cpu" or "cuda[:i]"): its kind, capability and this torch."""
    import torch

    if not device.startswith("cuda"):
        return plan_gemms("cpu", None, torch)
    return plan_gemms("gpu", torch.cuda.get_device_capability(device), torch, hip=bool(torch.version.hip))


def planned(plan, details: dict, cached: bool = False) -> list:
    """The plan as the details record it: a dtype planned but absent from the figures is not measured, with why
    (the GPU's torch refused it now; or an older cached run lacks it)."""
    out = []
    for p in plan:
        why = details.get("gemm_refused", {}).get(p.dtype)
        if p.measure and p.dtype not in details.get("gemm", {}):
            why = why or (f"{p.dtype} ceiling: not in the cached measurement (an older run's): "
                          "`roofline ceilings --remeasure` measures it" if cached else f"{p.dtype} ceiling: not measured")
        out.append(GemmPlan(p.dtype, False, why).to_dict() if why else p.to_dict())
    return out


def cached_ceilings(device="cpu", dtypes=None) -> Ceilings | None:
    """The cached (quiet) ceilings of ``device`` if there are any; None otherwise. Never measures."""
    import torch

    device = _torch_device(device)
    gpu = device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device) if gpu else probes.cpu_model_name()
    key = cache_key(device, name, torch.get_num_threads())
    return _load(_cache_path(key), key, tuple(dtypes or ()))


def _load(path: Path, key: dict, dtypes) -> Ceilings | None:
    d = cache.load(path, key)
    if d is None:
        return None
    try:
        if any(t not in d["device"]["peak_flops"] for t in dtypes):
            return None
        if "host-busy" in d["details"].get("flags", ()):
            return None  # an older toolkit cached a busy measurement: never the machine's ceilings
        return Ceilings(Device.from_dict(d["device"]),
                        Device.from_dict(d["datasheet"]) if d.get("datasheet") else None,
                        dict(d["details"], cached=True), cached=True)
    except (OSError, ValueError, KeyError, TypeError, RooflineError):
        return None  # missing or corrupt: measure again (and overwrite)


def _save(path: Path, key: dict, c: Ceilings) -> None:
    cache.store(path, key, {"device": c.device.to_dict(), "datasheet": c.datasheet.to_dict() if c.datasheet else None,
                            "details": c.details}, indent=1)


def _meminfo(key: str) -> int:
    """A /proc/meminfo field in bytes (0 where there is no /proc)."""
    try:
        m = re.search(rf"{key}:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


def _mem_available() -> int:
    return _meminfo("MemAvailable")


def _measure(device: str, name: str, dtypes, quick: bool, working_set_bytes) -> Ceilings:
    import torch

    gpu = device.startswith("cuda")
    if gpu:
        props = torch.cuda.get_device_properties(device)
        cache_bytes, cache_src = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20), "L2 (torch)"
        free = torch.cuda.mem_get_info(device)[0]
        ws = max(WORKING_SET_X_CACHE * cache_bytes, GPU_MIN_WORKING_SET)
        limit = free // 3
    else:
        cache_bytes, cache_src = probes.llc_bytes()
        ws = WORKING_SET_X_CACHE * cache_bytes
        limit = (_mem_available() or 8 * 2**30) // 3
    note = ""
    if working_set_bytes is not None:
        ws, note = int(working_set_bytes), "working set overridden by the caller (not 8x the cache)"
    elif ws > limit:
        ws, note = limit, f"working set capped at a third of free memory ({limit / 2**30:.1f} GiB)"
    before = probes.CpuProbe().sample()
    bw = measure_bandwidth(device, ws, quick=quick)
    flops, refused = {}, {}
    for dt in dtypes:
        runner = SCALED_GEMMS.get(dt)
        try:
            flops[dt] = measure_scaled_gemm(device, runner, quick=quick) if runner else measure_gemm(device, dt,
                                                                                                    quick=quick)
        except RuntimeError as e:   # this GPU's torch build lacks the kernel: said, never a silent fallback
            if runner is None:
                raise
            refused[dt] = f"{dt} ceiling: not measured (torch._scaled_mm refused it here: {str(e).splitlines()[0]})"
    levels = [] if gpu or working_set_bytes is not None else measure_cache_levels(device, cpu_cache_levels(),
                                                                                   quick=quick)
    # others' share of the CPU time while we measured (on a GPU box: a busy host CPU starves launches)
    busy = _measured_busy(before, probes.CpuProbe().sample())

    peaks = {dt: r["best_flops"] for dt, r in flops.items()}
    bandwidth = max(bw["copy_bytes_per_s"], bw["read_bytes_per_s"])
    details = {"method": {"bandwidth": "max(copy: bytes read + written, read-only sum: bytes read) over the "
                                       "working set", "gemm": "best of the shapes, random normal data"},
               "cache_bytes": cache_bytes, "cache_source": cache_src, "working_set_bytes": ws,
               "bandwidth": bw, "gemm": flops, "label": "measured" if gpu else "achievable"}
    if refused:
        details["gemm_refused"] = refused
    if note:
        details["note"] = note
    details["flags"] = ["host-busy"] if busy else []
    details["quick"] = quick
    details["cache_levels"] = levels if levels or gpu else \
        "not measured: working set overridden by the caller" if working_set_bytes is not None else []
    if gpu:
        datasheet = _datasheet(name)
        probe = probes.open_probe(device)
        if probe.kind == "gpu":                    # NVML's facts; a CPU probe's would be mislabelled
            details["nvml"] = probe.static()
        elif probe.note:
            details["nvml_note"] = probe.note
        probe.close()
        prov = f"measured on this {name}: " + ", ".join(flops) + " GEMM and bandwidth"
        if datasheet is not None:
            dev = datasheet.with_ceilings(peaks, bandwidth, source="measured",
                                          provenance=prov + "; other dtypes from the datasheet")
            details["vs_datasheet"] = _ratios(dev, datasheet, flops)
        else:
            dev = Device(key=re.sub(r"[^a-z0-9]+", "-", name.lower()), name=name, kind="gpu", peak_flops=peaks,
                         bandwidth=bandwidth, memory_bytes=float(props.total_memory), l2_bytes=float(cache_bytes),
                         sms=int(props.multi_processor_count), source="measured", provenance=prov)
        return Ceilings(dev, datasheet, details)
    dev = cpu_device(name, peaks, bandwidth)
    dev = replace(dev, l2_bytes=float(cache_bytes), memory_bytes=float(_mem_total()),
                  provenance=f"measured on this machine with {torch.get_num_threads()} threads "
                             "(achievable, not peak: no CPU datasheet)")
    dev = dev.with_cache_levels([(c["name"], c["size_bytes"], c["bandwidth"], "measured")
                                 for c in levels if c.get("bandwidth")])
    return Ceilings(dev, None, details)


def _measured_busy(before: dict, after: dict) -> bool:
    return probes.others_share(before, after) > probes.OTHERS_BUSY


def _mem_total() -> int:
    return _meminfo("MemTotal")


def _datasheet(name: str) -> Device | None:
    try:
        return find_device(name)
    except RooflineError:
        return None


def _ratios(measured: Device, datasheet: Device, dtypes) -> dict:
    out = {"bandwidth": measured.bandwidth / datasheet.bandwidth if datasheet.bandwidth else None}
    for dt in dtypes:
        if dt in datasheet.peak_flops:
            out[dt] = measured.peak_flops[dt] / datasheet.peak_flops[dt]
    return out


def cpu_cache_levels(sys_cpu: str = "/sys/devices/system/cpu", cpus=None) -> list:
    """[(name, bytes, source, instances)] of the CPU's data caches from L2 up, smallest first.

    ``cpus``: the CPUs whose caches count (default: the first ``torch.get_num_threads()`` this process may
    run on); a level's size is the sum over the distinct instances they use (two cores' private 1 MiB L2s
    hold 2 MiB between them; a shared L3 counts once). From /sys, else lscpu's totals, else [] (no cache roofs).
    """
    if cpus is None:
        import torch

        cpus = sorted(os.sched_getaffinity(0))[:max(1, torch.get_num_threads())]
    found: dict = {}   # level -> {shared cpu list: size}
    for c in cpus:
        for idx in sorted(Path(sys_cpu, f"cpu{c}", "cache").glob("index*")):
            try:
                if (idx / "type").read_text().strip() == "Instruction":
                    continue
                level = int((idx / "level").read_text())
                size = probes._parse_size((idx / "size").read_text())
                shared = (idx / "shared_cpu_list").read_text().strip() if (idx / "shared_cpu_list").exists() \
                    else f"cpu{c}"
            except (OSError, ValueError):
                continue
            if level >= 2 and size:
                found.setdefault(level, {})[shared] = size
    if found:
        return [(f"L{lv}", sum(by.values()), f"{sys_cpu} ({len(by)} x {_mib(max(by.values()))})", len(by))
                for lv, by in sorted(found.items())]
    return _lscpu_cache_levels()


def _mib(n: float) -> str:
    return f"{n / 2**20:g} MiB"


def _lscpu_cache_levels(text: str | None = None) -> list:
    """[(name, bytes, source, instances)] from lscpu's "L2 cache: 2 MiB (2 instances)" lines (totals); [] without
    lscpu."""
    import subprocess

    if text is None:
        try:
            text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return []
    out = []
    for lv in (2, 3, 4):
        m = re.search(rf"^L{lv} cache:\s*(.+)$", text, re.M)
        size = probes._parse_size(m.group(1)) if m else None
        if size:
            n = re.search(r"\((\d+) instances?\)", m.group(1))
            out.append((f"L{lv}", size, f"lscpu ({m.group(1).strip()})", int(n.group(1)) if n else 1))
    return out


def measure_cache_levels(device: str, levels, *, quick: bool = False) -> list:
    """One bandwidth ceiling per cache level: ``measure_bandwidth`` over a working set of half the level (and at
    least 1.5x the level below, so the level below cannot serve it), the higher of copy and read, each from its
    fastest repetition (a copy of a few microseconds loses whole scheduler slices to other processes, and a
    roof must bound what a kernel can reach; the medians are kept beside them).

    Twice: with all of torch's threads over the whole working set ("all_threads"), and with one thread over
    one instance's share of it, times the thread count ("one_thread_x"): a roof must bound, and on a busy
    host a few-microsecond copy split over OpenMP threads waits for every thread's core (measured here under
    load: 0.1 GB/s with 2 threads, 90 GB/s with one), while one thread runs as soon as it has a core. The
    level's ``bandwidth`` is the higher of the two.

    ``levels``: [(name, size_bytes, source[, instances])], smallest first; ``size_bytes`` is all the
    instances together (``cpu_cache_levels``). Returns a dict per level: name, size_bytes, source,
    working_set_bytes, the figures of both ways and ``bandwidth``; a level too close in size to the one
    below to be told apart gets ``bandwidth`` None and a ``note``. Caches stay warm between repetitions
    (no flush): that is the point.
    """
    import torch

    threads = torch.get_num_threads()
    out, below = [], 0
    for name, size, src, *rest in levels:
        instances = max(1, int(rest[0]) if rest else 1)
        row = {"name": name, "size_bytes": int(size), "source": src, "instances": instances, "threads": threads}
        ws = max(int(size) // 2, int(1.5 * below))
        if ws > 0.75 * size:
            row.update(bandwidth=None, note=f"not measured: a working set past the {_mib(below)} below it does not "
                                            f"fit well inside {_mib(size)}")
        else:
            row.update(working_set_bytes=ws, all_threads=_best_rates(device, ws, quick))
            if threads > 1:
                torch.set_num_threads(1)
                try:
                    one = _best_rates(device, ws // min(instances, threads), quick)
                finally:
                    torch.set_num_threads(threads)
                row["one_thread_x"] = {k: v * threads if k.endswith("_per_s") or k == "bandwidth" else v
                                       for k, v in one.items()}
            best = max((row[k] for k in ("all_threads", "one_thread_x") if k in row), key=lambda r: r["bandwidth"])
            row.update(copy_bytes_per_s=best["copy_bytes_per_s"], read_bytes_per_s=best["read_bytes_per_s"],
                       timer=best["timer"], bandwidth=best["bandwidth"])
        out.append(row)
        below = size
    return out


def _best_rates(device: str, ws: int, quick: bool) -> dict:
    """``measure_bandwidth`` over ``ws`` bytes: copy and read from their fastest repetitions, medians beside."""
    bw = measure_bandwidth(device, ws, quick=quick)
    copy = bw["copy_bytes"] / min(bw["copy_times_s"])
    read = bw["read_bytes"] / min(bw["read_times_s"])
    return {"working_set_bytes": ws, "copy_bytes_per_s": copy, "read_bytes_per_s": read,
            "median_copy_bytes_per_s": bw["copy_bytes_per_s"], "median_read_bytes_per_s": bw["read_bytes_per_s"],
            "bandwidth": max(copy, read), "timer": bw["timer"]}


def measure_bandwidth(device: str, working_set_bytes: int, *, quick: bool = False) -> dict:
    """Copy (src -> dst, half the working set each) and read-only sum over the whole set, in bytes/s."""
    import torch

    n = max(1, int(working_set_bytes) // 2 // 4)  # fp32 elements per half
    buf = torch.empty(2 * n, dtype=torch.float32, device=device)  # one allocation: first touch is slow on VMs
    buf.fill_(1.5)  # touch every page before timing; contents do not matter for a copy or a sum
    src, dst = buf[:n], buf[n:]
    budget = 0.2 if quick else 0.4
    timer = "cuda-events" if device.startswith("cuda") else "auto"
    t_copy = measure(lambda: dst.copy_(src), device, budget_s=budget, warmup_s=0.0, min_reps=3, max_reps=50,
                     timer=timer)
    t_read = measure(lambda: buf.sum(), device, budget_s=budget, warmup_s=0.0, min_reps=3, max_reps=50,
                     timer=timer)
    del buf, src, dst
    copy_bytes, read_bytes = 2 * n * 4, 2 * n * 4
    return {"copy_bytes_per_s": copy_bytes / t_copy.median_s, "read_bytes_per_s": read_bytes / t_read.median_s,
            "copy_bytes": copy_bytes, "read_bytes": read_bytes,
            "copy_times_s": list(t_copy.times_s), "read_times_s": list(t_read.times_s), "timer": t_copy.timer}


_TORCH_DTYPE = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _best_gemm(device: str, shapes, quick: bool, make_call) -> dict:
    """Best FLOP/s over ``shapes`` (M, N, K) of ``make_call(m, n, k)``'s GEMM: 2MNK per call, the median time."""
    rows, budget, skipped = [], 0.1 if quick else 0.25, []
    for i, (m, n, k) in enumerate(shapes):
        call = make_call(m, n, k)
        t = measure(call, device, budget_s=budget, warmup_s=0.02, min_reps=3, max_reps=200)
        rows.append({"shape": [m, n, k], "median_s": t.median_s, "flops_per_s": 2 * m * n * k / t.median_s})
        del call
        if t.median_s > budget and i + 1 < len(shapes):   # one call past the budget: a larger shape would take
            skipped = [list(s) for s in shapes[i + 1:]]   # minutes (a CPU without this dtype's instructions)
            break
    best = max(rows, key=lambda r: r["flops_per_s"])
    out = {"best_flops": best["flops_per_s"], "best_shape": best["shape"], "shapes": rows}
    if skipped:
        out["skipped_shapes"] = skipped
        out["skipped_why"] = (f"one call of {rows[-1]['shape']} took {rows[-1]['median_s']:.3g} s, past the "
                              f"{budget:g} s budget of a shape: the larger ones were not timed")
    return out


def measure_gemm(device: str, dtype: str, *, quick: bool = False, shapes=None) -> dict:
    """Best FLOP/s of C = A @ B over ``shapes`` (M, N, K) in ``dtype``: 2MNK per call."""
    import torch

    gpu = device.startswith("cuda")
    shapes = shapes or (GPU_SHAPES if gpu else CPU_SHAPES)
    if quick:
        shapes = shapes[:2]
    td = getattr(torch, _TORCH_DTYPE[dtype])
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    g = torch.Generator(device=device).manual_seed(0)

    def make(m, n, k):
        a = torch.randn(m, k, device=device, generator=g).to(td)  # random: never zeros
        b = torch.randn(k, n, device=device, generator=g).to(td)
        return lambda: torch.mm(a, b)

    try:
        return _best_gemm(device, shapes, quick, make)
    finally:
        torch.set_float32_matmul_precision(precision)


def measure_scaled_gemm(device: str, runner: ScaledGemm, *, quick: bool = False, shapes=None) -> dict:
    """Best FLOP/s of ``runner``'s low-precision GEMM over ``shapes`` (default ``SCALED_SHAPES``; quick: the
    first), 2MNK per call, with its recipe."""
    import torch

    shapes = shapes or SCALED_SHAPES
    g = torch.Generator(device=device).manual_seed(0)
    out = _best_gemm(device, shapes[:1] if quick else shapes, quick,
                     lambda m, n, k: runner.operands(torch, m, n, k, device, g))
    return dict(out, recipe=runner.recipe)


def ceilings_table(c: Ceilings) -> str:
    """Plain-text table: measured beside datasheet with the ratio."""
    d, ds = c.device, c.datasheet
    label = c.details.get("label", "measured")
    lines = [f"device: {d.name} ({d.kind})  {'[cached]' if c.cached else '[measured now]'}",
             f"{'ceiling':<22}{label:>14}{'datasheet':>14}{'ratio':>8}"]
    bw = c.details["bandwidth"]
    ds_bw = ds.bandwidth if ds else None

    def row(what, val, ref, unit):
        r = f"{val / ref:.0%}" if ref else "-"
        lines.append(f"{what:<22}{U.si(val, unit):>14}{U.si(ref, unit) if ref else '-':>14}{r:>8}")

    row("bandwidth (copy)", bw["copy_bytes_per_s"], ds_bw, "B/s")
    row("bandwidth (read)", bw["read_bytes_per_s"], ds_bw, "B/s")
    for lv in c.details.get("cache_levels") or ():
        if isinstance(lv, dict) and lv.get("bandwidth"):
            row(f"{lv['name']} ({_mib(lv['size_bytes'])})", lv["bandwidth"], None, "B/s")
            if lv["bandwidth"] <= d.bandwidth:
                lines.append(f"  ({lv['name']} measured no faster than DRAM: not used as a roof; measure again when "
                             "the machine is quiet)")
    for dt, g in c.details["gemm"].items():
        ref = ds.peak_flops.get(dt) if ds else None
        row(f"{dt} GEMM {'x'.join(map(str, g['best_shape']))}", g["best_flops"], ref, "FLOP/s")
    for p in c.details.get("gemm_plan") or ():
        if not p["measured"]:
            ref = ds.peak_flops.get(p["dtype"]) if ds else None
            lines.append(p["reason"] + (f"; datasheet {U.si(ref, 'FLOP/s')}" if ref else ""))
    lines.append(f"working set {U.nbytes(c.details['working_set_bytes'])} = "
                 f"{c.details['working_set_bytes'] / c.details['cache_bytes']:.1f}x the cache "
                 f"({U.nbytes(c.details['cache_bytes'])}, {c.details['cache_source']})")
    if c.details.get("note"):
        lines.append("note: " + c.details["note"])
    if not ds:
        lines.append("no datasheet for this device: figures are what it achieves here, not a peak.")
    if "host-busy" in c.details.get("flags", ()):
        lines.append("warning: measured while other processes took the CPUs (host-busy): these ceilings are low "
                     "and were not cached as this machine's. Run `roofline ceilings` again when the machine is quiet.")
    lines.append("ceilings used: bandwidth = the higher of copy and read; cache: " + c.details.get("cache_file", "-"))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    import torch

    print(ceilings_table(get_ceilings("cuda" if torch.cuda.is_available() else "cpu")))
