"""Trace cost rules for norms and pointwise work: RMSNorm, elementwise ops, reductions, softmax.

* RMSNorm (``aten::rms_norm``, ``aten::_fused_rms_norm``; the serving stacks' in ``custom``): x is
  the input whose last dimension matches a 1-D weight -> ``formulas.rmsnorm`` (``add_rmsnorm``
  when the name says "add").
* Elementwise (``ELEMENTWISE``: FLOPs per output element, 0 for exp/rsqrt/casts; the in-place
  ``op_`` forms too), reductions, softmax -> ``elementwise``, ``reduction``, ``softmax``. A 0-dim
  input (a Python scalar) is a kernel argument: no bytes.
"""

from __future__ import annotations

from ... import formulas as F
from ...dtypes import bytes_per_element
from ..opcost import FLOATS, SCALAR_TYPES, numel, signature
from ..registry import rule

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
REDUCTIONS = ("sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm", "any", "all",
              "argmax", "argmin")
SOFTMAX = ("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax")


def rmsnorm(a):
    """RMSNorm of the input whose last dimension matches a 1-D weight (``add_rmsnorm`` when named "add")."""
    ts = [t for t in a.tensors() if t[1] in FLOATS]
    vec = [t for t in ts if len(t[0]) == 1]
    mats = [t for t in ts if len(t[0]) >= 2]
    if not vec or not mats:
        return None
    w = vec[0]
    x = next((t for t in mats if t[0][-1] == w[0][0]), None)
    if x is None:
        return None
    rows, h = numel(x[0][:-1]), x[0][-1]
    f = F.add_rmsnorm if "add" in a.base else F.rmsnorm
    return a.op(f(rows, h, act_dtype=x[1], weight_dtype=w[1]), x[1], signature(x[0], dtype=x[1]))


@rule(("aten::rms_norm", "aten::_fused_rms_norm"), category="norm")
def aten_rmsnorm(a):
    return rmsnorm(a)


def _broadcast(shapes):
    nd = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (nd - len(s)) + tuple(s) for s in shapes]):
        big = max(dims)
        if any(d not in (1, big) for d in dims):
            return None
        out.append(big)
    return tuple(out)


@rule(tuple(f"aten::{n}{s}" for n in ELEMENTWISE for s in ("", "_")), category="elementwise")
def elementwise(a):
    base = a.base.rstrip("_") if a.base[:-1] in ELEMENTWISE else a.base
    ts = a.tensors()
    real = [t for t in ts if t[0]]                  # 0-dim inputs are scalars: kernel arguments
    if not ts:
        return None
    if not real:
        real = [ts[0]]
    if base not in ("masked_fill", "where"):
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
        out = max(floats, key=bytes_per_element) if floats else real[0][1]
    inputs = tuple((numel(s), d) for s, d in real)
    cost = F.elementwise(numel(out_shape), inputs, out_dtype=out, flops_per_element=ELEMENTWISE[base])
    return a.op(cost, out if out in FLOATS else (floats or ["fp32"])[0], signature(*shapes, dtype=out))


@rule(tuple(f"aten::{n}" for n in REDUCTIONS), category="reduction")
def reduction(a):
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
        out_n = numel([n for i, n in enumerate(s) if i not in red])
    else:
        out_n = 1
    out_dt = "int64" if a.base in ("argmax", "argmin") else "bool" if a.base in ("any", "all") else t
    return a.op(F.reduction(numel(s), out_n, in_dtype=t, out_dtype=out_dt), t,
                signature(s, dtype=t) + (f" dim{dims}" if dims else ""))


@rule(tuple(f"aten::{n}" for n in SOFTMAX), category="softmax")
def softmax(a):
    """Softmax over the last dimension (attention by matmuls: ``roofline.traces.phases``)."""
    x = a.tensor(0)
    if x is None:
        return None
    out = SCALAR_TYPES.get(a.integer(2)) if a.base in ("softmax", "log_softmax") else None
    rows, cols = numel(x[0][:-1]), x[0][-1]
    return a.op(F.softmax(rows, cols, in_dtype=x[1], out_dtype=out or x[1]), x[1], signature(x[0], dtype=x[1]),
                detail={"shape": list(x[0])})
