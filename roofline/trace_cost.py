"""Costing a traced op from its recorded shapes and dtypes, through ``roofline.formulas`` only.

``cost_op(name, args)`` returns an ``OpCost`` (category, ``Cost``, dtypes, a shape signature)
for an op the table knows, ``FRAMEWORK`` for an op that moves no data (views, allocations,
metadata: its cost is truly zero), or None for an op the table does not know: such an op
is *uncosted*; its time is counted, never given a guessed cost.

The table (each entry names the formula it uses; the conventions are ``formulas``'s):

* GEMM: ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm`` (fp8: A and B in fp8,
  C in ``out_dtype``) -> ``formulas.gemm`` (A + B + C [+ bias]; 2MNK [+ MN]).
  ``aten::linear`` / ``aten::matmul`` are *wrappers*: costed through what they call, and from
  their own shapes only when nothing below them is costed (``WRAPPERS``).
* Attention: ``aten::scaled_dot_product_attention`` and its flash / efficient / cudnn / math
  variants, ``aten::_flash_attention_forward``, ``aten::_efficient_attention_forward``,
  ``flash_attn::_flash_attn_forward`` (and its varlen form for one sequence) ->
  ``formulas.prefill_attention`` (S_q > 1; halved when causal) or ``formulas.decode_attention``
  (S_q = 1). Causal comes from the recorded ``is_causal``; with an explicit mask and
  S_q > 1 it is *assumed* causal (a decoder's mask), and the signature says "causal assumed".
* LLM custom ops (``roofline.trace_custom``): RMSNorm (``aten::rms_norm``, vLLM ``_C::rms_norm`` /
  ``fused_add_rms_norm``, SGLang ``sgl_kernel::rmsnorm`` ...) -> ``rmsnorm`` / ``add_rmsnorm``; SiLU-and-mul ->
  ``swiglu``; vLLM ``_C::rotary_embedding`` -> ``rope``; ``reshape_and_cache[_flash]`` ->
  ``kv_append``. Paged and batched varlen attention are uncosted: their KV lengths are tensor
  values, not shapes.
* Elementwise (``ELEMENTWISE``: FLOPs per output element, 0 for exp/rsqrt/casts), reductions,
  softmax, copies and casts (``copy_``, ``cat``), gathers (``embedding``, ``index_select``),
  scatters (``index_put_``), fills -> ``elementwise``, ``reduction``, ``softmax``, ``copy``,
  ``embedding``, ``fill``. A 0-dim input (a Python scalar) is a kernel argument: no bytes.
* Collectives (``roofline.trace_custom``; ``record_param_comms`` with its message sizes, ``c10d::``, ``nccl:*``):
  category "communication": bytes on the wire by ``formulas.collective_bytes``, kept off
  the HBM roofline.

Where TraceLens's perf models differ (stated in the report's conventions): GEMM bytes and
FLOPs are the same (A + B + C + bias; 2MNK + MN); causal attention is halved in both, but we
also halve with a cached prefix (n*p + n*n/2 pairs, TraceLens refuses S_q != S_kv) and read
K and V once per KV head in both; TraceLens counts softmax at 3 FLOPs per element (ours 4),
counts a 0-dim scalar input as one element read (ours: none), and assumes an fp8 GEMM writes
fp16 (ours: the recorded ``out_dtype``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import formulas as F
from .cost import Cost
from .dtypes import bytes_per_element as _b
from .safejson import finite, whole

TYPES = {"float": "fp32", "c10::bfloat16": "bf16", "bfloat16": "bf16", "c10::half": "fp16", "half": "fp16",
         "double": "fp64", "long int": "int64", "long": "int64", "int": "int32", "short int": "int16",
         "short": "int16", "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
         "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8",
         "c10::float8_e5m2fnuz": "fp8", "c10::qint8": "int8", "c10::quint8": "uint8"}
SCALAR_TYPES = {5: "fp16", 6: "fp32", 7: "fp64", 15: "bf16", 4: "int64", 3: "int32", 11: "bool", 23: "fp8",
                24: "fp8", 25: "fp8", 26: "fp8", 0: "uint8", 1: "int8", 2: "int16"}   # c10::ScalarType codes
FLOATS = ("fp32", "bf16", "fp16", "fp8", "fp64")
TENSOR_CATEGORIES = ("gemm", "attention")   # computed on tensor cores (their dtype's peak); the rest on fp32 units

FRAMEWORK = "framework"
# Wrappers run other ops: costed through what they call, and from their own shapes only when they
# launched a kernel themselves with nothing costed below them (``roofline.trace``).
WRAPPERS = ("aten::linear", "aten::matmul", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::reshape",
            "aten::flatten", "c10d::", "_c10d_functional::")
_FRAMEWORK = {f"aten::{n}" for n in (
    "view", "_unsafe_view", "_reshape_alias", "as_strided", "transpose", "t", "permute", "unsqueeze",
    "squeeze", "expand", "expand_as", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "detach", "detach_", "alias", "lift_fresh", "resolve_conj", "resolve_neg", "view_as", "unflatten", "empty",
    "empty_strided", "empty_like", "new_empty", "new_empty_strided", "result_type", "is_same_size",
    "is_nonzero", "resize_", "set_", "record_stream", "item", "_local_scalar_dense", "to", "numpy_T", "movedim",
    "swapaxes", "diagonal",
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "scalar_tensor",
    "_has_compatible_shallow_copy_type", "lift", "_assert_async", "sym_size", "sym_stride", "dim", "size")} | {
    "detach_", "detach"}   # autograd's own record_function names, without a namespace

# name -> FLOPs per output element (binary ops broadcast their inputs; comparisons write bool)
ELEMENTWISE = {"add": 1, "sub": 1, "rsub": 1, "mul": 1, "div": 1, "true_divide": 1, "floor_divide": 1,
               "remainder": 1, "fmod": 1, "maximum": 1, "minimum": 1, "pow": 1, "neg": 1, "abs": 1, "relu": 1,
               "square": 1, "sign": 1, "clamp": 1, "clamp_min": 1, "clamp_max": 1, "floor": 1, "ceil": 1,
               "round": 1, "trunc": 1, "nan_to_num": 1, "sigmoid": 3, "silu": 4, "exp": 0, "log": 0, "sqrt": 0,
               "rsqrt": 0, "reciprocal": 0, "tanh": 0, "sin": 0, "cos": 0, "erf": 0, "masked_fill": 0,
               "where": 0, "bitwise_not": 1, "bitwise_and": 1, "bitwise_or": 1, "logical_not": 1,
               "logical_and": 1, "logical_or": 1, "eq": 1, "ne": 1, "lt": 1, "le": 1, "gt": 1, "ge": 1,
               "isnan": 1, "isinf": 1}
BOOL_OUT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "isnan", "isinf"}
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm", "any", "all",
              "argmax", "argmin"}
SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
COLLECTIVE_OPS = ("record_param_comms", "c10d::", "nccl:", "_c10d_functional::")


def is_wrapper(name: str) -> bool:
    return name.startswith(WRAPPERS)


@dataclass(frozen=True)
class OpCost:
    name: str               # the op, e.g. "aten::mm"
    category: str           # gemm, attention, norm, activation, rope, kv_write, elementwise, reduction, softmax,
    #                         copy, gather, scatter, fill, communication
    cost: Cost
    dtype: str              # the op's data dtype (our key)
    signature: str          # shapes and dtype, e.g. "[8,64]x[64,64] fp32"
    note: str = ""          # what was assumed ("causal assumed")
    detail: dict = field(default_factory=dict)  # gemm m/k/n, attention sizes, wire bytes

    @property
    def compute_dtype(self) -> str:
        """The peak that applies: tensor-core ops their dtype, vector ops fp32 (the workload's rule)."""
        return self.dtype if self.category in TENSOR_CATEGORIES and self.dtype in FLOATS else "fp32"


def dtype_of(type_name) -> str | None:
    return TYPES.get(str(type_name).strip().lower())


class _Args:
    """An op's recorded inputs: shapes (Input Dims), dtypes (Input type), values (Concrete Inputs)."""

    def __init__(self, args: dict):           # read_trace kept these only as lists
        self.dims = _list(args.get("Input Dims"))
        self.types = _list(args.get("Input type"))
        self.concrete = _list(args.get("Concrete Inputs"))

    def tensor(self, i):
        """(shape tuple, dtype) of input i, or None when it is not a tensor."""
        if i >= len(self.dims) or i >= len(self.types):
            return None
        d, t = self.dims[i], dtype_of(self.types[i])
        if t is None or not isinstance(d, list) or any(whole(x, 0) is None for x in d):
            return None
        return tuple(whole(x) for x in d), t

    def tensors(self):
        return [x for x in (self.tensor(i) for i in range(len(self.dims))) if x is not None]

    def value(self, i):
        return self.concrete[i] if i < len(self.concrete) else ""

    def flag(self, i):
        v = str(self.value(i)).strip().lower()
        return True if v == "true" else False if v == "false" else None

    def integer(self, i):
        try:
            return int(str(self.value(i)).strip())
        except ValueError:
            return None


def _list(v) -> list:
    return v if isinstance(v, list) else []


def _n(shape) -> int:
    return math.prod(shape) if shape else 1


def _sig(*shapes, dtype="") -> str:
    return "x".join("[" + ",".join(map(str, s)) + "]" for s in shapes) + (f" {dtype}" if dtype else "")


def _gemm(name, a, b, bias=None, out_dtype=None, batched=False) -> OpCost | None:
    (sa, ta), (sb, tb) = a, b
    if batched:
        if len(sa) != 3 or len(sb) != 3:
            return None
        batch, m, k, n = sa[0], sa[1], sa[2], sb[2]
    else:
        if len(sa) != 2 or len(sb) != 2:
            return None
        batch, m, k, n = 1, sa[0], sa[1], sb[1]
    bias_n = _n(bias[0]) if bias else 0
    cost = F.gemm(m, k, n, batch=batch, a_dtype=ta, b_dtype=tb, out_dtype=out_dtype or ta, bias=bias_n,
                  bias_dtype=bias[1] if bias else None)
    shapes = ((bias[0],) if bias else ()) + (sa, sb)
    return OpCost(name, "gemm", cost, ta, _sig(*shapes, dtype=ta if ta == tb else f"{ta}x{tb}"),
                  detail={"m": m * batch, "k": k, "n": n, "batch": batch})


def _matmul_like(name, x, w, bias=None, weight_nk=False) -> OpCost | None:
    """linear(x [..., K], W [N, K]) or matmul(x [..., K], W [K, N]) when no op below is costed."""
    (sx, tx), (sw, tw) = x, w
    if len(sw) != 2 or not sx:
        return None
    k, n = (sw[1], sw[0]) if weight_nk else (sw[0], sw[1])
    if sx[-1] != k:
        return None
    m = _n(sx[:-1])
    cost = F.gemm(m, k, n, a_dtype=tx, b_dtype=tw, bias=_n(bias[0]) if bias else 0,
                  bias_dtype=bias[1] if bias else None)
    return OpCost(name, "gemm", cost, tx, _sig(sx, sw, dtype=tx), detail={"m": m, "k": k, "n": n, "batch": 1})


# attention: name -> (layout "bhsd" or "bshd", index of is_causal in Concrete Inputs, index of a mask input or None)
SDPA = {"aten::scaled_dot_product_attention": ("bhsd", 5, 3),
        "aten::_scaled_dot_product_flash_attention": ("bhsd", 4, None),
        "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhsd", 4, 5),
        "aten::_scaled_dot_product_efficient_attention": ("bhsd", 6, 3),
        "aten::_scaled_dot_product_cudnn_attention": ("bhsd", 6, 3),
        "aten::_scaled_dot_product_attention_math": ("bhsd", 5, 3),
        "aten::_flash_attention_forward": ("bshd", 8, None),
        "flash_attn::_flash_attn_forward": ("bshd", 5, None)}


