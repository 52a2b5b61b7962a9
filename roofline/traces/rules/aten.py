"""Trace cost rules for PyTorch's own (``aten::``) ops other than attention and pointwise work.

* GEMM: ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm`` (fp8: A and B in fp8, C in
  ``out_dtype``) -> ``formulas.gemm`` (A + B + C [+ bias]; 2MNK [+ MN]); ``aten::linear`` /
  ``aten::matmul`` from their own shapes (they are wrappers: ``roofline.traces.cost.WRAPPERS``).
* Copies and casts (``clone``, ``contiguous``, ``reshape``, ``flatten``, ``_to_copy``, ``copy_``,
  ``cat``, ``stack``), gathers (``embedding``, ``index_select``), scatters (``index_put_``), fills
  (``fill_``, ``zero_``, random fills, ``arange``).
* Ops that move no data (views, allocations, metadata): ``FRAMEWORK``, their cost truly zero.
"""

from __future__ import annotations

import math

from ... import formulas as F
from ..opcost import FLOATS, FRAMEWORK, SCALAR_TYPES, dtype_of, numel, signature
from ..registry import rule

MOVES_NOTHING = tuple(f"aten::{n}" for n in (
    "view", "_unsafe_view", "_reshape_alias", "as_strided", "transpose", "t", "permute", "unsqueeze",
    "squeeze", "expand", "expand_as", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "detach", "detach_", "alias", "lift_fresh", "resolve_conj", "resolve_neg", "view_as", "unflatten", "empty",
    "empty_strided", "empty_like", "new_empty", "new_empty_strided", "result_type", "is_same_size",
    "is_nonzero", "resize_", "set_", "record_stream", "item", "_local_scalar_dense", "to", "numpy_T", "movedim",
    "swapaxes", "diagonal",
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "scalar_tensor",
    "_has_compatible_shallow_copy_type", "lift", "_assert_async", "sym_size", "sym_stride", "dim", "size")) + (
    "detach_", "detach")   # autograd's own record_function names, without a namespace


def _aten(*bases) -> tuple:
    return tuple(f"aten::{b}" for b in bases)


@rule(MOVES_NOTHING, category=FRAMEWORK, shapes=False)
def moves_nothing(a):
    return FRAMEWORK


def gemm(a, x, w, bias=None, out_dtype=None, batched=False):
    """``x @ w`` (+ bias) of recorded (shape, dtype) pairs: 2-D, or 3-D batched."""
    if x is None or w is None:
        return None
    (sa, ta), (sb, tb) = x, w
    if batched:
        if len(sa) != 3 or len(sb) != 3:
            return None
        batch, m, k, n = sa[0], sa[1], sa[2], sb[2]
    else:
        if len(sa) != 2 or len(sb) != 2:
            return None
        batch, m, k, n = 1, sa[0], sa[1], sb[1]
    bias_n = numel(bias[0]) if bias else 0
    cost = F.gemm(m, k, n, batch=batch, a_dtype=ta, b_dtype=tb, out_dtype=out_dtype or ta, bias=bias_n,
                  bias_dtype=bias[1] if bias else None)
    shapes = ((bias[0],) if bias else ()) + (sa, sb)
    return a.op(cost, ta, signature(*shapes, dtype=ta if ta == tb else f"{ta}x{tb}"),
                detail={"m": m * batch, "k": k, "n": n, "batch": batch})


@rule(_aten("mm"), category="gemm", tensor_cores=True)
def mm(a):
    return gemm(a, a.tensor(0), a.tensor(1))


@rule(_aten("bmm"), category="gemm", tensor_cores=True)
def bmm(a):
    return gemm(a, a.tensor(0), a.tensor(1), batched=True)


@rule(_aten("addmm", "baddbmm"), category="gemm", tensor_cores=True)
def addmm(a):
    return gemm(a, a.tensor(1), a.tensor(2), bias=a.tensor(0), batched=a.base == "baddbmm")


@rule(_aten("_scaled_mm"), category="gemm", tensor_cores=True)
def scaled_mm(a):
    return gemm(a, a.tensor(0), a.tensor(1), bias=a.tensor(4), out_dtype=SCALAR_TYPES.get(a.integer(6)))


def _matmul_like(a, x, w, bias=None, weight_nk=False):
    """linear(x [..., K], W [N, K]) or matmul(x [..., K], W [K, N]) when no op below is costed."""
    if x is None or w is None:
        return None
    (sx, tx), (sw, tw) = x, w
    if len(sw) != 2 or not sx:
        return None
    k, n = (sw[1], sw[0]) if weight_nk else (sw[0], sw[1])
    if sx[-1] != k:
        return None
    m = numel(sx[:-1])
    cost = F.gemm(m, k, n, a_dtype=tx, b_dtype=tw, bias=numel(bias[0]) if bias else 0,
                  bias_dtype=bias[1] if bias else None)
    return a.op(cost, tx, signature(sx, sw, dtype=tx), detail={"m": m, "k": k, "n": n, "batch": 1})


