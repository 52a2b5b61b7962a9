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
* ``counter_findings``: measured against modelled bytes and FLOPs, a ratio far from 1 as a finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import units as U
from .cost import Cost
from .records import COUNTER_TIMER, Measurement, WorkloadPoint

COUNTERS = "counters"           # the flag on every counters measurement, and the result file's kind
BYTES_OVER = 1.5                # measured DRAM bytes above 1.5x the model's minimum: re-read data
BYTES_UNDER = 0.67              # below two thirds: the data came from L2 (warm), or the model over-counts
FLOPS_FAR = 1.25                # measured FLOPs off the model's by more than 25% either way

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
    from dataclasses import replace

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


def _what_bytes(p) -> str:
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
        parts.append(f"{b:.2f}x {_what_bytes(m.point)}")
    if math.isfinite(f):
        parts.append(f"{f:.2f}x the model's FLOPs")
    return f"{where(m.point)}: {', '.join(parts)}" if parts else ""


def counter_findings(a, src: str = "") -> list:
    """Findings of a counters file (``roofline.analysis`` of it): bytes and FLOPs far from the model's."""
    from .diagnose import Finding

    out = []
    for r in a.results:
        m = r.m
        if COUNTERS not in m.flags or not m.ok:
            continue
        b, f = ratio(m, "bytes"), ratio(m, "flops")
        p = m.point
        if math.isfinite(b) and b > BYTES_OVER:
            why = ("the cache is read more than once (split-K or a second pass over the KV cache)"
                   if p.op == "attention" else "data is read more than once (tiles re-read past the L2)")
            out.append(Finding("counters-bytes-over", f"{where(p)}: {b:.1f}x {_what_bytes(p)}: {why}.",
                               f"Nsight Compute measured {U.nbytes(p.cost.bytes)} of DRAM traffic; the model's minimum "
                               f"is {U.nbytes(m.config['model']['bytes'])}",
                               "keep each tile in shared memory or L2 for all its uses (larger blocks, fewer splits), "
                               "then profile again", src, {"ratio": b}))
        elif math.isfinite(b) and b < BYTES_UNDER:
            out.append(Finding("counters-bytes-under", f"{where(p)}: only {b:.2f}x {_what_bytes(p)} came from DRAM: "
                               "the rest was already in the L2.", f"measured {U.nbytes(p.cost.bytes)}, model "
                               f"{U.nbytes(m.config['model']['bytes'])}", "profile with a working set past the L2 "
                               "(or ncu --cache-control all) before trusting its time", src, {"ratio": b}))
        if math.isfinite(f) and (f > FLOPS_FAR or f < 1 / FLOPS_FAR):
            pad = " (tensor-core tiles padded past the batch's rows)" if f > FLOPS_FAR and m.config.get(
                "flops_by", {}).get("tensor") else ""
            out.append(Finding("counters-flops", f"{where(p)}: {f:.2f}x the model's FLOPs{pad}.",
                               f"Nsight Compute counted {U.flops(p.cost.flops)}; the model says "
                               f"{U.flops(m.config['model']['flops'])}",
                               "the measured rate is work the hardware did, not useful work: compare times, not "
                               "FLOP/s, for this op", src, {"ratio": f}))
        tensor = m.config.get("flops_by", {}).get("tensor")
        if (p.op.endswith("_proj") or p.op == "lm_head") and tensor == 0 and p.cost.flops > 0 \
                and r.bound == "compute":
            out.append(Finding("counters-tensor-idle", f"{where(p)}: compute-bound, but its tensor cores did "
                               "nothing: every FLOP ran on the FMA pipes.", "tensor-path FLOPs 0 of "
                               f"{U.flops(p.cost.flops)}", "use a tensor-core dtype (bf16/fp16/tf32) and tl.dot / "
                               "torch.matmul so the GEMM reaches the tensor cores", src))
    return out
