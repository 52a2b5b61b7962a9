"""One reading of a result file: every op against its roof, grouped into typed steps.

This is the only code that turns measurements into verdicts. The profile table, the CSV
export, every figure and table of the report, and ``roofline diagnose`` consume what
``analyze`` returns, so two places can never disagree about a number::

    from roofline.records import read_results
    from roofline.analysis import analyze
    a = analyze(read_results("tests/data/reports_h100.jsonl"))
    for s in a.steps:
        print(s.sentence)

* ``roof_for(device, compute_dtype, run_dtype)`` (``roofline.bounds``, re-exported here): the
  ceilings that judge one op, with the one fallback rule: the peak of the op's compute dtype
  (fp32 for vector ops), else the run's dtype when the device knows only that one (a custom
  device), said so in ``Roof.note``.
* ``OpResult``: one measurement with its count per step, its roof, roof fraction, bound,
  label (memory / compute / overhead, or "skipped"), predicted time and weight share.
* ``Step``: every measurement sharing a ``StepKey`` (``roofline.records.STEP_FIELDS``: phase, backend, batch,
  context, cached, dtypes, tp, ep). Its time is the sum over its ops of instance time x count, where
  count is the op's instances per step: the point's own ``count`` when it gives one (a
  trace: instances seen / steps), else ``n_layers`` for per-layer ops and 1 for the rest
  (``roofline.workload.op_count``). Instance time is the median of a benchmark's samples, the
  mean of a trace's (``Measurement.instance_s``). The ``layer`` op (a whole transformer
  layer timed as one) is left out of that sum; it stands in for the step only when the
  step measured nothing else.
* Off the roofline: a measurement flagged "uncosted" (an op the cost table does not know;
  its recorded cost is a placeholder 0) or "communication" (a collective; its bytes cross
  the interconnect, not HBM) is judged with label "uncosted" / "communication", never a
  roof fraction. Its time is kept apart in the step (``uncosted_s``, ``communication_s``,
  ``off_roof``) and said as a share of the step's traced time in the verdict sentence; it
  never enters the step's ``time_s``, ``cost`` or roof fraction, so an unknown op can neither
  dilute nor flatter a verdict.
* Tensor parallelism (a step's ``tp`` > 1): the file holds each op once per rank; the step takes
  each op from its slowest rank (the ranks meet at every all-reduce) and keeps every rank's own sum
  in ``rank_s`` (``roofline.ranks``). When collectives take at least ``COMM_DOMINANT`` of the step's
  traced time its label is **communication** (the interconnect sets the step), said with the
  collectives' bus bandwidth against the device's link.

* Cache levels: a device with ``cache_levels`` judges an op whose working set (``roofline.working_set``: the
  weight of a linear op, else its bytes) fits a level and that moved more bytes/s than the DRAM roof against
  that level's roof (``roof_for``), labelled **cache-resident** (``Roof.level`` names the level). A step is
  judged alike: its working set is its largest op's (each op was timed alone, repeated), the sum of its ops'
  for a trace (they ran one after another).

A step's label follows DESIGN.md "Classification": the summed cost's intensity against the
ridge of the run's dtype (``bound_by_sum``), the time-weighted op mix (``bound_by_mix``:
compute when at least half the measured time is in compute-bound ops), and ``overhead``
when the step runs under ``OVERHEAD_FRACTION`` of its roof.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields, make_dataclass, replace

from . import units as U
from . import ranks as R
from .bounds import CACHE_RESIDENT, COMM_DOMINANT, COMPUTE, MEMORY, OVERHEAD, Roof, bound, measured_label, roof_for
from .ceiling_sources import Ceiling, cache_ceilings, ceiling_source, ceilings  # noqa: F401 (re-exported)
from .cost import ZERO, Cost
from .devices import Device
from .records import ABOVE_ROOF, PARALLEL_FIELDS, STEP_FIELDS, Measurement, WorkloadPoint
from .layer import model_ops
from .workload import LAYER_OP, LLAMA_OPS, op_count
from .working_set import step_working_set, weight_share, working_set_bytes


def expected_ops(model) -> tuple:
    """The op names a full step of ``model`` measures (roofline.layer), a Llama's when the model is unknown."""
    return tuple(o.name for o in model_ops(model)) if model is not None else tuple(LLAMA_OPS)


