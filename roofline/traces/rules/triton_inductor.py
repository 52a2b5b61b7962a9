"""Trace cost rules for Triton and TorchInductor kernels, from their launch metadata where it is recorded.

* Inductor records each generated kernel's launch as an op named after the kernel (``triton_poi_fused_*``,
  ``triton_red_fused_*``, ``triton_per_fused_*``, ``triton_tem_fused_*``: ``torch._inductor.runtime.
  triton_heuristics``, ``_RecordFunctionFast`` with the kernel's arguments and its profiler kwargs). With
  ``kernel_num_gb`` / ``kernel_flop`` among them (Inductor's own counts, recorded when it was asked to count
  them), the kernel is costed by those; else by its buffers as recorded (``Input Dims``): each tensor argument
  read or written once (the convention Inductor's ``kernel_num_gb`` follows), its FLOPs not known and taken as
  none, which the note says.
* Such an op carrying a Triton launch-metadata dict instead (``flops``, ``flops8``, ``flops16``, ``bytes``: the
  keys a ``launch_metadata`` hook returns, as triton_kernels' ``matmul_ogs`` does) is costed by it.
* A Triton kernel with none of these is uncosted, its time listed (``kernels=``: the generated names, for the
  category of one that no op launched).
"""

from __future__ import annotations

from ...cost import Cost
from ...dtypes import bytes_per_element
from ..opcost import numel, signature
from ..registry import rule

INDUCTOR = {"poi": "elementwise", "red": "reduction", "per": "reduction", "tem": "gemm", "for": "elementwise"}


def _number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x and x >= 0 else None


def launch_metadata(a):
    """Cost(FLOPs, bytes) from recorded launch metadata, or None when none is recorded."""
    raw = a.raw
    gb, fl = _number(raw.get("kernel_num_gb")), _number(raw.get("kernel_flop"))
    if gb is not None:
        return Cost(fl or 0, gb * 1e9), "Inductor's kernel_num_gb" + (" and kernel_flop" if fl is not None else "")
    b = _number(raw.get("bytes"))
    flops = [x for x in (_number(raw.get(k)) for k in ("flops", "flops8", "flops16")) if x is not None]
    if b is not None:
        return Cost(sum(flops), b), "the kernel's launch metadata"
    return None


def inductor(a):
    kind = a.name.split("_")[1]
    cat = INDUCTOR[kind]
    meta = launch_metadata(a)
    ts = a.tensors()
    dt = next((t[1] for t in ts if t[1] in ("bf16", "fp16", "fp32", "fp8")), a.default_dtype)
    sig = signature(*[t[0] for t in ts[:3]], dtype=dt)
    if meta is not None:
        cost, how = meta
        return a.op(cost, dt, sig, f"from {how}", category=cat)
    if not ts:
        return None
    nbytes = sum(numel(t[0]) * bytes_per_element(t[1]) for t in ts)
    return a.op(Cost(0, nbytes), dt, sig, "bytes: each buffer once (Inductor's convention); FLOPs not recorded",
                {"buffers": len(ts)}, category=cat)


@rule(pattern=r"^triton_(?:poi|red|per|tem|for)_", category=("elementwise", "reduction", "gemm"), shapes=False,
      priority=5)     # before the name patterns of rules.custom: triton_red_fused_add_rms_norm_0 is Inductor's
def inductor_kernel(a):
    return inductor(a)


@rule(kernels=r"^triton_(?:red|per)_", category="reduction", priority=5)
def inductor_reduction_kernel(a):     # no op recorded its launch: nothing to cost it from
    return None


@rule(kernels=r"^triton_(?:poi|for)_", category="elementwise", priority=5)
def inductor_pointwise_kernel(a):
    return None


@rule(kernels=r"^triton_tem_", category="gemm", priority=5)
def inductor_template_kernel(a):
    return None
