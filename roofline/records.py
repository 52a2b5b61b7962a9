"""The records that flow from the profiler through the cost model into the reports, and the reader.

* ``WorkloadPoint``: what was run (op, phase, batch, tokens, context, dtypes, backend, tp, ep)
  and its formula ``Cost``. Frozen; ``key`` (the ``KEY_FIELDS``) identifies it (resume, duplicates). ``count`` is
  the op's instances per step when the record says so (a trace: instances seen / steps, which
  may be fractional, e.g. one decode attention shape in one of 20 steps); 0, the default and
  what profile writes, means "derive it from the op name" (``roofline.workload.op_count``).
* ``Measurement``: a point plus raw times in seconds, the timer that ran, the L2 policy,
  the kernel config, device name and clocks, flags. Median, quantiles, spread and
  achieved FLOP/s and bytes/s are *derived* from the samples, never stored. How a
  measurement sits against a device's roof is ``roofline.analysis``'s business.
  ``instance_s`` is the time of one instance: the median of a benchmark's repetitions, or the
  mean for a trace (timer "trace" or "trace-cpu": each sample is one instance as it ran, once,
  so mean x instances is the time they took together; a median would drop real time).
  Flags "uncosted" (an op the cost table does not know: its cost is 0 and means nothing) and
  "communication" (a collective: its bytes are on the interconnect, in ``config``) keep a
  measurement's time off the roofline; see ``roofline.analysis``.
* ``RunHeader``: the first line of a result file: device (ceilings used: measured where
  measured), datasheet device, measured ceiling details, the ``ModelConfig``, versions,
  git sha, command line, start time.

A result file is JSON Lines: the header, then one line per record, each flushed as it
finishes (``roofline.writer.ResultWriter`` is the only writer). Lines are strict JSON: a
number that is not finite is written as ``null``. Record types:

    measurement      a timed op (profile)
    request          a latency request's timeline (``roofline.latency.RequestTimeline``)
    latency-summary  a latency configuration's summary (``LatencySummary``)
    latency-step     one scheduler step of a latency run (``ServingStep``)

A header of kind "counters" (``roofline counters``, ``roofline.verdicts.counters_join``) holds Nsight Compute
measurements: timer ``COUNTER_TIMER``, each launch's duration a sample, the *measured* FLOPs and DRAM bytes as
the point's cost, the model's beside them in ``config["model"]`` and every memory level's bytes in
``config["levels"]`` (DRAM, L2, L1).

``read_results`` validates every line where it enters: a malformed line, a time that is
NaN, negative or zero, a header field of the wrong type is a ``RooflineError`` naming the
file and line. A torn last line (a run killed mid-write) is dropped with a notice; points
recorded twice (same key) are kept once, with a notice, never summed. Unknown line types
are kept in ``extra`` for newer writers.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from pathlib import Path

from .cost import Cost
from .devices import Device
from .errors import RooflineError
from .latency import LatencySummary
from .timeline import RequestTimeline, ServingStep
from .models import ModelConfig
from .stats import quantile

FORMAT = "roofline-results"
FORMAT_VERSION = 1
WIDE_SPREAD = 0.10  # (p80 - p20) / median above this is flagged
ABOVE_ROOF = 1.05   # a roof fraction above this is faster than the roof allows (5% for timer noise)
# forward: a traced forward whose phase is unknown (batch 0); verify: speculative decoding's verify step (k + 1 new
# tokens per sequence after ``cached`` ones: ``profiler.sweep.point_for``)
PHASES = ("prefill", "decode", "forward", "verify")
STATUSES = ("ok", "skipped")
TRACE_TIMERS = ("trace", "trace-cpu")  # kernel times from a profiler trace (GPU), or its ops' own durations (CPU)
COUNTER_TIMER = "ncu"   # a counters file's (kind "counters"): gpu__time_duration per launch, its cost the counters'


# ---------------------------------------------------------------- strict JSON

def strict(x):
    """``x`` with every non-finite float replaced by None: strict JSON (RFC 8259) has no NaN."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict(v) for v in x]
    return x