SKIPPED = "skipped"
FORWARD = "forward"     # a traced forward whose phase is unknown (roofline.traces.phases): no batch or context
HOST_BUSY = "host-busy"   # a measurement (or the ceilings) timed while other processes took the CPUs
UNRELIABLE = "unreliable"  # a step's verdict when a large share of its time was timed on a busy host
NOISY_SHARE = 0.25      # that share: a step (its time) or a run (its points, its latency configurations)
LABELS = (MEMORY, COMPUTE, OVERHEAD)   # always in label_shares; CACHE_RESIDENT only when a step has such ops
UNCOSTED, COMMUNICATION = "uncosted", "communication"   # measurement flags that keep an op off the roofline
OFF_ROOF = (UNCOSTED, COMMUNICATION)


# ---------------------------------------------------------------- one op against its roof

@dataclass(frozen=True, eq=False)
class OpResult:
    """One measurement judged against its roof (derived once, consumed everywhere)."""

    m: Measurement
    count: int            # instances per step
    roof: Roof
    roof_fraction: float  # achieved / attainable (NaN when skipped)
    bound: str            # memory | compute, by intensity against the ridge
    label: str            # memory | compute | overhead, or "skipped"
    predicted_s: float    # one instance at the roof
    weight_share: float   # share of its bytes that are linear-layer weights

    @property
    def point(self):
        return self.m.point

    @property
    def op(self) -> str:
        return self.m.point.op

    @property
    def ok(self) -> bool:
        return self.m.ok

    @property
    def median_s(self) -> float:
        return self.m.median_s

    @property
    def instance_s(self) -> float:
        """One instance's time: the median of repetitions, a trace's mean (``Measurement.instance_s``)."""
        return self.m.instance_s

    @property
    def off_roof(self) -> str:
        """"uncosted" or "communication" when the measurement is kept off the roofline, else ""."""
        return next((f for f in OFF_ROOF if f in self.m.flags), "")

    @property
    def time_s(self) -> float:
        """Seconds of one step this op stands for: instance time x instances per step."""
        return self.m.instance_s * self.count if self.ok else 0.0

    @property
    def verdict(self) -> str:
        """The label, with the cache level that judged it: 'cache-resident (L3)'."""
        return f"{self.label} ({self.roof.level_name})" if self.roof.level_name else self.label

    @property
    def above_roof(self) -> bool:
        """Faster than the roof allows: a counting error or cache reuse, never a win."""
        return self.ok and self.roof_fraction > ABOVE_ROOF

    @property
    def flags(self) -> tuple:
        """The measurement's flags, with 'above-roof' first when it applies."""
        return (("above-roof",) if self.above_roof else ()) + self.m.all_flags

    @property
    def time_range(self) -> tuple:
        """(low, high) seconds per step: ``time_s`` scaled by the samples' p20 / median and p80 / median
        (a trace's mean scales alike). The noise every before/after comparison allows (roofline.verdicts.comparison)."""
        m = self.m
        if not self.ok or not m.median_s > 0:
            return (self.time_s, self.time_s)
        return (self.time_s * m.p20_s / m.median_s, self.time_s * m.p80_s / m.median_s)


def measured_roof(m: Measurement, device: Device, run_dtype: str, base: Roof | None = None, model=None) -> Roof:
    """``roof_for`` with the point's working set (``working_set_bytes`` in ``model``'s step) and the bytes/s it
    moved: a cache level's roof when one served it, else ``base`` (the DRAM roof, when the caller has it)."""
    p = m.point
    if device.cache_levels and m.ok and m.instance_s > 0 and not any(f in m.flags for f in OFF_ROOF):
        return roof_for(device, p.compute_dtype, run_dtype, working_set_bytes=working_set_bytes(p, model),
                        achieved_bytes_per_s=p.cost.bytes / m.instance_s)
    return base or roof_for(device, p.compute_dtype, run_dtype)


