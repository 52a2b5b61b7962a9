"""Pure analysis of recorded results: phase verdicts, ceilings and their sources, op counts.

Shared by the reports, the profiler's end-of-run table and ``roofline diagnose``; no
plotting here (numbers and pictures stay apart). Everything is derived from a
``ResultFile`` (``roofline.records.read_results``)::

    from roofline.records import read_results
    from roofline.analysis import phase_summaries
    for s in phase_summaries(read_results("tests/data/reports_h100.jsonl")):
        print(s.sentence)

A *phase group* is every ok measurement sharing (phase, batch, context, backend, cached).
Its step is the sum over the measured ops of cost x count and median time x count, where
count is the op's instances per step (``n_layers`` for per-layer ops, from the header's
model). The ``layer`` op (a whole transformer layer measured as one) is left out of that
sum; it stands in for the step only when a group measured nothing else.

The phase label follows DESIGN.md "Classification": the summed cost's intensity against
the ridge of the run's dtype (``bound_by_sum``), the time-weighted op mix
(``bound_by_mix``: compute when at least half the measured time is in compute-bound ops),
and ``overhead`` when the step runs under ``OVERHEAD_FRACTION`` of its roof.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from . import units as U
from .bounds import COMPUTE, MEMORY, OVERHEAD, attainable, bound, measured_label, predicted_time
from .cost import ZERO, Cost
from .devices import Device
from .records import ABOVE_ROOF
from .workload import OP_NAMES, PER_LAYER_OPS

LAYER_OP = "layer"


# ---------------------------------------------------------------- ceilings and their sources

@dataclass(frozen=True)
class Ceiling:
    kind: str        # "bandwidth" | "peak"
    dtype: str       # compute dtype of a peak; "" for bandwidth
    value: float     # B/s or FLOP/s
    source: str      # "measured", "datasheet", "custom", ...
    device: str      # device name

    @property
    def unit(self) -> str:
        return "B/s" if self.kind == "bandwidth" else "FLOP/s"

    @property
    def text(self) -> str:
        """'3 TB/s measured' or '800 TFLOP/s bf16 datasheet'."""
        what = U.si(self.value, self.unit)
        return f"{what} {self.dtype + ' ' if self.dtype else ''}{self.source}"


def ceiling_source(header, kind: str, dtype: str = "") -> str:
    """Where the classifying ceiling came from: a value equal to the datasheet's is 'datasheet'."""
    dev, ds = header.device, header.datasheet
    value = dev.bandwidth if kind == "bandwidth" else dev.peak_flops.get(dtype)
    if ds is not None:
        ref = ds.bandwidth if kind == "bandwidth" else ds.peak_flops.get(dtype)
        if ref is not None and value is not None and math.isclose(ref, value, rel_tol=1e-9):
            return "datasheet"
    return dev.source


def ceilings(header, dtypes=None) -> tuple[list[Ceiling], list[Ceiling]]:
    """(ceilings used for classification, datasheet ceilings) for ``dtypes`` (default: all).

    The first list is the header's device with each figure's own source (a measured run
    may carry datasheet figures for dtypes it did not measure). The second is empty when
    the device is not in the catalogue.
    """
    dev, ds = header.device, header.datasheet
    want = list(dtypes) if dtypes else list(dev.peak_flops)
    used = [Ceiling("bandwidth", "", dev.bandwidth, ceiling_source(header, "bandwidth"), dev.name)]
    used += [Ceiling("peak", d, dev.peak_flops[d], ceiling_source(header, "peak", d), dev.name)
             for d in want if d in dev.peak_flops]
    sheet = []
    if ds is not None:
        sheet = [Ceiling("bandwidth", "", ds.bandwidth, "datasheet", ds.name)]
        sheet += [Ceiling("peak", d, ds.peak_flops[d], "datasheet", ds.name) for d in want if d in ds.peak_flops]
    return used, sheet


# ---------------------------------------------------------------- per-op helpers

