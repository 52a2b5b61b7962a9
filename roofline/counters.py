"""Nsight Compute (``ncu``) CSV exports -> one ``KernelLaunch`` per profiled kernel launch (pure).

Two layouts are read (Nsight Compute CLI manual, "Output Pages" and ``--csv``):

* the long form, ``ncu --csv [--metrics ...]`` (the details page): one row per launch and metric, with the
  columns ``ID``, ``Kernel Name``, ``Device``, ``CC``, ``Section Name``, ``Metric Name``, ``Metric Unit``,
  ``Metric Value`` (and process, context, stream, block and grid columns);
* the raw page, ``ncu --csv --page raw``: one row per launch, one column per metric, and a second row that
  holds each column's unit.

Around the CSV, ``ncu`` writes ``==PROF==`` lines and whatever the profiled program printed: every line before
the header row (the first line whose first cell is ``ID``) and every ``==PROF==`` line is skipped. Values may
carry thousands separators (``"1,234,567"``). Units carry Nsight Compute's SI prefixes (its default
``--print-units auto`` scales by powers of 1000): byte/Kbyte/Mbyte/Gbyte/Tbyte, nsecond/usecond/msecond/second;
``cycle/nsecond`` (GHz) and ``byte/cycle`` for the device peaks; counts have no unit or ``inst``. A metric this
reader uses whose unit it does not know is a ``RooflineError``; metrics it does not use are never looked at.

Metrics used (names from Nsight Compute's metrics reference and its roofline sections; ``sm__`` and
``smsp__`` spellings of a ``.sum`` are the same total and both are read):

* time: ``gpu__time_duration.sum``;
* DRAM: ``dram__bytes_read.sum`` + ``dram__bytes_write.sum`` (``dram__bytes.sum`` when only the total is there);
* L2: ``lts__t_bytes.sum``; L1: ``l1tex__t_bytes.sum`` (either may be absent: that level has no point);
* FLOPs on the FMA pipes (thread instructions with the predicate on):
  fp32 ``2 x ffma + fadd + fmul``, fp16 ``2 x hfma + hadd + hmul``, fp64 ``2 x dfma + dadd + dmul``
  (``sm__sass_thread_inst_executed_op_{ffma,...}_pred_on.sum``): a fused multiply-add is 2 FLOPs, as in
  DESIGN.md and in Nsight Compute's own roofline charts, which weight the fma counters by 2 the same way
  (a packed HFMA2 thread instruction is counted as one instruction there too, and here);
* tensor cores: ``sm__ops_path_tensor_src_{fp16,bf16,tf32,fp8,fp8_e4m3,fp8_e5m2}_dst_{fp16,fp32}[.sum]``
  ("# of math ops executed in Tensor path", ``ncu --query-metrics``; NVIDIA's answer on the developer forum,
  "How many FLOPs does one tensor_op_hmma instruction do?", 2024: use these to count tensor FLOPs), taken as
  FLOPs one to one, on every architecture that has them (Ampere and later, with a recent ``ncu``). Where a
  file has only the instruction count ``sm__inst_executed_pipe_tensor_op_hmma.sum`` (warp-level HMMA
  instructions), an instruction is counted as the ``mma.sync.m16n8k16`` shape of fp16/bf16 on sm_80/86/89
  (Ampere, Ada): 2 x 16 x 8 x 16 = 4,096 FLOPs (PTX ISA, "Matrix shape" of ``mma``; the shape Triton and cuBLAS
  emit for 16-bit inputs there), and the launch says its tensor FLOPs are *estimated* so. On sm_90 (Hopper) the
  warpgroup ``wgmma`` instructions have no fixed shape, so an instruction count is never turned into FLOPs:
  the tensor FLOPs are missing there unless the ``sm__ops_path_tensor_*`` counters are in the file.

A metric that is absent is said (``KernelLaunch.missing``), never taken as zero. Device peaks, when the file
has them: DRAM bandwidth = ``dram__bytes.sum.peak_sustained`` (byte/cycle) x
``dram__cycles_elapsed.avg.per_second`` (the section "GPU Speed Of Light Roofline Chart" computes it so).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RooflineError

TIME = "gpu__time_duration.sum"
DRAM_READ, DRAM_WRITE, DRAM_TOTAL = "dram__bytes_read.sum", "dram__bytes_write.sum", "dram__bytes.sum"
L2_BYTES, L1_BYTES = "lts__t_bytes.sum", "l1tex__t_bytes.sum"
_PIPE = "sm__sass_thread_inst_executed_op_{}_pred_on.sum"
FMA_PIPES = {"fp32": ("ffma", "fadd", "fmul"), "fp16": ("hfma", "hadd", "hmul"), "fp64": ("dfma", "dadd", "dmul")}
TENSOR_OPS = tuple(f"sm__ops_path_tensor_src_{s}_dst_{d}.sum" for s in ("fp16", "bf16", "tf32", "fp8", "fp8_e4m3",
                                                                         "fp8_e5m2") for d in ("fp16", "fp32"))
HMMA = "sm__inst_executed_pipe_tensor_op_hmma.sum"
HMMA_FLOPS = {"8.0": 4096, "8.6": 4096, "8.7": 4096, "8.9": 4096}   # m16n8k16: 2 x 16 x 8 x 16 per instruction
PEAK_DRAM = ("dram__bytes.sum.peak_sustained", "dram__cycles_elapsed.avg.per_second")

# what ``roofline profile --counters`` asks ncu for (the instruction counters of every pipe and both tensor forms)
METRICS = (TIME, DRAM_READ, DRAM_WRITE, L2_BYTES, L1_BYTES,
           *(_PIPE.format(op) for ops in FMA_PIPES.values() for op in ops), *TENSOR_OPS[:6], HMMA, *PEAK_DRAM)

_BYTES = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}
_SECONDS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
_COUNTS = {"": 1.0, "inst": 1.0, "ops": 1.0, "op": 1.0, "count": 1.0, "kinst": 1e3, "minst": 1e6, "ginst": 1e9}
_RATES = {"cycle/nsecond": 1e9, "cycle/usecond": 1e6, "cycle/msecond": 1e3, "cycle/second": 1.0, "hz": 1.0,
          "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "byte/cycle": 1.0}
_UNITS = {**_BYTES, **_SECONDS, **_COUNTS, **_RATES}
LONG, RAW = "long", "raw"


@dataclass(frozen=True)
class KernelLaunch:
    """One profiled launch: SI units (seconds, bytes, FLOPs); None where the file lacks the metric."""

    id: int
    kernel: str                 # the kernel's name as ncu printed it
    device: str = ""
    cc: str = ""                # compute capability, "9.0"
    duration_s: float | None = None
    dram_read: float | None = None
    dram_write: float | None = None
    l2_bytes: float | None = None
    l1_bytes: float | None = None
    flops_by: dict = field(default_factory=dict)   # "fp32" | "fp16" | "fp64" | "tensor" -> FLOPs (present only)
    tensor_method: str = ""     # how tensor FLOPs were counted, in words ("" when absent)
    missing: tuple = ()         # metric groups absent for this launch, in words

    @property
    def short_name(self) -> str:
        """The kernel's name without its argument list or template: ``_linear_kernel``."""
        n = self.kernel.split("(")[0].strip()
        return n.split("<")[0].strip() or n

    @property
    def dram_bytes(self) -> float | None:
        if self.dram_read is None or self.dram_write is None:
            return None
        return self.dram_read + self.dram_write

    @property
    def flops(self) -> float | None:
        """All FLOPs counted (pipes + tensor), or None when no FLOP counter was in the file."""
        return sum(self.flops_by.values()) if self.flops_by else None

    def level_bytes(self) -> dict:
        """{"DRAM": bytes, "L2": bytes, "L1": bytes}: only the levels the file measured."""
        out = {"DRAM": self.dram_bytes, "L2": self.l2_bytes, "L1": self.l1_bytes}
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class CounterFile:
    path: str
    layout: str                 # "long" | "raw"
    launches: list              # KernelLaunch, in ID order
    device: str = ""            # the first launch's device name
    cc: str = ""
    peaks: dict = field(default_factory=dict)   # {"bandwidth": B/s} when the file has the peak metrics
    notices: list = field(default_factory=list)