def judge(m: Measurement, roof: Roof, n_layers: int, model=None) -> OpResult:
    p = m.point
    b = bound(p.cost.intensity, roof.ridge)
    off = next((f for f in OFF_ROOF if f in m.flags), "")
    if not m.ok:
        frac, label = math.nan, SKIPPED
    elif off:
        frac, label = math.nan, off
    else:
        frac = roof.fraction(p.cost, m.instance_s)
        label = measured_label(p.cost.intensity, frac, roof.ridge, roof.level_name)
    count = p.count if p.count else op_count(p.op, model if model is not None else n_layers)
    return OpResult(m, count, roof, frac, b, label, roof.predicted_s(p.cost), weight_share(m, model))


def level_points(r: OpResult, device: Device) -> list:
    """A counters measurement (``roofline counters``) on the hierarchical roofline: one (level, intensity,
    achieved FLOP/s, that level's roof bandwidth or None) per memory level Nsight Compute measured (DRAM, L2,
    L1), as in its hierarchical roofline chart: the same FLOP/s over each level's bytes. A level judges its own
    point: DRAM the device's bandwidth, L2/L1 a ``cache_levels`` entry of that name when the device has one.
    [] for any other measurement."""
    levels = (r.m.config or {}).get("levels") if r.ok and "counters" in r.m.flags and not r.off_roof else None
    if not levels or not r.instance_s > 0:
        return []
    fps = r.point.cost.flops / r.instance_s
    roofs = {"DRAM": device.bandwidth, **{c.name: c.bandwidth for c in device.cache_levels}}
    return [(lv, r.point.cost.flops / b, fps, roofs.get(lv)) for lv, b in levels.items() if b and b > 0]


# ---------------------------------------------------------------- steps

_POINT_FIELDS = {f.name: f for f in fields(WorkloadPoint)}


def _step_of(cls, p):
    """The step of point ``p``; a field ``p`` lacks (an older record's) reads as WorkloadPoint's default."""
    return cls(*(getattr(p, f) if hasattr(p, f) else _POINT_FIELDS[f].default for f in STEP_FIELDS))


def _step_order(self) -> tuple:
    """Prefill first, then backend, batch, context (the order tables list steps in)."""
    return (self.phase != "prefill", self.backend, self.tp, self.ep, self.weight_dtype, self.kv_dtype,
            self.batch, self.context, self.cached)


# One step's key: the point key's ``STEP_FIELDS`` (``roofline.records``), typed as WorkloadPoint types them, so a
# field added to the point key is a step field too. ``StepKey.of(point)``; ``order``: the order tables list steps in.
StepKey = make_dataclass("StepKey", [(f, _POINT_FIELDS[f].type) for f in STEP_FIELDS], frozen=True, order=True,
                         namespace={"__module__": __name__, "__doc__": "What one step is: a point key without its op.",
                                    "of": classmethod(_step_of),
                                    "order": property(_step_order)})


