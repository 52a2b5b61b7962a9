"""Nsight Compute launches joined with the cost model's workload points, as result-file records (pure).

* ``join(launches, points)``: ``points`` are the workload points in the order they were launched (a profile
  file's measurements of the triton backend, or the manifest ``roofline profile --counters`` writes). Walking
  the launches in ID order, each point takes the launches of its own kernels (``KERNELS``: our Triton kernels'
  names, e.g. decode attention = ``_decode_split_kernel`` then ``_decode_merge_kernel``), each kernel name at most
  once; launches of other kernels in between (a fill, a copy) stay unjoined. A point whose kernels never come is
  said in the notices and left out.
* ``counter_measurements``: one ``Measurement`` (timer ``ncu``, flag ``counters``) per joined point, its launches
  summed, with the *measured* FLOPs and DRAM bytes as its cost and the model's beside it in ``config["model"]``;
  one per kernel name for the unjoined launches (phase "forward", the mean launch's counters). A point whose
  DRAM bytes or FLOPs are missing takes the model's FLOPs when joined (``config["flops_from"] = "model"``), else
  it is flagged "uncosted" (off the roofline) and its missing metrics are named.
* ``ratio`` / ``ratio_line``: measured against modelled bytes and FLOPs (``counter_rules`` turns a ratio far
  from 1 into a finding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..cost import Cost
from ..records import COUNTER_TIMER, Measurement, WorkloadPoint

COUNTERS = "counters"           # the flag on every counters measurement, and the result file's kind

_LINEAR = ("_linear_kernel", "_linear_int8_kernel", "_linear_int4_kernel")


def kernels_of(op: str, phase: str) -> tuple:
    """Our Triton kernels that one instance of ``op`` launches, in launch order (names as Triton gives them)."""
    if op.endswith("_proj") or op == "lm_head":
        return _LINEAR
    if op == "attention":
        return ("_prefill_attn_kernel",) if phase == "prefill" else ("_decode_split_kernel", "_decode_merge_kernel")
    if "norm" in op:
        return ("_rmsnorm_kernel",)
    if "residual" in op:
        return ("_add_kernel",)
    named = {"swiglu": "_swiglu_kernel", "geglu": "_geglu_kernel", "rope": "_rope_kernel",
             "kv_append": "_kv_append_kernel", "embedding": "_embedding_kernel"}
    return (named[op],) if op in named else ()


@dataclass(frozen=True)
class Joined:
    point: WorkloadPoint | None   # None: launches of a kernel no point claimed
    launches: tuple


def join(launches, points) -> tuple[list, list]:
    """(Joined per point that found its kernels + one per unjoined launch, notices)."""
    launches = sorted(launches, key=lambda l: l.id)
    out, notices, i = [], [], 0
    for p in points:
        want = kernels_of(p.op, p.phase)
        j = i
        while j < len(launches) and launches[j].short_name not in want:
            j += 1
        if j == len(launches):
            notices.append(f"{p.op} {p.phase} b{p.batch} ctx{p.context}: none of its kernels "
                           f"({', '.join(want) or 'none known'}) among the launches left; not joined.")
            continue
        out += [Joined(None, (l,)) for l in launches[i:j]]
        taken, k = [], j
        while k < len(launches) and launches[k].short_name in want and \
                launches[k].short_name not in {t.short_name for t in taken}:
            taken.append(launches[k])
            k += 1
        out.append(Joined(p, tuple(taken)))
        i = k
    out += [Joined(None, (l,)) for l in launches[i:]]
    return out, notices


def _sum(vals):
    vals = list(vals)
    return None if any(v is None for v in vals) else sum(vals)


def _levels(launches) -> dict:
    out = {}
    for lv in ("DRAM", "L2", "L1"):
        v = _sum(l.level_bytes().get(lv) for l in launches)
        if v is not None:
            out[lv] = v
    return out


def _flops_by(launches) -> dict:
    kinds = set.intersection(*(set(l.flops_by) for l in launches)) if launches else set()
    return {k: sum(l.flops_by[k] for l in launches) for k in sorted(kinds)}


def _measurement(point, launches, times, levels, flops_by, device, per: float = 1.0) -> Measurement:
    missing = sorted({m for l in launches for m in l.missing})
    model = point.cost if point.model else None
    flops = sum(flops_by.values()) / per if flops_by and not any("FLOPs" in m for m in missing) else None
    dram = levels.get("DRAM")
    config = {"kernels": [l.short_name for l in launches], "launch_ids": [l.id for l in launches],
              "levels": {k: v / per for k, v in levels.items()}, "flops_by": {k: v / per for k, v in flops_by.items()},
              "tensor_method": next((l.tensor_method for l in launches if l.tensor_method), ""), "missing": missing}
    flags = [COUNTERS]
    if flops is None and model is not None:
        flops, config["flops_from"] = model.flops, "model"
    if model is not None:
        config["model"] = model.to_dict()
    if flops is None or dram is None:
        flags.append("uncosted")
        cost = Cost(0.0, 0.0)
    else:
        cost = Cost(float(flops), float(dram) / per)
    p = replace(point, cost=cost)
    ok = [t for t in times if t is not None and t > 0]
    if not ok:
        return Measurement(p, (), COUNTER_TIMER, "ncu", config, device, flags=tuple(flags), status="skipped",
                           reason="no gpu__time_duration.sum in the counters")
    return Measurement(p, ok, COUNTER_TIMER, "ncu", config, device, flags=tuple(flags))


def counter_measurements(joined, device: str = "", run_dtype: str = "bf16") -> list:
    """Measurements for a counters result file (see the module docstring); joined points first, in order."""
    out, loose = [], {}
    for j in joined:
        if j.point is None:
            loose.setdefault(j.launches[0].short_name, []).extend(j.launches)
            continue
        dur = _sum(l.duration_s for l in j.launches)
        out.append(_measurement(j.point, j.launches, [dur], _levels(j.launches), _flops_by(j.launches), device))
    for name, ls in loose.items():
        by = _flops_by(ls)
        dtype = run_dtype if by.get("tensor") else "fp32"
        p = WorkloadPoint(model="", op=name, phase="forward", batch=0, new_tokens=0, context=0, cost=Cost(0, 0),
                          dtype=run_dtype, backend="triton", compute_dtype=dtype)
        out.append(_measurement(p, ls, [l.duration_s for l in ls], _levels(ls), by, device, per=len(ls)))
    return out


def ratio(m: Measurement, what: str) -> float:
    """Measured / modelled ``what`` ("bytes" or "flops") of a joined counters measurement; NaN when unknown."""
    model = (m.config or {}).get("model")
    if not model or "uncosted" in m.flags or (what == "flops" and m.config.get("flops_from") == "model"):
        return math.nan
    ref = model.get(what) or 0.0
    got = m.point.cost.bytes if what == "bytes" else m.point.cost.flops
    return got / ref if ref > 0 else math.nan


def where(p) -> str:
    return f"{p.op} {p.phase} b{p.batch}" + (f" ctx{p.context}" if p.phase == "decode" else f" x {p.context}")


def what_bytes(p) -> str:
    if p.op.endswith("_proj") or p.op == "lm_head":
        return "the weight bytes"
    if p.op == "attention" and p.phase == "decode":
        return "the KV bytes"
    return "the model's minimal bytes"


def ratio_line(m: Measurement) -> str:
    """'q_proj decode b1 ctx512: 1.02x the weight bytes, 16.00x the model's FLOPs', or ""."""
    b, f = ratio(m, "bytes"), ratio(m, "flops")
    parts = []
    if math.isfinite(b):
        parts.append(f"{b:.2f}x {what_bytes(m.point)}")
    if math.isfinite(f):
        parts.append(f"{f:.2f}x the model's FLOPs")
    return f"{where(m.point)}: {', '.join(parts)}" if parts else ""