def _attention(name, q, k, v, causal, masked, layout) -> OpCost | None:
    if q is None or k is None or v is None:
        return None
    (sq, tq), (sk, tk) = q, k
    if len(sq) != 4 or len(sk) != 4:
        return None
    if layout == "bhsd":
        b, hq, s_q, d = sq
        hkv, s_kv = sk[1], sk[2]
    else:
        b, s_q, hq, d = sq
        s_kv, hkv = sk[1], sk[2]
    if hkv <= 0 or hq % hkv or s_kv < 1 or s_q < 1:
        return None
    note = ""
    if s_q == 1:
        cost = F.decode_attention(b, s_kv, hq, hkv, d, act_dtype=tq, kv_dtype=tk, kv_scales=False)
    else:
        if causal is None or (not causal and masked):
            causal, note = True, "causal assumed"
        cached = max(s_kv - s_q, 0) if causal else 0
        cost = F.prefill_attention(b, s_q, hq, hkv, d, cached_tokens=cached, causal=causal, act_dtype=tq,
                                   kv_dtype=tk, kv_scales=False)   # NB: a framework's 8-bit cache: per-tensor scales
        if causal and s_kv < s_q:
            return None
    sig = f"b{b} q{s_q} kv{s_kv} h{hq}/{hkv} d{d} {tq}" + (" causal" if causal and s_q > 1 else "")
    return OpCost(name, "attention", cost, tq, sig + (f" ({note})" if note else ""), note,
                  {"batch": b, "s_q": s_q, "s_kv": s_kv, "n_heads": hq, "n_kv_heads": hkv, "head_dim": d,
                   "causal": bool(causal)})