@dataclass(frozen=True, eq=False)
class Step:
    key: StepKey
    ops: tuple                 # OpResult summed into the step
    layer: OpResult | None     # the whole-layer op, when measured
    skipped: tuple             # OpResult not ok
    from_layer: bool           # the step is the layer op x n_layers (nothing else measured)
    roof: Roof                 # the run dtype's ceilings
    time_s: float              # sum of count x median over ops
    cost: Cost                 # sum of count x cost over ops
    predicted_s: float         # sum of count x each op's roof time
    roof_fraction: float       # achieved FLOP/s of the summed step / attainable at its intensity
    label: str                 # memory | compute | overhead: THE verdict of the step
    bound_by_sum: str          # summed intensity vs the ridge
    bound_by_mix: str          # time-weighted op mix by intensity
    compute_time_share: float  # share of time in ops whose intensity is at or above their ridge
    label_shares: dict         # share of time per op label: memory, compute, overhead
    weight_memory_share: float  # share of time in memory-labelled ops whose bytes are mostly weights
    above_roof: tuple          # names of ops faster than their roof allows
    ceiling: Ceiling = field(compare=False, default=None)  # the roof that applies by sum
    working_set_bytes: float = 0.0  # what the cache rule compared with the levels (see the module docstring)
    sentence: str = ""
    off_roof: tuple = ()       # OpResult kept off the roofline (uncosted, communication): not in time_s
    expected: tuple = tuple(LLAMA_OPS)  # the op names a full step of the run's model measures (roofline.layer)
    uncosted_s: float = 0.0    # their time per step, by kind
    communication_s: float = 0.0
    rank_s: tuple = ()         # ((rank, seconds per step), ...) under tensor parallelism: each rank's own sum
    wire_bytes: float = 0.0    # bytes per step one rank put on the interconnect (its collectives)
    busy_share: float = 0.0    # share of time_s in ops timed while other processes took the CPUs (host-busy)
    link: object = None        # the device's roofline.interconnect.Interconnect, when known

    @property
    def traced_s(self) -> float:
        """The step's whole time: its ops on the roofline plus those kept off it."""
        return self.time_s + self.uncosted_s + self.communication_s

    @property
    def reliable(self) -> bool:
        """False when at least ``NOISY_SHARE`` of its time was timed on a busy host: its verdict is withheld."""
        return self.busy_share < NOISY_SHARE

    @property
    def verdict(self) -> str:
        """The label a reader is told: ``label``, or "unreliable" when the step is not ``reliable``."""
        return self.label if self.reliable else UNRELIABLE

    @property
    def comm_share(self) -> float:
        """Share of the step's traced time in collectives."""
        return self.communication_s / self.traced_s if self.traced_s > 0 else 0.0

    @property
    def tp(self) -> int:
        return self.key.tp

    @property
    def bus_bandwidth(self) -> float:
        """The step's collectives' bytes on the wire / their time: nccl-tests' bus bandwidth, averaged."""
        return self.wire_bytes / self.communication_s if self.communication_s > 0 else math.nan

    @property
    def uncosted_share(self) -> float:
        """Share of the step's traced time in ops the cost table does not know."""
        return self.uncosted_s / self.traced_s if self.traced_s > 0 else 0.0

    # ---- the key's fields, for tables
    @property
    def phase(self) -> str:
        return self.key.phase

    @property
    def backend(self) -> str:
        return self.key.backend

    @property
    def batch(self) -> int:
        return self.key.batch

    @property
    def context(self) -> int:
        return self.key.context

    @property
    def cached(self) -> int:
        return self.key.cached

    @property
    def dtype(self) -> str:
        return self.key.dtype

    @property
    def intensity(self) -> float:
        return self.cost.intensity

    @property
    def ridge(self) -> float:
        return self.roof.ridge

    @property
    def op_names(self) -> tuple:
        return tuple(sorted({r.op for r in self.ops}))

    @property
    def missing(self) -> tuple:
        """The model's ops not measured ok in this step (none when the layer op stands in)."""
        names = {r.op for r in self.ops}
        if self.from_layer or not names & set(self.expected):   # a trace's ops are not the workload's names
            return ()
        return tuple(n for n in self.expected if n not in names)

    @property
    def skipped_reasons(self) -> tuple:
        return tuple((r.op, r.m.reason or r.m.status) for r in self.skipped)

    @property
    def top(self) -> OpResult:
        """The op holding most of the step's time."""
        return max(self.ops, key=lambda r: r.time_s)

    @property
    def quant(self) -> str:
        """'' when weights and KV cache are in the activation dtype, else 'int8 weights' / 'int8 weights, fp8 KV'."""
        k = self.key
        parts = ([f"{k.weight_dtype} weights"] if k.weight_dtype != k.dtype else []) + \
                ([f"{k.kv_dtype} KV"] if k.kv_dtype != k.dtype else [])
        return ", ".join(parts)

    @property
    def where(self) -> str:
        """'b8/ctx1024' (with the cached prefix, tp and quantized dtypes when they are not the default)."""
        k = self.key
        if k.phase == FORWARD:
            s = "forward"
        else:
            s = f"b{k.batch}/ctx{k.context}" + (f"+{k.cached} cached" if k.cached else "")
        s += "".join(f" {n}:{v}" for n, v in (("w", k.weight_dtype), ("kv", k.kv_dtype)) if v != k.dtype)
        return s + "".join(f" {n}{getattr(k, n)}" for n in PARALLEL_FIELDS if getattr(k, n) > 1)

    @property
    def title(self) -> str:
        q = f" with {self.quant}" if self.quant else ""
        if self.phase == FORWARD:       # a trace that does not tell its phase: no batch or context invented
            tok = next((r.point.new_tokens for r in self.ops if r.point.new_tokens), 0)
            return "A forward (phase unknown)" + (f" of {tok:,} tokens" if tok else "") + q
        if self.phase == "prefill":
            s = f"Prefill of batch {self.batch} x {self.context:,} tokens"
            return s + (f" ({self.cached:,} cached)" if self.cached else "") + q
        if self.phase == "verify":
            k = self.drafts
            return f"Verify step of {k} draft{'s' * (k != 1)} at batch {self.batch}, context {self.cached:,}" + q
        return f"Decode at batch {self.batch}, context {self.context:,}" + q

    @property
    def drafts(self) -> int:
        """A verify step's draft tokens per sequence (its k + 1 new tokens after ``cached``:
        ``profiler.sweep.point_for``); 0 for any other phase."""
        return self.context - self.cached - 1 if self.phase == "verify" else 0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of this step (batch x new tokens / step time); a verify step's are the positions it
        checks (k + 1 per sequence), not the tokens it accepts."""
        if self.phase == FORWARD:
            return math.nan         # its sequences and tokens per sequence are unknown
        new = self.batch * (1 if self.phase == "decode" else self.context - self.cached)
        return new / self.time_s if self.time_s > 0 else math.nan

    @property
    def achieved_flops(self) -> float:
        """The step's FLOPs / its time: where the step sits on the roofline (with ``intensity``)."""
        return self.cost.flops / self.time_s if self.time_s > 0 else math.nan

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.cost.bytes / self.time_s if self.time_s > 0 else math.nan

    @property
    def time_range(self) -> tuple:
        """(low, high) of ``time_s``: its ops' ``time_range`` summed, as if their noise moved together
        (the wide side: a step's spread is never understated)."""
        lo = hi = 0.0
        for r in self.ops:
            a, b = r.time_range
            lo, hi = lo + a, hi + b
        return (lo, hi)