def op_count(op: str, model: dict) -> int:
    """Instances of ``op`` per step: n_layers for per-layer ops and the layer op, else 1."""
    if op in PER_LAYER_OPS or op == LAYER_OP:
        return int(model.get("n_layers", 1) or 1)
    return 1


def predicted_s(m, device: Device) -> float:
    """Seconds the roofline allows one instance of ``m``'s op on ``device``."""
    peak, bw = m.ceilings(device)
    return predicted_time(m.point.cost, peak, bw)


def group_key(m) -> tuple:
    p = m.point
    return (p.phase, p.batch, p.context, p.backend, p.cached)


# ---------------------------------------------------------------- phase summaries

@dataclass(frozen=True)
class PhaseSummary:
    phase: str
    batch: int
    context: int
    backend: str
    time_s: float            # measured step: sum of count x median over the summed ops
    cost: Cost               # summed: count x cost
    intensity: float
    roof_fraction: float     # achieved FLOP/s of the summed step / attainable at its intensity
    label: str               # memory | compute | overhead
    bound_by_sum: str        # summed intensity vs the ridge
    bound_by_mix: str        # time-weighted op mix
    sentence: str
    cached: int = 0
    dtype: str = "bf16"
    ridge: float = math.nan
    predicted_s: float = math.nan   # sum of each op's roof time x count
    compute_time_share: float = 0.0
    ops: tuple = ()          # names of the ops summed
    missing: tuple = ()      # OP_NAMES not measured ok in this group
    skipped: tuple = ()      # (op, reason) of skipped measurements
    above_roof: tuple = ()   # ops faster than their roof allows
    from_layer: bool = False  # the step is the layer op x n_layers (nothing else measured)
    ceiling: Ceiling | None = field(default=None, compare=False)  # the roof that applies

    @property
    def title(self) -> str:
        if self.phase == "prefill":
            s = f"Prefill of batch {self.batch} x {self.context:,} tokens"
            return s + (f" ({self.cached:,} cached)" if self.cached else "")
        return f"Decode at batch {self.batch}, context {self.context:,}"


def phase_summaries(result_file) -> list[PhaseSummary]:
    """One PhaseSummary per phase group, ordered by phase (prefill first), backend, batch, context."""
    header = result_file.header
    device, model = header.device, header.model
    groups: dict[tuple, list] = defaultdict(list)
    for m in result_file.measurements:
        groups[group_key(m)].append(m)
    out = []
    for key in sorted(groups, key=lambda k: (k[0] != "prefill", k[3], k[1], k[2], k[4])):
        s = _summarize(key, groups[key], header, device, model)
        if s is not None:
            out.append(s)
    return out


def _summarize(key, ms, header, device: Device, model: dict) -> PhaseSummary | None:
    phase, batch, context, backend, cached = key
    ok = [m for m in ms if m.ok]
    skipped = tuple((m.point.op, m.reason or m.status) for m in ms if not m.ok)
    ops = [m for m in ok if m.point.op != LAYER_OP]
    from_layer = not ops and any(m.point.op == LAYER_OP for m in ok)
    if from_layer:
        ops = [m for m in ok if m.point.op == LAYER_OP]
    if not ops:
        return None
    dtype = header.dtype
    peak, bw = device.peak(dtype), device.bandwidth
    ridge = peak / bw
    cost, t, t_pred, t_compute = ZERO, 0.0, 0.0, 0.0
    for m in ops:
        n = op_count(m.point.op, model)
        cost = cost + m.point.cost * n
        t += m.median_s * n
        t_pred += predicted_s(m, device) * n
        if m.bound(device) == COMPUTE:
            t_compute += m.median_s * n
    intensity = cost.intensity
    if cost.flops > 0:
        fraction = (cost.flops / t) / attainable(intensity, peak, bw)
    else:
        fraction = (cost.bytes / t) / bw
    share = t_compute / t if t > 0 else 0.0
    by_sum = bound(intensity, ridge)
    by_mix = COMPUTE if share >= 0.5 else MEMORY
    label = measured_label(intensity, fraction, ridge)
    names = {m.point.op for m in ops}
    missing = () if from_layer else tuple(n for n in OP_NAMES if n not in names)
    above = tuple(m.point.op for m in ok if m.above_roof(device))
    src = ceiling_source(header, "bandwidth" if by_sum == MEMORY else "peak", dtype)
    roof = (Ceiling("bandwidth", "", bw, src, device.name) if by_sum == MEMORY
            else Ceiling("peak", dtype, peak, src, device.name))
    s = PhaseSummary(phase=phase, batch=batch, context=context, backend=backend, time_s=t, cost=cost,
                     intensity=intensity, roof_fraction=fraction, label=label, bound_by_sum=by_sum,
                     bound_by_mix=by_mix, sentence="", cached=cached, dtype=dtype, ridge=ridge, predicted_s=t_pred,
                     compute_time_share=share, ops=tuple(sorted(names)), missing=missing, skipped=skipped,
                     above_roof=above, from_layer=from_layer, ceiling=roof)
    return _with_sentence(s)