def _elementwise(name, base, a: _Args) -> OpCost | None:
    ts = a.tensors()
    real = [t for t in ts if t[0]]                  # 0-dim inputs are scalars: kernel arguments
    if not ts:
        return None
    if not real:
        real = [ts[0]]
    if base == "masked_fill" or base == "where":
        shapes = [t[0] for t in real]
    else:
        real = real[:2]
        shapes = [t[0] for t in real]
    out_shape = _broadcast(shapes)
    if out_shape is None:
        return None
    floats = [t[1] for t in real if t[1] in FLOATS]
    if base in BOOL_OUT:
        out = "bool"
    elif base == "masked_fill":
        out = real[0][1]
    else:
        out = max(floats, key=_b) if floats else real[0][1]
    inputs = tuple((_n(s), d) for s, d in real)
    cost = F.elementwise(_n(out_shape), inputs, out_dtype=out, flops_per_element=ELEMENTWISE[base])
    return OpCost(name, "elementwise", cost, out if out in FLOATS else (floats or ["fp32"])[0],
                  _sig(*shapes, dtype=out))


def _broadcast(shapes):
    nd = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (nd - len(s)) + tuple(s) for s in shapes]):
        big = max(dims)
        if any(d not in (1, big) for d in dims):
            return None
        out.append(big)
    return tuple(out)


