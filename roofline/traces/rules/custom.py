"""Trace cost rules for the LLM serving stacks' own ops (vLLM ``_C::``, SGLang ``sgl_kernel::``, ...), by name.

* RMSNorm (vLLM ``_C::rms_norm`` / ``_C::fused_add_rms_norm``, SGLang ``sgl_kernel::rmsnorm`` /
  ``fused_add_rmsnorm``, any op named ``*rms_norm*`` / ``*rmsnorm*``) -> ``formulas.rmsnorm``
  (``add_rmsnorm`` when the name says "add").
* SiLU-and-mul (``*silu_and_mul*``, ``*::swiglu``): the [T, 2I] input -> ``formulas.swiglu(T, I)``.
* vLLM ``_C::rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`` ->
  ``formulas.rope``; ``_C_cache_ops::reshape_and_cache[_flash](key, value, key_cache, ...)`` ->
  ``formulas.kv_append`` (fp8 when ``kv_cache_dtype`` says so).

Every pattern here skips ``aten::`` ops (``outside_aten``): PyTorch's own ops are costed by their
exact names or not at all (``aten::_fused_rms_norm_backward`` is not an RMSNorm forward).
"""

from __future__ import annotations

from ... import formulas as F
from ..opcost import numel, signature
from ..registry import rule
from .elementwise import rmsnorm


def outside_aten(pattern: str) -> str:
    """``pattern`` searched in an op name whose namespace (before its last ``::``) is not ``aten``."""
    return rf"^(?!aten::(?!.*::)).*?(?:{pattern})"


@rule(pattern=outside_aten(r"(?i:rms_?norm)"), category="norm")
def custom_rmsnorm(a):
    return rmsnorm(a)


@rule(pattern=outside_aten(r"(?i:silu_and_mul)|(?:^|::)swiglu$"), category="activation")
def silu_and_mul(a):
    inp = max((x for x in a.tensors() if len(x[0]) >= 2), key=lambda x: x[0][-1], default=None)
    if inp is None or inp[0][-1] % 2:
        return None
    rows, inter = numel(inp[0][:-1]), inp[0][-1] // 2
    return a.op(F.swiglu(rows, inter, act_dtype=inp[1]), inp[1], signature(inp[0], dtype=inp[1]))


@rule(pattern=outside_aten(r"(?:^|::)rotary_embedding$"), category="rope")
def rotary_embedding(a):      # vLLM: (positions, query, key, head_size, cos_sin_cache, is_neox)
    q, k, d = a.tensor(1), a.tensor(2), a.integer(3)
    if q is None or k is None or not d:
        return None
    rows = q[0][0] if len(q[0]) >= 2 else 0
    hq, hkv = numel(q[0][1:]) // d, numel(k[0][1:]) // d
    return a.op(F.rope(rows, hq, hkv, d, act_dtype=q[1]), q[1], signature(q[0], k[0], dtype=q[1]))


@rule(pattern=outside_aten(r"(?:^|::)reshape_and_cache(?:_flash)?$"), category="kv_write")
def reshape_and_cache(a):     # (key [T, Hkv, D], value, key_cache, value_cache, slot_mapping, kv_cache_dtype, ...)
    k, cache = a.tensor(0), a.tensor(2)
    if k is None or cache is None or len(k[0]) != 3:
        return None
    kv = "fp8" if "fp8" in str(a.value(5)).lower() else cache[1]
    return a.op(F.kv_append(k[0][0], k[0][1], k[0][2], act_dtype=k[1], kv_dtype=kv, kv_scales=False),  # per-tensor
                k[1], signature(k[0], dtype=f"{k[1]}->{kv}"))                                             # fp8 scales