def _build_step(key: StepKey, results, roof: Roof, device_name: str, header) -> Step | None:
    rank_s = R.rank_times(results)
    results = R.slowest_per_op(results)      # one rank's measurement per op (tensor parallelism)
    off = tuple(r for r in results if r.ok and r.off_roof)
    ok = [r for r in results if r.ok and not r.off_roof]
    skipped = tuple(r for r in results if not r.ok)
    ops = [r for r in ok if r.op != LAYER_OP]
    layer = next((r for r in ok if r.op == LAYER_OP), None)
    from_layer = not ops and layer is not None
    if from_layer:
        ops = [layer]
    if not ops:
        return None
    cost, t, t_pred, t_compute = ZERO, 0.0, 0.0, 0.0
    shares = dict.fromkeys(LABELS, 0.0)
    weight_mem = 0.0
    for r in ops:
        n = r.count
        cost = cost + r.point.cost * n
        t += r.time_s
        t_pred += r.predicted_s * n
        if r.bound == COMPUTE:
            t_compute += r.time_s
        shares[r.label] = shares.get(r.label, 0.0) + r.time_s
        if r.label == MEMORY and r.weight_share >= 0.5:
            weight_mem += r.time_s
    ws = step_working_set(ops, header)
    if header.device.cache_levels and t > 0:   # the cache rule, as for each op (roof_for)
        roof = roof_for(header.device, key.dtype, header.dtype, working_set_bytes=ws,
                        achieved_bytes_per_s=cost.bytes / t)
    fraction = roof.fraction(cost, t)
    by_sum = bound(cost.intensity, roof.ridge)
    share = t_compute / t if t > 0 else 0.0
    src = ceiling_source(header, "bandwidth" if by_sum == MEMORY else "peak", roof.dtype)
    if roof.level is not None:
        src = roof.level.source
    ceiling = (Ceiling("bandwidth", "", roof.bandwidth, src, device_name, roof.level_name,
                       roof.level.size_bytes if roof.level else 0.0) if by_sum == MEMORY
               else Ceiling("peak", roof.dtype, roof.peak, src, device_name))
    s = Step(key=key, ops=tuple(ops), layer=layer, skipped=skipped, from_layer=from_layer, roof=roof, time_s=t,
             cost=cost, predicted_s=t_pred, roof_fraction=fraction,
             label=measured_label(cost.intensity, fraction, roof.ridge, roof.level_name), bound_by_sum=by_sum,
             bound_by_mix=COMPUTE if share >= 0.5 else MEMORY, compute_time_share=share,
             label_shares={k: v / t if t > 0 else 0.0 for k, v in shares.items()},
             weight_memory_share=weight_mem / t if t > 0 else 0.0,
             above_roof=tuple(r.op for r in ok if r.above_roof), ceiling=ceiling, off_roof=off,
             uncosted_s=sum(r.time_s for r in off if r.off_roof == UNCOSTED),
             communication_s=sum(r.time_s for r in off if r.off_roof == COMMUNICATION), rank_s=rank_s,
             wire_bytes=sum(R.wire_bytes(r) for r in off if r.off_roof == COMMUNICATION),
             link=getattr(header.device, "link", None), working_set_bytes=ws, expected=expected_ops(header.model))
    if t > 0:
        s = replace(s, busy_share=sum(r.time_s for r in ops if HOST_BUSY in r.m.flags) / t)
    if s.communication_s and s.comm_share >= COMM_DOMINANT:
        s = replace(s, label=COMMUNICATION)
    return replace(s, sentence=_sentence(s))