def _reduction(name, base, a: _Args) -> OpCost | None:
    x = a.tensor(0)
    if x is None:
        return None
    s, t = x
    dims = None
    raw = str(a.value(1)).strip()
    if raw.startswith("["):
        try:
            dims = [int(v) for v in raw.strip("[]").split(",") if v.strip()]
        except ValueError:
            dims = None
    elif raw.lstrip("-").isdigit():
        dims = [int(raw)]
    if dims and s:    # keepdim changes the output's shape, not its element count
        red = {d % len(s) for d in dims}
        out_n = _n([n for i, n in enumerate(s) if i not in red])
    else:
        out_n = 1
    out_dt = "int64" if base in ("argmax", "argmin") else "bool" if base in ("any", "all") else t
    return OpCost(name, "reduction", F.reduction(_n(s), out_n, in_dtype=t, out_dtype=out_dt), t,
                  _sig(s, dtype=t) + (f" dim{dims}" if dims else ""))


def cost_op(name: str, args: dict, default_dtype: str = "bf16"):
    """An ``OpCost``, ``FRAMEWORK`` (moves nothing), or None (uncosted: not in the table, or no shapes).

    ``default_dtype`` is the run's activation dtype, used only where the trace records no dtype
    (a ``cat`` of a TensorList), and then said in the signature ("dtype assumed").
    """
    if name in _FRAMEWORK:
        return FRAMEWORK
    if name.startswith(COLLECTIVE_OPS):
        from .trace_custom import collective
        return collective(name, args, _Args(args))
    a = _Args(args)
    if not a.dims:
        return None
    ns, _, base = name.rpartition("::")
    try:
        if ns == "aten":
            return _aten(name, base, a, default_dtype)
        from .trace_custom import custom
        return custom(name, base, a)
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None      # shapes the table did not expect: uncosted rather than guessed