@rule(_aten("linear"), category="gemm", tensor_cores=True)
def linear(a):
    return _matmul_like(a, a.tensor(0), a.tensor(1), bias=a.tensor(2), weight_nk=True)


@rule(_aten("matmul"), category="gemm", tensor_cores=True)
def matmul(a):
    return _matmul_like(a, a.tensor(0), a.tensor(1))


@rule(_aten("clone", "contiguous", "reshape", "flatten", "_to_copy"), category=("copy", "cast"))
def copy_or_cast(a):      # wrappers of a copy or a cast
    x = a.tensor(0)
    if x is None:
        return None
    dst = (SCALAR_TYPES.get(a.integer(1)) if a.base == "_to_copy" else None) or x[1]
    return a.op(F.copy(numel(x[0]), src_dtype=x[1], dst_dtype=dst), dst if dst in FLOATS else x[1],
                signature(x[0], dtype=f"{x[1]}->{dst}" if dst != x[1] else x[1]),
                category="copy" if dst == x[1] else "cast")


@rule(_aten("copy_"), category=("copy", "cast"))
def copy_(a):
    dst, src = a.tensor(0), a.tensor(1)
    if dst is None or src is None:
        return None
    cost = F.elementwise(numel(dst[0]), ((numel(src[0]), src[1]),), out_dtype=dst[1], flops_per_element=0)
    return a.op(cost, dst[1] if dst[1] in FLOATS else src[1], signature(src[0], dtype=f"{src[1]}->{dst[1]}"),
                category="copy" if src[1] == dst[1] else "cast")


@rule(_aten("cat", "stack"), category="copy")
def cat(a):
    """A TensorList's element types are not recorded: the run's activation dtype, said so."""
    shapes = a.dims[0] if a.dims and isinstance(a.dims[0], list) else []
    parts = [s for s in shapes if isinstance(s, list) and all(isinstance(x, int) for x in s)]
    if not parts:
        return None
    ty = dtype_of(a.types[0]) if a.types else None
    dt = ty or a.default_dtype
    e = sum(numel(s) for s in parts)
    note = "" if ty else f"dtype assumed {dt}: a TensorList's types are not recorded"
    return a.op(F.copy(e, src_dtype=dt), dt, signature(*parts, dtype=dt) + (" (dtype assumed)" if note else ""),
                note)


@rule(_aten("embedding"), category="gather")
def embedding(a):
    w, idx = a.tensor(0), a.tensor(1)
    if w is None or idx is None or len(w[0]) != 2:
        return None
    return a.op(F.embedding(numel(idx[0]), w[0][1], weight_dtype=w[1], act_dtype=w[1]), w[1],
                signature(w[0], idx[0], dtype=w[1]))


@rule(_aten("index_select"), category="gather")
def index_select(a):
    x, idx = a.tensor(0), a.tensor(2)
    if x is None or idx is None:
        return None
    dim = a.integer(1) or 0
    out = list(x[0])
    out[dim % len(out)] = numel(idx[0])
    return a.op(F.copy(numel(out), src_dtype=x[1]), x[1], signature(x[0], idx[0], dtype=x[1]))


@rule(_aten("index_put_", "index_put"), category="scatter")
def index_put(a):
    dst, val = a.tensor(0), a.tensor(2)
    if dst is None or val is None:
        return None
    return a.op(F.copy(numel(val[0]), src_dtype=val[1], dst_dtype=dst[1]), dst[1],
                signature(val[0], dtype=f"{val[1]}->{dst[1]}"))


@rule(_aten("fill_", "zero_", "normal_", "uniform_"), category="fill")
def fill(a):
    x = a.tensor(0)
    return a.op(F.fill(numel(x[0]), dtype=x[1]), x[1], signature(x[0], dtype=x[1])) if x else None


@rule(_aten("arange"), category="fill")
def arange(a):
    """arange(end, ...) 5 args, (start, end, ...) 6, (start, end, step, ...) 7: no tensor inputs."""
    k = {5: 1, 6: 2, 7: 3}.get(len(a.concrete))
    try:
        nums = [float(a.value(i)) for i in range(k)] if k else None
    except ValueError:
        return None
    if not nums:
        return None
    start, end, step = (0.0, nums[0], 1.0) if k == 1 else (nums[0], nums[1], nums[2] if k == 3 else 1.0)
    n = max(math.ceil((end - start) / step), 0) if step else 0
    dt = SCALAR_TYPES.get(a.integer(k)) or ("int64" if all(x.is_integer() for x in nums) else "fp32")
    return a.op(F.fill(n, dtype=dt), dt if dt in FLOATS else "fp32", f"[{n}] {dt}")
