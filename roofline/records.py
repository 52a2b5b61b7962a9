"""The records that flow from the profiler through the cost model into the reports.

* ``WorkloadPoint``: what was run (op, phase, batch, tokens, context, dtype, backend)
  and its formula ``Cost``. Frozen; ``key`` identifies it for ``--resume``.
* ``Measurement``: a point plus raw times in seconds, the timer that ran, the L2
  policy, the kernel config, device name and clocks, flags. Median, quantiles, spread,
  achieved FLOP/s and bytes/s, roof fraction and bound are *derived*, never stored.
* ``RunHeader``: the first line of a result file: device (ceilings used: measured where
  measured), datasheet device, measured ceiling details, model, versions, git sha,
  command line, start time.

A result file is JSON Lines: the header, then one ``{"type": "measurement", ...}`` line
per point, flushed as it finishes. ``read_results`` names the file and line of anything
it cannot read. Other line types (e.g. latency ``request`` lines) are kept as dicts.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .bounds import attainable, measured_label, roof_fraction
from .bounds import bound as _bound
from .cost import Cost
from .devices import Device
from .errors import RooflineError

FORMAT = "roofline-results"
FORMAT_VERSION = 1
WIDE_SPREAD = 0.10  # (p80 - p20) / median above this is flagged
ABOVE_ROOF = 1.05   # a roof fraction above this is faster than the roof allows (5% for timer noise)


@dataclass(frozen=True)
class WorkloadPoint:
    model: str
    op: str                 # an OP_NAMES entry, or "layer" for one whole transformer layer
    phase: str              # "prefill" | "decode"
    batch: int
    new_tokens: int         # per sequence: prompt - cached for prefill, 1 for decode
    context: int            # prefill: prompt length; decode: tokens already cached
    cost: Cost
    dtype: str = "bf16"     # activation / compute dtype
    backend: str = "torch"  # "triton" | "torch"
    cached: int = 0
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    compute_dtype: str = ""  # the peak that applies: dtype for tensor ops, "fp32" for vector ops

    def __post_init__(self):
        if not self.compute_dtype:
            object.__setattr__(self, "compute_dtype", self.dtype)

    @property
    def key(self) -> tuple:
        return (self.model, self.op, self.phase, self.batch, self.new_tokens, self.context, self.cached,
                self.dtype, self.weight_dtype, self.kv_dtype, self.backend)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cost"] = self.cost.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "WorkloadPoint":
        d = dict(d)
        d["cost"] = Cost.from_dict(d["cost"])
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _quantile(sorted_xs, q: float) -> float:
    """Linear-interpolated quantile of a sorted sequence (numpy's default method)."""
    if not sorted_xs:
        return math.nan
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Measurement:
    point: WorkloadPoint
    times_s: tuple = ()         # raw samples, seconds, one per repetition
    timer: str = "cpu-clock"    # "cuda-events" | "cuda-graph" | "cpu-clock"
    l2_policy: str = "n/a"      # "flushed" | "working-set>L2" | "warm" | "n/a"
    config: dict = field(default_factory=dict)  # kernel config: block sizes, splits, threads
    device: str = ""
    clocks: dict = field(default_factory=dict)  # probe samples before/after
    flags: tuple = ()           # "throttled", "sm-clock-low", ... (wide spread is derived)
    status: str = "ok"          # "ok" | "skipped"
    reason: str = ""            # why skipped

    # ---- derived: never stored ----
    @property
    def ok(self) -> bool:
        return self.status == "ok" and len(self.times_s) > 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s) if self.times_s else math.nan

    @property
    def p20_s(self) -> float:
        return _quantile(sorted(self.times_s), 0.2)

    @property
    def p80_s(self) -> float:
        return _quantile(sorted(self.times_s), 0.8)

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative width of the middle of the samples."""
        m = self.median_s
        return (self.p80_s - self.p20_s) / m if m and m > 0 else math.nan

    @property
    def wide_spread(self) -> bool:
        return self.ok and self.spread > WIDE_SPREAD

    @property
    def all_flags(self) -> tuple:
        return tuple(self.flags) + (("wide-spread",) if self.wide_spread else ())

    @property
    def achieved_flops(self) -> float:
        return self.point.cost.flops / self.median_s if self.ok else math.nan

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.point.cost.bytes / self.median_s if self.ok else math.nan

    @property
    def intensity(self) -> float:
        return self.point.cost.intensity

    def ceilings(self, device: Device) -> tuple[float, float]:
        """(peak FLOP/s for this point's compute dtype, bandwidth) on ``device``."""
        return device.peak(self.point.compute_dtype), device.bandwidth

    def attainable_flops(self, device: Device) -> float:
        peak, bw = self.ceilings(device)
        return attainable(self.intensity, peak, bw)

    def roof_fraction(self, device: Device) -> float:
        """Achieved / attainable. A 0-FLOP op (copy, gather) is judged by bytes/s vs bandwidth."""
        peak, bw = self.ceilings(device)
        if self.point.cost.flops == 0:
            return self.achieved_bytes_per_s / bw if bw else math.nan
        return roof_fraction(self.achieved_flops, self.intensity, peak, bw)

    def bound(self, device: Device) -> str:
        """memory / compute from the intensity and the ridge of the compute dtype."""
        peak, bw = self.ceilings(device)
        return _bound(self.intensity, peak / bw)

    def label(self, device: Device) -> str:
        """memory / compute, or overhead when far under its roof."""
        peak, bw = self.ceilings(device)
        return measured_label(self.intensity, self.roof_fraction(device), peak / bw)

    def above_roof(self, device: Device, tolerance: float = ABOVE_ROOF) -> bool:
        """Faster than the roof allows: a counting error or cache reuse, never a win."""
        return self.ok and self.roof_fraction(device) > tolerance

    def to_dict(self) -> dict:
        return {"type": "measurement", "point": self.point.to_dict(), "times_s": list(self.times_s),
                "timer": self.timer, "l2_policy": self.l2_policy, "config": dict(self.config),
                "device": self.device, "clocks": dict(self.clocks), "flags": list(self.flags),
                "status": self.status, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        return cls(point=WorkloadPoint.from_dict(d["point"]), times_s=tuple(float(t) for t in d.get("times_s", ())),
                   timer=d.get("timer", "cpu-clock"), l2_policy=d.get("l2_policy", "n/a"),
                   config=dict(d.get("config", {})), device=d.get("device", ""), clocks=dict(d.get("clocks", {})),
                   flags=tuple(d.get("flags", ())), status=d.get("status", "ok"), reason=d.get("reason", ""))


@dataclass(frozen=True)
class RunHeader:
    device: Device                  # ceilings used for classification (measured where measured)
    datasheet: Device | None = None  # the catalogue entry, when the device is known
    ceilings: dict = field(default_factory=dict)  # measured ceiling details (method, sizes, raw figures)
    model: dict = field(default_factory=dict)     # ModelConfig.to_dict()
    kind: str = "profile"           # "profile" | "latency"
    dtype: str = "bf16"
    settings: dict = field(default_factory=dict)  # sweep settings: phases, batches, contexts, backends
    versions: dict = field(default_factory=dict)
    git_sha: str = ""
    command: str = ""
    started: str = ""
    host: dict = field(default_factory=dict)      # probe snapshot: clocks, power, cpu model
    flop_check: dict = field(default_factory=dict)  # FlopCounterMode vs formula

    @property
    def model_name(self) -> str:
        return str(self.model.get("name", "?"))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": FORMAT_VERSION, "type": "header", "kind": self.kind,
                "device": self.device.to_dict(), "datasheet": self.datasheet.to_dict() if self.datasheet else None,
                "ceilings": self.ceilings, "model": self.model, "dtype": self.dtype, "settings": self.settings,
                "versions": self.versions, "git_sha": self.git_sha, "command": self.command,
                "started": self.started, "host": self.host, "flop_check": self.flop_check}

    @classmethod
    def from_dict(cls, d: dict) -> "RunHeader":
        return cls(device=Device.from_dict(d["device"]),
                   datasheet=Device.from_dict(d["datasheet"]) if d.get("datasheet") else None,
                   ceilings=d.get("ceilings", {}), model=d.get("model", {}), kind=d.get("kind", "profile"),
                   dtype=d.get("dtype", "bf16"), settings=d.get("settings", {}), versions=d.get("versions", {}),
                   git_sha=d.get("git_sha", ""), command=d.get("command", ""), started=d.get("started", ""),
                   host=d.get("host", {}), flop_check=d.get("flop_check", {}))


@dataclass
class ResultFile:
    path: Path
    header: RunHeader
    measurements: list           # Measurement, in file order
    extra: list                  # other lines (dicts with a "type"), e.g. latency requests

    @property
    def device(self) -> Device:
        return self.header.device


def read_results(path) -> ResultFile:
    """Parse a result file; RooflineError names the file and line of what is wrong."""
    p = Path(path)
    if not p.exists():
        raise RooflineError(f"results file {p} does not exist.")
    if p.is_dir():
        raise RooflineError(f"{p} is a folder; give the results .jsonl file inside it.")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RooflineError(f"cannot read results file {p}: {e}") from None
    lines = text.splitlines()
    if not any(ln.strip() for ln in lines):
        raise RooflineError(f"results file {p} is empty: it has no header line. Re-run `roofline profile`.")
    header = None
    measurements, extra = [], []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and header is not None:
                # a run killed mid-write leaves a torn last line: everything before it stands
                extra.append({"type": "torn-line", "line": i})
                continue
            raise RooflineError(f"{p}, line {i}: not valid JSON ({e.msg}); the file is corrupt there.") from None
        if not isinstance(d, dict):
            raise RooflineError(f"{p}, line {i}: expected a JSON object, found {type(d).__name__}.")
        if header is None:
            header = _parse_header(p, i, d)
            continue
        kind = d.get("type")
        try:
            if kind == "measurement":
                measurements.append(Measurement.from_dict(d))
            elif kind == "header":
                raise RooflineError(f"{p}, line {i}: a second header; files were concatenated. "
                                    "Pass each result file separately.")
            else:
                extra.append(d)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, RooflineError):
                raise
            raise RooflineError(f"{p}, line {i}: a malformed {kind or 'record'} line ({type(e).__name__}: {e}).") from None
    return ResultFile(p, header, measurements, extra)


