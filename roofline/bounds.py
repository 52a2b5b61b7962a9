"""Roofline math: attainable FLOP/s, predicted time, bound labels, ridge crossings.

attainable(I) = min(peak, I x bandwidth); predicted time = max(flops/peak, bytes/bw).
``roof_for`` picks the ceilings that judge one op, with the one fallback rule (the op's compute
dtype's peak, else the run dtype's when a device knows only that): every verdict, analytic
(``analyze_phase``, ``ridge_crossings``, floors) or measured (``roofline.analysis``), uses it.
An op is compute-bound when its intensity is at or above the ridge (peak / bandwidth)
of the dtype it computes in, memory-bound below it. Measured: roof fraction =
achieved FLOP/s / attainable; under ``OVERHEAD_FRACTION`` of its roof a kernel is not
honestly memory- or compute-bound: launches, latency or the kernel itself limit it.
Under tensor parallelism a step also waits on collectives: when their time is at least half
the step's (``COMM_DOMINANT``), the step is **communication-bound** (the interconnect, not HBM
or the tensor cores, sets its time). Collectives run between the row-parallel linears and the
residual adds, so they are added to the ops' time (no overlap).

Cache levels (``Device.cache_levels``: a CPU's L2 and last-level cache, a GPU's L2) are roofs too,
as in Nsight Compute's hierarchical roofline. Given a measured point's working set (its bytes, the
weights for a linear op) and the bytes/s it moved, ``roof_for`` judges it against a cache level
when the working set fits that level and the point moved more bytes/s than the DRAM roof allows:
of the levels that hold it, the slowest whose bandwidth still bounds the point (the level that
served it); the fastest that holds it when none does (it stays above its roof). Such a point is
**cache-resident** (``CACHE_RESIDENT``), not memory-bound, and ``Roof.level`` names the level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import workload as W
from .cost import Cost
from .devices import Device
from .errors import RooflineError

MEMORY, COMPUTE, OVERHEAD = "memory", "compute", "overhead"
COMMUNICATION = "communication"  # a step whose collectives take at least COMM_DOMINANT of its time
CACHE_RESIDENT = "cache-resident"  # memory-side, but judged against the cache level that served its working set
OVERHEAD_FRACTION = 0.25  # the seed's "small models may instead spend the step on launches"
COMM_DOMINANT = 0.5       # collective time "dominates" a step from half of it


def attainable(intensity: float, peak: float, bandwidth: float) -> float:
    """FLOP/s the roofline allows at this intensity."""
    return min(peak, intensity * bandwidth)


def predicted_time(cost: Cost, peak: float, bandwidth: float) -> float:
    """Seconds at the roof: the slower of the arithmetic and the data movement."""
    return max(cost.flops / peak if peak else 0.0, cost.bytes / bandwidth if bandwidth else 0.0)


@dataclass(frozen=True)
class Roof:
    """The ceilings that judge one op: a peak (FLOP/s, of ``dtype``) and the memory bandwidth (B/s)."""

    peak: float
    bandwidth: float
    dtype: str        # the dtype whose peak is used
    wanted: str = ""  # the op's compute dtype, when it differs (the fallback rule applied)
    level: object = None  # the devices.CacheLevel whose bandwidth this is; None: DRAM/HBM
    dram_bandwidth: float = 0.0  # the DRAM/HBM roof's bandwidth, when this is a cache level's

    @property
    def level_name(self) -> str:
        """"L3" for a cache level's roof, "" for the DRAM/HBM roof."""
        return self.level.name if self.level is not None else ""

    @property
    def ridge(self) -> float:
        return self.peak / self.bandwidth

    @property
    def note(self) -> str:
        if not self.wanted or self.wanted == self.dtype:
            return ""
        return f"no {self.wanted} peak on this device: judged against its {self.dtype} peak"

    def attainable(self, intensity: float) -> float:
        return attainable(intensity, self.peak, self.bandwidth)

    def predicted_s(self, cost: Cost) -> float:
        return predicted_time(cost, self.peak, self.bandwidth)

    def fraction(self, cost: Cost, seconds: float) -> float:
        """Achieved / attainable; a 0-FLOP op (a copy, a gather) by bytes/s against bandwidth."""
        if not seconds > 0:
            return math.nan
        if cost.flops == 0:
            return cost.bytes / seconds / self.bandwidth
        return (cost.flops / seconds) / self.attainable(cost.intensity)