def _cache_text(s: Step) -> str:
    """Why a step is judged against a cache level's roof, or ""."""
    lv = s.roof.level
    if lv is None:
        return ""
    return (f"its working set of {U.nbytes(s.working_set_bytes)} fits the {U.nbytes(lv.size_bytes)} {lv.name} and it "
            f"moved {U.bandwidth(s.achieved_bytes_per_s)}, above the {U.bandwidth(s.roof.dram_bandwidth)} DRAM roof, "
            f"so the {lv.name}'s {U.bandwidth(lv.bandwidth)} {lv.source} roof judges it")


def _mix_text(s: Step) -> str:
    """Where the step's measured time is, by its ops' bound (by intensity). An overhead-bound step says why
    memory- (or compute-) bound ops do not make it memory- (compute-) bound: they run far below that roof."""
    share = s.compute_time_share
    t = U.seconds(s.time_s)
    if s.label == OVERHEAD and share in (0, 1):
        kind, work = ("compute", "arithmetic") if share == 1 else ("memory", "moving bytes")
        return (f"all of its measured {t} is in ops {kind}-bound by intensity, but they run far below the {kind} "
                f"roof, so the time goes to launches and latency, not to {work}")
    if share == 0 or share == 1:
        return f"all of its measured {t} is in {'compute' if share == 1 else 'memory'}-bound ops"
    if s.label == OVERHEAD:
        return (f"{U.percent(share)} of its measured {t} is in ops compute-bound by intensity, the rest memory-bound, "
                "but they run far below their roofs, so the time goes to launches and latency")
    return f"{U.percent(share)} of its measured {t} is in compute-bound ops"