def _aten(name, base, a: _Args, default_dtype: str):
    t = a.tensor
    if base == "mm":
        return _gemm(name, t(0), t(1)) if t(0) and t(1) else None
    if base == "bmm":
        return _gemm(name, t(0), t(1), batched=True) if t(0) and t(1) else None
    if base in ("addmm", "baddbmm"):
        return _gemm(name, t(1), t(2), bias=t(0), batched=base == "baddbmm") if t(1) and t(2) else None
    if base == "_scaled_mm":
        code = a.integer(6)
        return _gemm(name, t(0), t(1), bias=t(4), out_dtype=SCALAR_TYPES.get(code)) if t(0) and t(1) else None
    if name in ("aten::linear",):
        return _matmul_like(name, t(0), t(1), bias=t(2), weight_nk=True) if t(0) and t(1) else None
    if name == "aten::matmul":
        return _matmul_like(name, t(0), t(1)) if t(0) and t(1) else None
    if name in SDPA:
        layout, ci, mi = SDPA[name]
        masked = mi is not None and t(mi) is not None and bool(t(mi)[0])
        return _attention(name, t(0), t(1), t(2), a.flag(ci), masked, layout)
    if base == "_efficient_attention_forward":
        mask = a.integer(9)
        return _attention(name, t(0), t(1), t(2), None if mask is None else mask > 0, False, "bshd")
    if base in ("rms_norm", "_fused_rms_norm"):
        from .trace_custom import norm
        return norm(name, a)
    if base in ELEMENTWISE or (base.endswith("_") and base[:-1] in ELEMENTWISE):
        return _elementwise(name, base.rstrip("_") if base[:-1] in ELEMENTWISE else base, a)
    if base in REDUCTIONS:
        return _reduction(name, base, a)
    if base in SOFTMAX:
        x = t(0)
        if x is None:
            return None
        out = SCALAR_TYPES.get(a.integer(2)) if base in ("softmax", "log_softmax") else None
        rows, cols = _n(x[0][:-1]), x[0][-1]
        return OpCost(name, "softmax", F.softmax(rows, cols, in_dtype=x[1], out_dtype=out or x[1]), x[1],
                      _sig(x[0], dtype=x[1]), detail={"shape": list(x[0])})   # attention by matmuls: trace_phases
    if base in ("clone", "contiguous", "reshape", "flatten", "_to_copy"):   # wrappers of a copy or a cast
        x = t(0)
        if x is None:
            return None
        dst = (SCALAR_TYPES.get(a.integer(1)) if base == "_to_copy" else None) or x[1]
        return OpCost(name, "copy" if dst == x[1] else "cast", F.copy(_n(x[0]), src_dtype=x[1], dst_dtype=dst),
                      dst if dst in FLOATS else x[1], _sig(x[0], dtype=f"{x[1]}->{dst}" if dst != x[1] else x[1]))
    if base == "copy_":
        dst, src = t(0), t(1)
        if dst is None or src is None:
            return None
        cost = F.elementwise(_n(dst[0]), ((_n(src[0]), src[1]),), out_dtype=dst[1], flops_per_element=0)
        cat = "copy" if src[1] == dst[1] else "cast"
        return OpCost(name, cat, cost, dst[1] if dst[1] in FLOATS else src[1],
                      _sig(src[0], dtype=f"{src[1]}->{dst[1]}"))
    if base in ("cat", "stack"):
        shapes = a.dims[0] if a.dims and isinstance(a.dims[0], list) else []
        parts = [s for s in shapes if isinstance(s, list) and all(isinstance(x, int) for x in s)]
        if not parts:
            return None
        ty = dtype_of(a.types[0]) if a.types else None   # "TensorList": the element types are not recorded
        dt = ty or default_dtype
        e = sum(_n(s) for s in parts)
        note = "" if ty else f"dtype assumed {dt}: a TensorList's types are not recorded"
        return OpCost(name, "copy", F.copy(e, src_dtype=dt), dt,
                      _sig(*parts, dtype=dt) + (" (dtype assumed)" if note else ""), note)
    if base == "embedding":
        w, idx = t(0), t(1)
        if w is None or idx is None or len(w[0]) != 2:
            return None
        return OpCost(name, "gather", F.embedding(_n(idx[0]), w[0][1], weight_dtype=w[1], act_dtype=w[1]), w[1],
                      _sig(w[0], idx[0], dtype=w[1]))
    if base == "index_select":
        x, idx = t(0), t(2)
        if x is None or idx is None:
            return None
        dim = a.integer(1) or 0
        out = list(x[0])
        out[dim % len(out)] = _n(idx[0])
        return OpCost(name, "gather", F.copy(_n(out), src_dtype=x[1]), x[1], _sig(x[0], idx[0], dtype=x[1]))
    if base in ("index_put_", "index_put"):
        dst, val = t(0), t(2)
        if dst is None or val is None:
            return None
        return OpCost(name, "scatter", F.copy(_n(val[0]), src_dtype=val[1], dst_dtype=dst[1]), dst[1],
                      _sig(val[0], dtype=f"{val[1]}->{dst[1]}"))
    if base == "arange":   # arange(end, ...) 5 args, (start, end, ...) 6, (start, end, step, ...) 7: no tensor inputs
        return _arange(name, a)
    if base in ("fill_", "zero_", "normal_", "uniform_"):
        x = t(0)
        return OpCost(name, "fill", F.fill(_n(x[0]), dtype=x[1]), x[1], _sig(x[0], dtype=x[1])) if x else None
    return None


def _arange(name, a: _Args) -> OpCost | None:
    nargs = len(a.concrete)
    k = {5: 1, 6: 2, 7: 3}.get(nargs)
    try:
        nums = [float(a.value(i)) for i in range(k)] if k else None
    except ValueError:
        return None
    if not nums:
        return None
    start, end, step = (0.0, nums[0], 1.0) if k == 1 else (nums[0], nums[1], nums[2] if k == 3 else 1.0)
    n = max(math.ceil((end - start) / step), 0) if step else 0
    dt = SCALAR_TYPES.get(a.integer(k)) or ("int64" if all(x.is_integer() for x in nums) else "fp32")
    return OpCost(name, "fill", F.fill(n, dtype=dt), dt if dt in FLOATS else "fp32", f"[{n}] {dt}")