def json_line(d: dict) -> str:
    """One result-file line: strict, compact JSON and a newline."""
    return json.dumps(strict(d), allow_nan=False, separators=(",", ":")) + "\n"


# ---------------------------------------------------------------- field checks (one place)

def _need(d: dict, key: str, kinds, what: str):
    if key not in d:
        raise RooflineError(f"{what} is missing {key!r}")
    v = d[key]
    if isinstance(v, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RooflineError(f"{what} {key!r} must be {_kind_name(kinds)}, not {v!r}")
    if not isinstance(v, kinds):
        raise RooflineError(f"{what} {key!r} must be {_kind_name(kinds)}, not {v!r}")
    return v


def _kind_name(kinds) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list",
             bool: "true or false"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _int(d: dict, key: str, what: str, minimum: int = 0, default=None) -> int:
    if key not in d and default is not None:
        return default
    v = _need(d, key, (int, float), what)
    if not math.isfinite(v) or v != int(v) or v < minimum:
        raise RooflineError(f"{what} {key!r} must be a whole number >= {minimum}, not {v!r}")
    return int(v)


def _str(d: dict, key: str, what: str, default=None, choices=None) -> str:
    if key not in d and default is not None:
        return default
    v = _need(d, key, str, what)
    if choices and v not in choices:
        raise RooflineError(f"{what} {key!r} must be one of {', '.join(choices)}, not {v!r}")
    return v


def _count(d: dict, what: str) -> float:
    """A point's optional ``count``: a finite number >= 0 (0 or absent: derived from the op name)."""
    v = d.get("count", 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise RooflineError(f"{what} 'count' must be a finite number >= 0 (instances per step), not {v!r}")
    return v


def _opt(d: dict, key: str, kind, what: str, default):
    """An optional field of one JSON type; absent or null gives ``default``."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
        raise RooflineError(f"{what} {key!r} must be {_kind_name(kind)}, not {v!r}")
    return v


# ---------------------------------------------------------------- records

# The point key, defined once: the ``WorkloadPoint`` fields that tell one measured point from another. It is
# ``WorkloadPoint.key`` (a resume's done set, duplicate lines, one result per rank), ``roofline.analysis.StepKey``
# (``STEP_FIELDS``), what ``roofline compare`` matches points and steps by, and (``PARALLEL_FIELDS``) the parallelism
# a profile header records; ``profiler.run_spec.KEY_SETTINGS`` names the header setting of each field. A field that
# separates points is added to WorkloadPoint and named here.
KEY_FIELDS = ("model", "op", "new_tokens", "phase", "backend", "batch", "context", "cached", "dtype", "weight_dtype",
              "kv_dtype", "tp", "ep")
# a step is every op of one point of the grid: the key without the op, the model (one a file) and new_tokens (it
# follows from the phase and the context)
STEP_FIELDS = tuple(f for f in KEY_FIELDS if f not in ("model", "op", "new_tokens"))
PARALLEL_FIELDS = ("tp", "ep")   # the key's parallelism: a header setting when > 1, read as 1 when absent
_point_key = attrgetter(*KEY_FIELDS)


@dataclass(frozen=True)
class WorkloadPoint:
    model: str
    op: str                 # an OP_NAMES entry, or "layer" for one whole transformer layer
    phase: str              # "prefill" | "decode" | "forward" (a trace's forward of unknown phase: batch 0) | "verify"
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
    tp: int = 1             # tensor-parallel ranks; cost is per rank
    ep: int = 1             # expert-parallel ranks (= tp when > 1: each rank E / ep whole experts); older files: 1
    count: float = 0        # instances per step; 0: derive from the op name (op_count)

    def __post_init__(self):
        if not self.compute_dtype:
            object.__setattr__(self, "compute_dtype", self.dtype)

    @property
    def key(self) -> tuple:
        """The values of ``KEY_FIELDS``: what identifies this point."""
        return _point_key(self)

    def to_dict(self) -> dict:
        return {"model": self.model, "op": self.op, "phase": self.phase, "batch": self.batch,
                "new_tokens": self.new_tokens, "context": self.context, "cost": self.cost.to_dict(),
                "dtype": self.dtype, "backend": self.backend, "cached": self.cached,
                "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype, "compute_dtype": self.compute_dtype,
                "tp": self.tp, **({"ep": self.ep} if self.ep != 1 else {}),
                **({"count": self.count} if self.count else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "WorkloadPoint":
        what = "point"
        if not isinstance(d, dict):
            raise RooflineError(f"'point' must be an object, not {d!r}")
        c = _need(d, "cost", dict, what)
        flops, nbytes = (_need(c, k, (int, float), "cost") for k in ("flops", "bytes"))
        if not (math.isfinite(flops) and math.isfinite(nbytes)) or flops < 0 or nbytes < 0:
            raise RooflineError(f"cost flops and bytes must be finite and >= 0, not {flops!r}, {nbytes!r}")
        return cls(model=_str(d, "model", what, default=""), op=_str(d, "op", what),
                   phase=_str(d, "phase", what, choices=PHASES),
                   batch=_int(d, "batch", what, 0 if d.get("phase") == "forward" else 1),
                   new_tokens=_int(d, "new_tokens", what, 0), context=_int(d, "context", what, 0),
                   cost=Cost(float(flops), float(nbytes)), dtype=_str(d, "dtype", what, default="bf16"),
                   backend=_str(d, "backend", what, default="torch"), cached=_int(d, "cached", what, 0, default=0),
                   weight_dtype=_str(d, "weight_dtype", what, default="bf16"),
                   kv_dtype=_str(d, "kv_dtype", what, default="bf16"),
                   compute_dtype=_opt(d, "compute_dtype", str, what, ""), tp=_int(d, "tp", what, 1, default=1),
                   ep=_int(d, "ep", what, 1, default=1), count=_count(d, what))


@dataclass(frozen=True)
class Measurement:
    point: WorkloadPoint
    times_s: array = ()         # raw samples, seconds, one per repetition (any sequence; kept as array('d'))
    timer: str = "cpu-clock"    # "cuda-events" | "cuda-graph" | "cpu-clock"
    l2_policy: str = "n/a"      # "flushed" | "working-set>L2" | "warm" | "n/a"
    config: dict = field(default_factory=dict)  # kernel config: block sizes, splits, threads
    device: str = ""
    clocks: dict = field(default_factory=dict)  # probe samples before/after
    flags: tuple = ()           # "throttled", "sm-clock-low", ... (wide spread is derived)
    status: str = "ok"          # "ok" | "skipped"
    reason: str = ""            # why skipped
    rank: int = 0               # the tensor-parallel rank that measured it

    def __post_init__(self):
        # 8 bytes a sample instead of a Python float each: a 20,000-point file holds millions of them
        if not isinstance(self.times_s, array):
            object.__setattr__(self, "times_s", array("d", self.times_s))

    # ---- derived from the samples: never stored ----
    @property
    def ok(self) -> bool:
        return self.status == "ok" and len(self.times_s) > 0

    @cached_property
    def _quantiles(self) -> tuple:
        """(p20, median, p80), from one sort of the samples."""
        s = sorted(self.times_s)
        return tuple(quantile(s, q, is_sorted=True) for q in (0.2, 0.5, 0.8))

    @property
    def median_s(self) -> float:
        return self._quantiles[1]

    @property
    def instance_s(self) -> float:
        """One instance's time: the median of repetitions; a trace's mean (see the module docstring)."""
        if self.timer in TRACE_TIMERS:
            return sum(self.times_s) / len(self.times_s) if len(self.times_s) else math.nan
        return self.median_s

    @property
    def p20_s(self) -> float:
        return self._quantiles[0]

    @property
    def p80_s(self) -> float:
        return self._quantiles[2]

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative width of the middle of the samples."""
        m = self.median_s
        return (self.p80_s - self.p20_s) / m if m and m > 0 else math.nan

    @property
    def wide_spread(self) -> bool:
        """A benchmark whose repetitions disagree. A trace's instances differ by design (first calls,
        other shapes' neighbours), so its spread is never flagged."""
        return self.ok and self.timer not in TRACE_TIMERS + (COUNTER_TIMER,) and self.spread > WIDE_SPREAD

    @property
    def all_flags(self) -> tuple:
        return tuple(self.flags) + (("wide-spread",) if self.wide_spread else ())

    @property
    def achieved_flops(self) -> float:
        return self.point.cost.flops / self.instance_s if self.ok else math.nan

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.point.cost.bytes / self.instance_s if self.ok else math.nan

    @property
    def intensity(self) -> float:
        return self.point.cost.intensity

    def to_dict(self) -> dict:
        d = {"type": "measurement", "point": self.point.to_dict(), "times_s": list(self.times_s),
             "timer": self.timer, "l2_policy": self.l2_policy, "config": dict(self.config),
             "device": self.device, "clocks": dict(self.clocks), "flags": list(self.flags),
             "status": self.status, "reason": self.reason}
        if self.rank:
            d["rank"] = self.rank
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        what = "measurement"
        times = _opt(d, "times_s", list, what, [])
        for i, t in enumerate(times):
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                raise RooflineError(f"time sample {i} is {t!r}: every time must be a positive, finite number of "
                                    "seconds (NaN, null, zero and negative times are refused)")
        flags = _opt(d, "flags", list, what, [])
        status = _str(d, "status", what, default="ok", choices=STATUSES)
        return cls(point=WorkloadPoint.from_dict(d.get("point")), times_s=array("d", times),
                   timer=_str(d, "timer", what, default="cpu-clock"),
                   l2_policy=_str(d, "l2_policy", what, default="n/a"),
                   config=_opt(d, "config", dict, what, {}), device=_str(d, "device", what, default=""),
                   clocks=_opt(d, "clocks", dict, what, {}), flags=tuple(str(f) for f in flags), status=status,
                   reason=_str(d, "reason", what, default=""), rank=_int(d, "rank", what, 0, default=0))


@dataclass(frozen=True)
class RunHeader:
    device: Device                  # ceilings used for classification (measured where measured)
    datasheet: Device | None = None  # the catalogue entry, when the device is known
    ceilings: dict = field(default_factory=dict)  # measured ceiling details (method, sizes, raw figures)
    model: ModelConfig | None = None  # a dict is accepted and validated into a ModelConfig
    kind: str = "profile"           # "profile" | "latency"
    dtype: str = "bf16"
    settings: dict = field(default_factory=dict)  # settings that shape the measurements
    versions: dict = field(default_factory=dict)
    git_sha: str = ""
    command: str = ""
    started: str = ""
    host: dict = field(default_factory=dict)      # probe snapshot: clocks, power, cpu model
    flop_check: dict = field(default_factory=dict)  # FlopCounterMode vs formula

    def __post_init__(self):
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelConfig.from_dict(self.model) if self.model else None)

    @property
    def model_name(self) -> str:
        """The model's name; without one, what the file holds ("traced ops", "counted kernels", else "no model").
        The same words for every such file of a kind, so files compared or reported together still match."""
        if self.model:
            return self.model.name
        return {"trace": "traced ops", "counters": "counted kernels"}.get(self.kind, "no model")

    @property
    def n_layers(self) -> int:
        return self.model.n_layers if self.model else 1

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": FORMAT_VERSION, "type": "header", "kind": self.kind,
                "device": self.device.to_dict(), "datasheet": self.datasheet.to_dict() if self.datasheet else None,
                "ceilings": self.ceilings, "model": self.model.to_dict() if self.model else None,
                "dtype": self.dtype, "settings": self.settings, "versions": self.versions, "git_sha": self.git_sha,
                "command": self.command, "started": self.started, "host": self.host, "flop_check": self.flop_check}

    @classmethod
    def from_dict(cls, d: dict) -> "RunHeader":
        what = "header"
        dev = _need(d, "device", dict, what)
        sheet = _opt(d, "datasheet", dict, what, None)
        model = _opt(d, "model", dict, what, None)
        return cls(device=Device.from_dict(dev), datasheet=Device.from_dict(sheet) if sheet else None,
                   ceilings=_opt(d, "ceilings", dict, what, {}),
                   model=ModelConfig.from_dict(model) if model else None,
                   kind=_str(d, "kind", what, default="profile"), dtype=_str(d, "dtype", what, default="bf16"),
                   settings=_opt(d, "settings", dict, what, {}), versions=_opt(d, "versions", dict, what, {}),
                   git_sha=_str(d, "git_sha", what, default=""), command=_str(d, "command", what, default=""),
                   started=_str(d, "started", what, default=""), host=_opt(d, "host", dict, what, {}),
                   flop_check=_opt(d, "flop_check", dict, what, {}))