def _parse_header(p: Path, i: int, d: dict) -> RunHeader:
    if d.get("format") != FORMAT or d.get("type") != "header":
        raise RooflineError(f"{p}, line {i}: not a roofline results file (its first line is not a "
                            f"'{FORMAT}' header).")
    v = d.get("version")
    if v != FORMAT_VERSION:
        older = isinstance(v, int) and v < FORMAT_VERSION
        raise RooflineError(f"{p}: format version {v} is {'older' if older else 'newer'} than this toolkit's "
                            f"({FORMAT_VERSION}); {'re-run the profile' if older else 'upgrade roofline'} "
                            "to read it.")
    try:
        return RunHeader.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise RooflineError(f"{p}, line {i}: malformed header ({e}).") from None


class ResultWriter:
    """Appends records to a JSON Lines file, flushing each line as it is written.

    ``resume=True`` keeps an existing file (whose header must match: see
    ``resume_mismatch``) and returns the keys already measured in ``done``.
    """

    def __init__(self, path, header: RunHeader, resume: bool = False):
        self.path = Path(path)
        self.done: set = set()
        if resume and self.path.exists() and self.path.stat().st_size > 0:
            old = read_results(self.path)
            diff = resume_mismatch(old.header, header)
            if diff:
                raise RooflineError(f"cannot resume {self.path}: {diff}. Use another --out, or drop --resume "
                                    "to start over.")
            self.done = {m.point.key for m in old.measurements}
            self._f = open(self.path, "a")
            if not text_ends_with_newline(self.path):
                self._f.write("\n")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w")
            self._line(header.to_dict())

    def _line(self, d: dict):
        self._f.write(json.dumps(d, allow_nan=True) + "\n")
        self._f.flush()

    def write(self, record) -> None:
        self._line(record.to_dict() if hasattr(record, "to_dict") else record)
        if isinstance(record, Measurement):
            self.done.add(record.point.key)

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def text_ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return True
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def resume_mismatch(old: RunHeader, new: RunHeader) -> str:
    """Why ``new`` may not append to a file started with ``old``; "" when it may."""
    pairs = [("model", old.model_name, new.model_name), ("device", old.device.name, new.device.name),
             ("dtype", old.dtype, new.dtype), ("kind", old.kind, new.kind)]
    for what, a, b in pairs:
        if a != b:
            return f"it holds {what} {a!r}, this run is {what} {b!r}"
    return ""