def roof_for(device: Device, compute_dtype: str, run_dtype: str, *, working_set_bytes: float = 0.0,
             achieved_bytes_per_s: float = 0.0) -> Roof:
    """The one roof rule: the compute dtype's peak, else the run dtype's (said in ``Roof.note``), and the DRAM
    bandwidth, or a cache level's when ``working_set_bytes`` fits it and ``achieved_bytes_per_s`` is above
    the DRAM roof (``cache_level``; the module docstring). Analytic callers give neither: the DRAM roof."""
    roof = _dram_roof(device, compute_dtype, run_dtype)
    level = cache_level(device, working_set_bytes, achieved_bytes_per_s)
    if level is None:
        return roof
    return replace(roof, bandwidth=level.bandwidth, level=level, dram_bandwidth=roof.bandwidth)


def cache_level(device: Device, working_set_bytes: float, achieved_bytes_per_s: float):
    """The ``CacheLevel`` that served a point, or None (DRAM): levels that hold ``working_set_bytes`` and are
    faster than DRAM; when the point moved more bytes/s than DRAM allows, the slowest of them whose bandwidth
    is at least ``achieved_bytes_per_s``, else the fastest of them."""
    if not (working_set_bytes > 0 and achieved_bytes_per_s > device.bandwidth > 0):
        return None
    fits = sorted((c for c in device.cache_levels if c.size_bytes >= working_set_bytes
                   and c.bandwidth > device.bandwidth), key=lambda c: c.bandwidth)
    if not fits:
        return None
    return next((c for c in fits if c.bandwidth >= achieved_bytes_per_s), fits[-1])


def _dram_roof(device: Device, compute_dtype: str, run_dtype: str) -> Roof:
    if not device.bandwidth > 0:
        raise RooflineError(f"{device.name} has no memory bandwidth ({device.bandwidth!r} B/s), so nothing can be "
                            "placed on a roofline: run `roofline ceilings` on that machine, or give the device with "
                            "--device/--device-file.")
    for d in dict.fromkeys((compute_dtype, run_dtype)):
        try:
            return Roof(device.peak(d), device.bandwidth, d, compute_dtype if d != compute_dtype else "")
        except RooflineError:
            continue
    device.peak(run_dtype)      # raises the catalogue's message: which peaks the device has, how to add one
    raise AssertionError  # pragma: no cover


def bound(intensity: float, ridge: float) -> str:
    return COMPUTE if intensity >= ridge else MEMORY


def roof_fraction(achieved_flops: float, intensity: float, peak: float, bandwidth: float) -> float:
    """Achieved / attainable FLOP/s. For a 0-FLOP op (a copy) use bytes/s over bandwidth."""
    roof = attainable(intensity, peak, bandwidth)
    return achieved_flops / roof if roof > 0 else 0.0


def measured_label(intensity: float, fraction: float, ridge: float, level: str = "") -> str:
    """memory / compute by the ridge, or overhead when far under the roof; cache-resident in place of memory
    when the roof is a cache ``level``'s."""
    if fraction < OVERHEAD_FRACTION:
        return OVERHEAD
    b = bound(intensity, ridge)
    return CACHE_RESIDENT if level and b == MEMORY else b


@dataclass(frozen=True)
class OpVerdict:
    name: str
    count: int
    cost: Cost           # one instance
    ridge: float
    peak: float
    time_s: float        # one instance, predicted
    bound: str

    @property
    def total_time_s(self) -> float:
        return self.time_s * self.count


@dataclass(frozen=True)
class CollectiveVerdict:
    name: str
    kind: str
    count: int
    message_bytes: float  # one instance
    wire_bytes: float     # one instance, per rank
    latency_s: float      # one instance's latency term (every launch)
    time_s: float         # one instance, predicted: latency + wire / link bandwidth
    shape: str = ""

    @property
    def total_time_s(self) -> float:
        return self.time_s * self.count