@dataclass
class ResultFile:
    path: Path
    header: RunHeader
    measurements: list = field(default_factory=list)   # Measurement, in file order (duplicates dropped)
    requests: list = field(default_factory=list)       # RequestTimeline (latency runs)
    summaries: list = field(default_factory=list)      # LatencySummary (latency runs)
    serving_steps: list = field(default_factory=list)  # ServingStep (latency runs)
    extra: list = field(default_factory=list)          # lines of a type this reader does not know
    notices: list = field(default_factory=list)        # what the reader repaired or dropped, in words
    _analysis: object = field(default=None, repr=False, compare=False)  # roofline.analysis memo

    @property
    def device(self) -> Device:
        return self.header.device


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
    except RooflineError as e:
        raise RooflineError(f"{p}, line {i}: malformed header: {e}.") from None
    except (KeyError, TypeError, ValueError) as e:
        raise RooflineError(f"{p}, line {i}: malformed header ({type(e).__name__}: {e}).") from None


_READERS = {
    "measurement": ("measurements", Measurement.from_dict),
    "request": ("requests", RequestTimeline.from_dict),
    "latency-summary": ("summaries", LatencySummary.from_dict),
    "latency-step": ("serving_steps", ServingStep.from_dict),
}


def read_results(path) -> ResultFile:
    """Parse and validate a result file; RooflineError names the file and line of what is wrong."""
    p = Path(path)
    if not p.exists():
        raise RooflineError(f"results file {p} does not exist.")
    if p.is_dir():
        raise RooflineError(f"{p} is a folder; give the results .jsonl file inside it.")
    try:
        f = open(p, "rb")
    except OSError as e:
        raise RooflineError(f"cannot read results file {p}: {e.strerror or e}.") from None
    header, rf = None, None
    seen: set = set()
    duplicates, torn, i = 0, b"", 0
    with f:                               # line by line: a large file is never held twice in memory
        for i, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                torn = line               # no newline at the end: a run killed mid-write
                break
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
                raise RooflineError(f"{p}, line {i}: not valid JSON ({msg}); the file is corrupt there.") from None
            if not isinstance(d, dict):
                raise RooflineError(f"{p}, line {i}: expected a JSON object, found {type(d).__name__}.")
            if header is None:
                header = _parse_header(p, i, d)
                rf = ResultFile(p, header)
                continue
            kind = d.get("type")
            if kind == "header":
                raise RooflineError(f"{p}, line {i}: a second header; files were concatenated. "
                                    "Pass each result file separately.")
            target = _READERS.get(kind)
            if target is None:
                rf.extra.append(d)
                continue
            try:
                rec = target[1](d)
            except RooflineError as e:
                raise RooflineError(f"{p}, line {i}: a malformed {kind} line: {e}.") from None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise RooflineError(f"{p}, line {i}: a malformed {kind} line ({type(e).__name__}: {e}).") from None
            if kind == "measurement":
                k = rec.point.key + (rec.rank,)
                if k in seen:
                    duplicates += 1
                    continue
                seen.add(k)
            getattr(rf, target[0]).append(rec)
    if header is None and not torn:
        raise RooflineError(f"results file {p} is empty: it has no header line. Re-run `roofline profile`.")
    if header is None:
        raise RooflineError(f"{p}: the header line was cut off (a run killed while starting); nothing was "
                            "measured in it. Re-run without --resume.")
    if torn:
        rf.notices.append(f"the last line of {p} was cut off ({len(torn)} bytes, an interrupted run); "
                          "everything before it is read.")
    if duplicates:
        rf.notices.append(f"{duplicates} measurement(s) in {p} repeat a point already recorded (same op, phase, "
                          "batch, context, dtypes, backend): each point is counted once, from its first line; "
                          "two runs wrote this file at once, or files were joined.")
    return rf