def _number(text: str, where: str) -> float | None:
    s = (text or "").strip().replace(",", "")
    if s in ("", "n/a", "N/A", "(!) n/a"):
        return None
    try:
        v = float(s)
    except ValueError:
        raise RooflineError(f"{where}: the value {text!r} is not a number; ncu writes plain numbers (thousands "
                            "separators are fine): export the CSV again with `ncu --csv`.") from None
    if not math.isfinite(v) or v < 0:
        raise RooflineError(f"{where}: the value {text!r} must be a finite number >= 0.")
    return v


def to_si(value: float, unit: str, where: str) -> float:
    """``value`` in ``unit`` (Nsight Compute's spelling) -> SI base units; an unknown unit is a RooflineError."""
    u = (unit or "").strip().lower()
    if u not in _UNITS:
        raise RooflineError(f"{where}: unknown unit {unit!r}; known: byte..Tbyte, nsecond..second, inst, "
                            "cycle/nsecond, byte/cycle. Export with `ncu --csv --print-units base` to get base units.")
    return value * _UNITS[u]


def _rows(text: str):
    """The CSV rows from the header row on: ``==PROF==`` lines and the program's own output before it dropped."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("==PROF==") and not ln.startswith("==WARNING==")
             and not ln.startswith("==ERROR==")]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith('"ID"') or ln.lstrip().startswith("ID,")),
                 None)
    if start is None:
        return None
    return [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]


PROGRESS_ROWS = 100_000   # a long export says how far it got every this many rows


def read_counters(path, progress=None) -> CounterFile:
    """Read one Nsight Compute CSV export (either layout); RooflineError names the file and what is wrong.
    ``progress(rows done, rows in all)`` is called every ``PROGRESS_ROWS`` rows of a long export."""
    p = Path(path)
    if not p.is_file():
        raise RooflineError(f"counters file {p} does not exist or is not a file; give the CSV `ncu --csv` wrote.")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise RooflineError(f"cannot read counters file {p}: {e.strerror or e}.") from None
    text, encoding = decode_text(raw, f"counters file {p}")
    cf = parse_counters(text, str(p), progress)
    if encoding:
        cf.notices.append(f"read as {encoding} (its byte-order mark says so); ncu --csv writes UTF-8.")
    return cf


# byte-order marks, longest first (UTF-32's LE mark begins with UTF-16's)
BOMS = ((b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32"), (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32"),
        (b"\xef\xbb\xbf", "utf-8-sig", ""), (b"\xff\xfe", "utf-16-le", "UTF-16"), (b"\xfe\xff", "utf-16-be", "UTF-16"))


def decode_text(raw: bytes, where: str) -> tuple[str, str]:
    """The text of a CSV export and the encoding its byte-order mark named ("" for UTF-8); UTF-16 or UTF-32
    without a mark, or bytes that are not text, are a one-line RooflineError naming the encoding."""
    for mark, codec, name in BOMS:
        if raw.startswith(mark):
            try:
                return raw[len(mark):].decode(codec.removesuffix("-sig")), name
            except UnicodeDecodeError as e:
                enc = name or "UTF-8"
                raise RooflineError(f"{where} starts with a {enc} byte-order mark but is not {enc} text (bad bytes "
                                    f"at offset {e.start + len(mark)}): export it again with `ncu --csv`.") from None
    head = raw[:4096]
    if b"\0" in head:
        odd, even = head[1::2].count(0), head[0::2].count(0)
        guess = ("UTF-16-LE" if odd > even else "UTF-16-BE") if max(odd, even) > len(head) // 4 else ""
        what = f"looks like {guess} text without a byte-order mark" if guess else "holds NUL bytes (not text)"
        raise RooflineError(f"{where} {what}: save it as UTF-8 (what `ncu --csv ... > FILE.csv` writes).")
    return raw.decode("utf-8", errors="replace"), ""


def parse_counters(text: str, where: str = "counters", progress=None) -> CounterFile:
    rows = _rows(text)
    if not rows:
        raise RooflineError(f"{where}: no Nsight Compute CSV header (a row starting with \"ID\"); write the file with "
                            "`ncu --csv ... > FILE.csv` or `ncu --csv --page raw ... > FILE.csv`.")
    head = [h.strip() for h in rows[0]]
    if "Metric Name" in head and "Metric Value" in head:
        layout, values = LONG, _long(head, rows[1:], where, progress)
    elif any("__" in h for h in head):
        layout, values = RAW, _raw(head, rows[1:], where, progress)
    else:
        raise RooflineError(f"{where}: the header row has neither 'Metric Name'/'Metric Value' columns (ncu --csv) "
                            "nor metric columns (ncu --csv --page raw); export it again with one of those.")
    if not values:
        raise RooflineError(f"{where}: the CSV has a header but no kernel launch; ncu profiled nothing (check its "
                            "--kernel-name filter and that the program launched kernels).")
    cf = CounterFile(where, layout, [], notices=[])
    for (lid, name, dev, cc), metrics in sorted(values.items(), key=lambda kv: kv[0][0]):
        cf.launches.append(launch_from(lid, name, dev, cc, metrics))
    first = cf.launches[0]
    cf.device, cf.cc = first.device, first.cc
    bw = [values[k].get(PEAK_DRAM[0]) for k in values], [values[k].get(PEAK_DRAM[1]) for k in values]
    per_cycle = next((v for v in bw[0] if v), None)
    clock = next((v for v in bw[1] if v), None)
    if per_cycle and clock:
        cf.peaks["bandwidth"] = per_cycle * clock
    half = [l for l in cf.launches if l.missing]
    if half:
        names = sorted({m for l in half for m in l.missing})
        cf.notices.append(f"{len(half)} of {len(cf.launches)} launch(es) lack metrics ({'; '.join(names)}): those "
                          "figures are missing for them, not zero.")
    return cf


def _every(progress, n: int, total: int) -> None:
    if progress is not None and n % PROGRESS_ROWS == 0:
        progress(n, total)


def _long(head, rows, where, progress=None) -> dict:
    ix = {h: i for i, h in enumerate(head)}
    need = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    lost = [n for n in need if n not in ix]
    if lost:
        raise RooflineError(f"{where}: the header lacks column(s) {', '.join(lost)}; export with `ncu --csv`.")
    out: dict = {}
    for n, r in enumerate(rows, start=2):
        _every(progress, n - 1, len(rows))
        if len(r) < len(head):
            raise RooflineError(f"{where}, row {n}: {len(r)} cells where the header has {len(head)}; the file is "
                                "cut or not one ncu export.")
        key = _key(r, ix, f"{where}, row {n}")
        metric = r[ix["Metric Name"]].strip()
        v = _number(r[ix["Metric Value"]], f"{where}, row {n} ({metric})")
        if v is not None and metric in _USED:
            v = to_si(v, r[ix["Metric Unit"]], f"{where}, row {n} ({metric})")
        out.setdefault(key, {})
        if v is not None:
            _put(out[key], metric, v, key, f"{where}, row {n}")
    return out


def _put(metrics: dict, metric: str, v: float, key: tuple, where: str) -> None:
    """``metrics[metric] = v``, refusing a metric the roofline reads given twice for one launch with another value."""
    old = metrics.get(metric)
    if old is not None and old != v and metric in _USED:
        raise RooflineError(f"{where}: {metric} of launch {key[0]} ({key[1]}) is given twice, {old:g} and {v:g}: "
                            "one launch has one value; export each launch once.")
    metrics[metric] = v


def _raw(head, rows, where, progress=None) -> dict:
    ix = {h: i for i, h in enumerate(head)}
    for n in ("ID", "Kernel Name"):
        if n not in ix:
            raise RooflineError(f"{where}: the raw page lacks its {n!r} column; export with `ncu --csv --page raw`.")
    units, data = (rows[0], rows[1:]) if rows and not rows[0][ix["ID"]].strip() else ([""] * len(head), rows)
    out: dict = {}
    for n, r in enumerate(data, start=3):
        _every(progress, n - 2, len(data))
        if len(r) < len(head):
            raise RooflineError(f"{where}, row {n}: {len(r)} cells where the header has {len(head)}; the file is "
                                "cut or not one ncu export.")
        key = _key(r, ix, f"{where}, row {n}")
        vals = out.setdefault(key, {})
        for metric, i in ix.items():
            if metric not in _USED:
                continue
            v = _number(r[i], f"{where}, row {n} ({metric})")
            if v is not None:
                _put(vals, metric, to_si(v, units[i] if i < len(units) else "", f"{where}, row {n} ({metric})"),
                     key, f"{where}, row {n}")
    return out


def _key(r, ix, where) -> tuple:
    try:
        lid = int(r[ix["ID"]].strip().replace(",", ""))
    except ValueError:
        raise RooflineError(f"{where}: launch ID {r[ix['ID']]!r} is not a whole number.") from None
    dev = r[ix["Device"]].strip() if "Device" in ix else ""
    cc = r[ix["CC"]].strip() if "CC" in ix else ""
    return (lid, r[ix["Kernel Name"]].strip(), dev, cc)


def _both(metrics: dict, name: str):
    """A ``.sum`` under its ``sm__`` or ``smsp__`` spelling, or None."""
    if name in metrics:
        return metrics[name]
    alt = name.replace("sm__", "smsp__", 1) if name.startswith("sm__") else name
    return metrics.get(alt)


def launch_from(lid: int, name: str, device: str, cc: str, m: dict) -> KernelLaunch:
    """One ``KernelLaunch`` from its metrics (already in SI units), saying what is missing."""
    missing = []
    dur = m.get(TIME)
    if dur is None:
        missing.append(f"duration ({TIME})")
    read, write = m.get(DRAM_READ), m.get(DRAM_WRITE)
    if (read is None or write is None) and DRAM_TOTAL in m:
        read, write = m[DRAM_TOTAL], 0.0
    if read is None or write is None:
        missing.append(f"DRAM bytes ({DRAM_READ} + {DRAM_WRITE})")
        read = write = None
    flops_by = {}
    for kind, ops in FMA_PIPES.items():
        vals = [_both(m, _PIPE.format(op)) for op in ops]
        if all(v is not None for v in vals):
            flops_by[kind] = 2 * vals[0] + vals[1] + vals[2]
    tensor = [m[t] for t in TENSOR_OPS if t in m] + [m[t[:-4]] for t in TENSOR_OPS if t[:-4] in m]
    method = ""
    if tensor:
        flops_by["tensor"], method = sum(tensor), "sm__ops_path_tensor_* (one op = one FLOP)"
    elif HMMA in m and cc in HMMA_FLOPS:
        flops_by["tensor"] = m[HMMA] * HMMA_FLOPS[cc]
        method = f"estimated: {HMMA} x {HMMA_FLOPS[cc]:,} FLOPs (mma m16n8k16, sm_{cc.replace('.', '')})"
    elif HMMA in m:
        missing.append(f"tensor FLOPs ({HMMA} has no fixed FLOPs per instruction on CC {cc or '?'}; collect "
                       "sm__ops_path_tensor_*)")
    else:
        missing.append("tensor FLOPs (sm__ops_path_tensor_*)")
    if not any(k in flops_by for k in FMA_PIPES):
        missing.append("pipe FLOPs (sm__sass_thread_inst_executed_op_*_pred_on.sum)")
    return KernelLaunch(lid, name, device, cc, dur, read, write, m.get(L2_BYTES), m.get(L1_BYTES), flops_by, method,
                        tuple(missing))


_USED = {TIME, DRAM_READ, DRAM_WRITE, DRAM_TOTAL, L2_BYTES, L1_BYTES, HMMA, *PEAK_DRAM, *TENSOR_OPS,
         *(t[:-4] for t in TENSOR_OPS),
         *(p.format(op) for p in (_PIPE, _PIPE.replace("sm__", "smsp__", 1)) for ops in FMA_PIPES.values()
           for op in ops)}