def _sentence(s: Step) -> str:
    if not s.reliable:     # no verdict stated: the time it would rest on includes waiting for a core
        return (f"{s.title}: unreliable, no verdict: {U.percent(s.busy_share)} of its measured {U.seconds(s.time_s)} "
                "was timed while other processes took the CPUs (host-busy), so its time, roof fraction and label "
                "would be the load's, not the kernels'. Measure again on a quiet machine.")
    c = s.ceiling
    roof = f"the {U.si(c.value, c.unit)} {c.source} {'bandwidth roof' if c.kind == 'bandwidth' else c.dtype + ' peak'}"
    if c.level:
        roof = f"the {U.si(c.value, c.unit)} {c.source} {c.level} bandwidth roof"
    side = f"{U.intensity(s.intensity)} FLOP/byte {'<' if s.bound_by_sum == MEMORY else '>='} ridge {U.intensity(s.ridge)}"
    if s.label == COMMUNICATION:
        bw = f" at {U.bandwidth(s.bus_bandwidth)} bus bandwidth" if s.wire_bytes else ""
        if s.wire_bytes and s.link is not None:
            bw += f" ({U.percent(s.bus_bandwidth / s.link.bandwidth)} of the {U.bandwidth(s.link.bandwidth)} " \
                  f"{s.link.source} {s.link.name})"
        ops = measured_label(s.intensity, s.roof_fraction, s.ridge)
        head = (f"{s.title} is communication-bound: {U.percent(s.comm_share)} of its {U.seconds(s.traced_s)} step "
                f"is in collectives ({U.seconds(s.communication_s)}{bw}); its ops alone are "
                f"{ops}-bound at {U.percent(s.roof_fraction)} of {roof} ({side})")
    elif s.label == CACHE_RESIDENT and s.roof_fraction <= ABOVE_ROOF:
        head = (f"{s.title} is cache-resident ({s.roof.level_name}), not DRAM-bound: {U.percent(s.roof_fraction)} "
                f"of {roof} ({side})")
    elif s.label == OVERHEAD:
        head = (f"{s.title} is overhead-bound (launches, latency or the kernels, not {s.bound_by_sum}): "
                f"it reaches only {U.percent(s.roof_fraction)} of {roof} that would limit it ({side})")
    elif s.roof_fraction > ABOVE_ROOF:
        head = (f"{s.title} is {s.label}-bound by its intensity ({side}) but runs at {U.percent(s.roof_fraction)} "
                f"of {roof}, which no step can: its working set came from cache, or a byte count is too high, "
                "so the roof does not bound it here")
    else:
        head = f"{s.title} is {s.label}-bound: {U.percent(s.roof_fraction)} of {roof} ({side})"
    mix = _mix_text(s)
    if s.bound_by_mix != s.bound_by_sum:
        mix += f", so by time-weighted op mix it is {s.bound_by_mix}-bound"
    extra = [_cache_text(s)] if s.roof.level is not None else []
    if s.from_layer:
        extra.append("step taken as the layer op x n_layers")
    elif s.missing:
        extra.append(f"{len(s.expected) - len(s.missing)} of {len(s.expected)} ops measured")
    if s.above_roof:
        extra.append(f"{', '.join(s.above_roof)} above the roof: check its byte count or cache reuse")
    if s.uncosted_s > 0:
        extra.append(f"a further {U.seconds(s.uncosted_s)} ({U.percent(s.uncosted_share)} of its traced "
                     f"{U.seconds(s.traced_s)}) is in ops the cost model does not know: uncosted, not in this verdict")
    if s.communication_s > 0 and s.label != COMMUNICATION:
        extra.append(f"{U.seconds(s.communication_s)} in collectives (interconnect time, off the HBM roofline"
                     + (f", {U.percent(s.comm_share)} of the step" if s.tp > 1 else "") + ")")
    if s.rank_s:
        extra.append(f"tensor parallel over {s.tp} ranks, each op timed on its slowest rank; per rank: "
                     + R.balance_text(s.rank_s))
    tail = f" ({'; '.join(extra)})" if extra else ""
    return f"{head}; {mix}{tail}."


# ---------------------------------------------------------------- a whole file