def _with_sentence(s: PhaseSummary) -> PhaseSummary:
    from dataclasses import replace

    c = s.ceiling
    roof = f"the {U.si(c.value, c.unit)} {c.source} {'bandwidth roof' if c.kind == 'bandwidth' else c.dtype + ' peak'}"
    side = f"{U.intensity(s.intensity)} FLOP/byte {'<' if s.bound_by_sum == MEMORY else '>='} ridge {U.intensity(s.ridge)}"
    if s.label == OVERHEAD:
        head = (f"{s.title} is overhead-bound (launches, latency or the kernels, not {s.bound_by_sum}): "
                f"it reaches only {U.percent(s.roof_fraction)} of {roof} that would limit it ({side})")
    elif s.roof_fraction > ABOVE_ROOF:
        head = (f"{s.title} is {s.label}-bound by its intensity ({side}) but runs at {U.percent(s.roof_fraction)} "
                f"of {roof}, which no step can: its working set came from cache, or a byte count is too high, "
                "so the roof does not bound it here")
    else:
        head = f"{s.title} is {s.label}-bound: {U.percent(s.roof_fraction)} of {roof} ({side})"
    share = s.compute_time_share
    if share == 0 or share == 1:
        mix = (f"all of its measured {U.seconds(s.time_s)} is in "
               f"{'compute' if share == 1 else 'memory'}-bound ops")
    else:
        mix = f"{U.percent(share)} of its measured {U.seconds(s.time_s)} is in compute-bound ops"
    if s.bound_by_mix != s.bound_by_sum:
        mix += f", so by time-weighted op mix it is {s.bound_by_mix}-bound"
    extra = []
    if s.from_layer:
        extra.append("step taken as the layer op x n_layers")
    elif s.missing:
        extra.append(f"{len(OP_NAMES) - len(s.missing)} of {len(OP_NAMES)} ops measured")
    if s.above_roof:
        extra.append(f"{', '.join(s.above_roof)} above the roof: check its byte count or cache reuse")
    tail = f" ({'; '.join(extra)})" if extra else ""
    return replace(s, sentence=f"{head}; {mix}{tail}.")


def headline(summaries: list[PhaseSummary]) -> list[PhaseSummary]:
    """The summaries a reader sees first: per phase and backend, the smallest and the largest
    step of the sweep (decode by batch then context, prefill by tokens)."""
    by: dict[tuple, list] = defaultdict(list)
    for s in summaries:
        by[(s.phase, s.backend)].append(s)
    out = []
    for (phase, _), ss in sorted(by.items(), key=lambda kv: (kv[0][0] != "prefill", kv[0][1])):
        size = (lambda s: (s.batch * s.context, s.batch)) if phase == "prefill" else (lambda s: (s.batch, s.context))
        ss = sorted(ss, key=size)
        out.append(ss[0])
        if len(ss) > 1:
            out.append(ss[-1])
    return out
