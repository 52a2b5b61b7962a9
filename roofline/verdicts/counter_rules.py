"""Nsight Compute against the cost model: a counters file's bytes and FLOPs far from the model's (pure).

Registered in ``roofline.verdicts.findings``, scope ``run`` at order 20 (a counters file only):
``counters-bytes-over`` (DRAM bytes over ``BYTES_OVER`` x the model's minimum), ``counters-bytes-under`` (under
``BYTES_UNDER``: served by the L2), ``counters-flops`` (FLOPs off by over 25%), ``counters-tensor-idle`` (a
compute-bound GEMM with no tensor-core FLOPs). The ratios are ``roofline.verdicts.counters_join.ratio``'s.
"""

from __future__ import annotations

import math

from .. import units as U
from .counters_join import COUNTERS, ratio, what_bytes, where
from .findings import Finding, finding

BYTES_OVER = 1.5                # measured DRAM bytes above 1.5x the model's minimum: re-read data
BYTES_UNDER = 0.67              # below two thirds: the data came from L2 (warm), or the model over-counts
FLOPS_FAR = 1.25                # measured FLOPs off the model's by more than 25% either way


@finding("run", "counters", order=20)
def counters_run(rf, a, src: str = "") -> list:
    """The counters rules, for a counters file only."""
    return counter_findings(a, src) if rf.header.kind == COUNTERS else []


def counter_findings(a, src: str = "") -> list:
    """Findings of a counters file (``roofline.analysis`` of it): bytes and FLOPs far from the model's."""
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
            out.append(Finding("counters-bytes-over", f"{where(p)}: {b:.1f}x {what_bytes(p)}: {why}.",
                               f"Nsight Compute measured {U.nbytes(p.cost.bytes)} of DRAM traffic; the model's minimum "
                               f"is {U.nbytes(m.config['model']['bytes'])}",
                               "keep each tile in shared memory or L2 for all its uses (larger blocks, fewer splits), "
                               "then profile again", src, {"ratio": b}))
        elif math.isfinite(b) and b < BYTES_UNDER:
            out.append(Finding("counters-bytes-under", f"{where(p)}: only {b:.2f}x {what_bytes(p)} came from DRAM: "
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