@dataclass
class RunAnalysis:
    """Every measurement of one result file judged (``results``, file order) and grouped (``steps``)."""

    rf: object                    # roofline.records.ResultFile
    results: list                 # OpResult per measurement, in file order (skipped included)
    steps: list                   # Step, in StepKey.order
    notes: list = field(default_factory=list)  # fallback rules applied, in words

    @property
    def header(self):
        return self.rf.header

    @property
    def device(self) -> Device:
        return self.rf.header.device

    @property
    def ok(self) -> list:
        return [r for r in self.results if r.ok]

    @property
    def busy_points(self) -> int:
        """Measurements timed while other processes took the CPUs."""
        return sum(HOST_BUSY in r.m.flags for r in self.ok)

    @property
    def busy_configs(self) -> list:
        """Latency / endpoint configurations whose run recorded a busy host (``host-load`` records)."""
        return [d.get("config", "?") for d in self.rf.extra if d.get("type") == "host-load" and d.get("busy")]

    @property
    def noisy(self) -> bool:
        """Whether a large share of the run was measured on a busy host (or its ceilings were): the gate every
        consumer reads before it judges."""
        loads = [d for d in self.rf.extra if d.get("type") == "host-load"]
        return (bool(self.ok) and self.busy_points / len(self.ok) >= NOISY_SHARE) or self.ceilings_busy \
            or (bool(loads) and len(self.busy_configs) / len(loads) >= NOISY_SHARE)

    @property
    def ceilings_busy(self) -> bool:
        return HOST_BUSY in (self.header.ceilings or {}).get("flags", ())

    @property
    def noise_note(self) -> str:
        """One sentence for the top of every table, report, diagnosis and comparison; "" on a quiet run."""
        if not self.noisy:
            return ""
        what = []
        if self.ok and self.busy_points:
            what.append(f"{self.busy_points} of {len(self.ok)} points were timed while other processes took the CPUs")
        if self.ceilings_busy:
            what.append("its ceilings were measured on a busy host")
        if self.busy_configs:
            what.append(f"{len(self.busy_configs)} latency configuration(s) ran on a busy host "
                        f"({', '.join(self.busy_configs)})")
        return (f"Measured on a busy machine: {'; '.join(what)} (host-busy). Times, ceilings and verdicts from this "
                "run are unreliable; verdicts on such steps are withheld. Measure again on a quiet machine.")

    @property
    def backends(self) -> list:
        return sorted({s.backend for s in self.steps})

    def phase_steps(self, phase: str, backend: str | None = None) -> list:
        return [s for s in self.steps if s.phase == phase and (backend is None or s.backend == backend)]

    def headline(self) -> list:
        """The steps a reader sees first: per phase, backend and dtypes (weights, KV cache), the smallest and
        the largest step of the sweep (decode by batch then context, prefill by tokens)."""
        by: dict[tuple, list] = defaultdict(list)
        for s in self.steps:
            by[(s.phase, s.backend, s.key.weight_dtype, s.key.kv_dtype)].append(s)
        out = []
        for (phase, *_), ss in sorted(by.items(), key=lambda kv: (kv[0][0] != "prefill",) + kv[0][1:]):
            size = (lambda s: (s.batch * s.context, s.batch)) if phase == "prefill" else (lambda s: (s.batch, s.context))
            ss = sorted(ss, key=size)
            out.append(ss[0])
            if len(ss) > 1:
                out.append(ss[-1])
        return out


def analyze(rf) -> RunAnalysis:
    """Judge and group every measurement of ``rf`` (memoized on the ResultFile; an analysis is returned as is)."""
    if isinstance(rf, RunAnalysis):
        return rf
    cached = getattr(rf, "_analysis", None)
    if cached is not None:
        return cached
    header = rf.header
    device, n_layers = header.device, header.n_layers
    roofs: dict = {}

    def roof(compute_dtype: str) -> Roof:
        r = roofs.get(compute_dtype)
        if r is None:
            r = roofs[compute_dtype] = roof_for(device, compute_dtype, header.dtype)
        return r

    results = [judge(m, measured_roof(m, device, header.dtype, roof(m.point.compute_dtype), header.model), n_layers,
                     header.model) for m in rf.measurements]
    groups: dict = defaultdict(list)
    for r in results:
        groups[StepKey.of(r.point)].append(r)
    steps = []
    for key in sorted(groups, key=lambda k: k.order):
        s = _build_step(key, groups[key], roof(key.dtype), device.name, header)
        if s is not None:
            steps.append(s)
    notes = sorted({r.note for r in roofs.values() if r.note})
    a = RunAnalysis(rf, results, steps, notes)
    try:
        rf._analysis = a
    except AttributeError:  # pragma: no cover - a read-only stand-in
        pass
    return a


def steps(rf) -> list:
    """The steps of ``rf`` (shorthand for ``analyze(rf).steps``)."""
    return analyze(rf).steps
