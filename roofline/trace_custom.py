"""Costing the LLM serving stack's own ops from a trace: RMSNorm, SiLU-and-mul, RoPE, KV-cache writes,
flash-attention's varlen form, and collectives (``roofline.trace_cost`` dispatches here).

* RMSNorm (``aten::rms_norm``, vLLM ``_C::rms_norm`` / ``_C::fused_add_rms_norm``, SGLang
  ``sgl_kernel::rmsnorm`` / ``fused_add_rmsnorm``, any op named ``*rms_norm*``): x is the input
  whose last dimension matches a 1-D weight -> ``formulas.rmsnorm`` (``add_rmsnorm`` when the
  name says "add").
* SiLU-and-mul (``*silu_and_mul*``): the [T, 2I] input -> ``formulas.swiglu(T, I)``.
* vLLM ``_C::rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`` ->
  ``formulas.rope``; ``_C_cache_ops::reshape_and_cache[_flash](key, value, key_cache, ...)`` ->
  ``formulas.kv_append`` (fp8 when ``kv_cache_dtype`` says so).
* ``flash_attn::_flash_attn_varlen_forward`` for one sequence (cu_seqlens of 2 entries) ->
  the attention formulas; a batch of varlen sequences, and paged attention, stay uncosted:
  their lengths are tensor values, not shapes.
* Collectives: ``record_param_comms`` (Collective name, In/Out msg nelems, Group size,
  dtype), ``c10d::`` / ``nccl:`` ops from their input shapes: category "communication",
  message bytes and ``formulas.collective_bytes`` on the wire, no HBM cost.
"""

from __future__ import annotations

from . import formulas as F
from .cost import Cost
from .dtypes import bytes_per_element as _b
from .safejson import finite, whole
from .trace_cost import FLOATS, SDPA, OpCost, _Args, _attention, _n, _sig

_COMM_TYPES = {"float": "fp32", "bfloat16": "bf16", "half": "fp16", "double": "fp64", "long": "int64", "int": "int32",
               "byte": "uint8", "char": "int8", "bool": "bool", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def norm(name, a: _Args) -> OpCost | None:
    ts = [t for t in a.tensors() if t[1] in FLOATS]
    vec = [t for t in ts if len(t[0]) == 1]
    mats = [t for t in ts if len(t[0]) >= 2]
    if not vec or not mats:
        return None
    w = vec[0]
    x = next((t for t in mats if t[0][-1] == w[0][0]), None)
    if x is None:
        return None
    rows, h = _n(x[0][:-1]), x[0][-1]
    fused = "add" in name.split("::")[-1]
    f = F.add_rmsnorm if fused else F.rmsnorm
    return OpCost(name, "norm", f(rows, h, act_dtype=x[1], weight_dtype=w[1]), x[1], _sig(x[0], dtype=x[1]))


def _elements(v):
    """A message's element count as recorded: a whole number stays one; NaN, Infinity, negatives and junk are None."""
    n = whole(v, 0)
    if n is not None:
        return n
    f = finite(v)
    return f if f is not None and f >= 0 else None


def collective(name, args: dict, a: _Args) -> OpCost:
    kind = str(args.get("Collective name") or name.split("::")[-1].split(":")[-1]).strip('"')
    group = whole(args.get("Group size"), 1)
    dt = _COMM_TYPES.get(str(args.get("dtype", "")).strip('"').lower())
    elems = _elements(args.get("In msg nelems"))
    if "gather" in kind.lower():
        elems = _elements(args.get("Out msg nelems", elems))
    ts = a.tensors()
    if elems is None and ts:
        elems, dt = _n(ts[0][0]), ts[0][1]
    detail = {"collective": kind, "group_size": group}
    if isinstance(elems, (int, float)) and dt:
        msg = elems * _b(dt)
        detail["message_bytes"] = msg
        if isinstance(group, int) and group > 0:
            detail["wire_bytes"] = F.collective_bytes(kind, msg, group)
    return OpCost(name, "communication", Cost(0, 0), dt or "bf16", f"{kind} {elems} x {dt} over {group} ranks",
                  detail=detail)


def custom(name, base, a: _Args):
    low = name.lower()
    ts = a.tensors()
    if "rms_norm" in low or "rmsnorm" in low:
        return norm(name, a)
    if "silu_and_mul" in low or base == "swiglu":
        inp = max((x for x in ts if len(x[0]) >= 2), key=lambda x: x[0][-1], default=None)
        if inp is None or inp[0][-1] % 2:
            return None
        rows, inter = _n(inp[0][:-1]), inp[0][-1] // 2
        return OpCost(name, "activation", F.swiglu(rows, inter, act_dtype=inp[1]), inp[1], _sig(inp[0], dtype=inp[1]))
    if base == "rotary_embedding":      # vLLM: (positions, query, key, head_size, cos_sin_cache, is_neox)
        q, k, d = a.tensor(1), a.tensor(2), a.integer(3)
        if q is None or k is None or not d:
            return None
        rows = q[0][0] if len(q[0]) >= 2 else 0
        hq, hkv = _n(q[0][1:]) // d, _n(k[0][1:]) // d
        return OpCost(name, "rope", F.rope(rows, hq, hkv, d, act_dtype=q[1]), q[1], _sig(q[0], k[0], dtype=q[1]))
    if base in ("reshape_and_cache", "reshape_and_cache_flash"):   # (key [T,Hkv,D], value, key_cache, ...)
        k, cache = a.tensor(0), a.tensor(2)
        if k is None or cache is None or len(k[0]) != 3:
            return None
        kv = "fp8" if "fp8" in str(a.value(5)).lower() else cache[1]
        return OpCost(name, "kv_write", F.kv_append(k[0][0], k[0][1], k[0][2], act_dtype=k[1], kv_dtype=kv,
                                                  kv_scales=False), k[1],   # vLLM: per-tensor fp8 scales
                      _sig(k[0], dtype=f"{k[1]}->{kv}"))
    if name == "flash_attn::_flash_attn_varlen_forward":   # one sequence only: cu_seqlens [2]
        q, k, cu = a.tensor(0), a.tensor(1), a.tensor(3)
        if q is None or k is None or cu is None or cu[0] != (2,):
            return None
        causal = a.flag(9)
        return _attention(name, ((1,) + q[0], q[1]), ((1,) + k[0], k[1]), k, causal, False, "bshd")
    if name in SDPA:
        layout, ci, _ = SDPA[name]
        return _attention(name, a.tensor(0), a.tensor(1), a.tensor(2), a.flag(ci), False, layout)
    return None