@dataclass(frozen=True)
class PhaseVerdict:
    ops: tuple           # OpVerdict per op
    total: Cost
    ridge: float         # of the phase's compute dtype
    time_s: float        # sum of the ops' predicted times (ops run one after another)
    bound_by_sum: str    # from the summed cost's intensity vs the ridge
    compute_time_share: float  # share of predicted time spent in compute-bound ops
    collectives: tuple = ()    # CollectiveVerdict per collective (tensor parallelism)
    comm_time_s: float = 0.0   # their predicted time per step
    link: object = None        # the roofline.interconnect.Interconnect that timed them

    @property
    def bound_by_mix(self) -> str:
        return COMPUTE if self.compute_time_share >= 0.5 else MEMORY

    @property
    def step_time_s(self) -> float:
        """The ops' time plus the collectives' (they are on the critical path)."""
        return self.time_s + self.comm_time_s

    @property
    def comm_share(self) -> float:
        return self.comm_time_s / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def bound(self) -> str:
        """communication when collectives take at least COMM_DOMINANT of the step, else the summed-cost
        label; ``bound_by_mix`` is shown beside it."""
        return COMMUNICATION if self.collectives and self.comm_share >= COMM_DOMINANT else self.bound_by_sum


def analyze_phase(phase, device: Device, link=None) -> PhaseVerdict:
    """Predicted time and bound for each op of a workload Phase and for the whole step.

    A tensor-parallel phase's collectives are timed over ``link`` (default: the device's own
    interconnect); a RooflineError says so when neither is known.
    """
    verdicts = []
    for op in phase.ops:
        # vector ops use the fp32 (non-tensor) peak; a custom device may only know its tensor peak
        roof = roof_for(device, op.compute_dtype, phase.dtypes.act)
        verdicts.append(OpVerdict(op.name, op.count, op.cost, roof.ridge, roof.peak, roof.predicted_s(op.cost),
                                  bound(op.cost.intensity, roof.ridge)))
    total = phase.total
    ridge = device.ridge(phase.dtypes.act)
    t = sum(v.total_time_s for v in verdicts)
    t_compute = sum(v.total_time_s for v in verdicts if v.bound == COMPUTE)
    comm, link = collective_verdicts(phase, device, link)
    return PhaseVerdict(tuple(verdicts), total, ridge, t, bound(total.intensity, ridge), t_compute / t if t else 0.0,
                        comm, sum(c.total_time_s for c in comm), link)


def collective_verdicts(phase, device: Device, link=None) -> tuple:
    """(CollectiveVerdict per collective of ``phase``, the link used); ((), None) without collectives."""
    colls = getattr(phase, "collectives", ())
    if not colls:
        return (), link
    link = link or device.link
    if link is None:
        raise RooflineError(f"{device.name} has no interconnect figure, so --tp {phase.tp}'s collectives cannot be "
                            "timed: give --link-gbs (GB/s per direction) and --link-latency-us, or a device from the "
                            "catalogue.")
    out = tuple(CollectiveVerdict(c.name, c.kind, c.count, c.message_bytes, c.wire_bytes,
                                  c.launches * link.latency(c.kind, c.ranks), c.time(link), c.shape) for c in colls)
    return out, link


def crossing(intensity_at, ridge: float, limit: int = 1 << 22) -> int | None:
    """Smallest integer n >= 1 with intensity_at(n) >= ridge, or None if not by ``limit``.

    ``intensity_at`` must be non-decreasing in n (true of batch for linear layers and of
    tokens for prefill ops); doubling then bisection.
    """
    if intensity_at(1) >= ridge:
        return 1
    hi = 2
    while intensity_at(hi) < ridge:
        if hi >= limit:
            return None
        hi *= 2
    lo = hi // 2  # intensity_at(lo) < ridge <= intensity_at(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if intensity_at(mid) >= ridge:
            hi = mid
        else:
            lo = mid
    return hi


def ridge_crossings(model, device: Device, phase: str, *, context: int = 1024, batch: int = 1,
                    weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16") -> dict:
    """For each op: the decode batch (phase="decode", at ``context``) or the prefill token
    count (phase="prefill", at ``batch``) at which it crosses the ridge; None if never."""
    kw = dict(weight_dtype=weight_dtype, act_dtype=act_dtype, kv_dtype=kv_dtype)
    if phase == "decode":
        make = lambda n: W.decode(model, n, context, **kw)  # noqa: E731
    else:
        make = lambda n: W.prefill(model, batch, n, **kw)  # noqa: E731
    out = {}
    for name in (o.name for o in W.model_ops(model)):
        probe = make(1).op(name)
        ridge = roof_for(device, probe.compute_dtype, act_dtype).ridge

        def f(n, name=name):
            if phase == "prefill" and n > model.max_context:
                return math.inf  # past the model's context: treat as "never within range"
            return make(n).op(name).cost.intensity
        n = crossing(f, ridge, limit=(1 << 16) if phase == "decode" else model.max_context)
        if n is not None and phase == "prefill" and n > model.max_context:
            n = None
        out[name] = n
    return out
