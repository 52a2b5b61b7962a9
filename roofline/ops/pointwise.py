"""Elementwise kinds: the residual add and the gated activation (per layer), the embedding's scale (before
the layers, over every new token) and the logits' softcap (after them, over one row per sequence)."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _residual(op, s):
    if op.dims.get("scale"):     # x + m * r (Granite's residual_multiplier): a multiply more per element
        a, e = s.dtypes.act, s.rows * op.dims["width"]
        return F.elementwise(e, ((e, a), (e, a)), out_dtype=a, flops_per_element=2)
    return F.residual_add(s.rows, op.dims["width"], act_dtype=s.dtypes.act)


def _activation(op, s):
    d = op.dims
    return (F.swiglu if d["fn"] == "silu" else F.geglu)(s.rows, d["width"], act_dtype=s.dtypes.act)


def _scale(op, s):   # the embedding's or a layer's queries' (every new token), or the logits' (one row per sequence)
    a = s.dtypes.act
    e = (s.batch if op.part == "post" else s.rows) * op.dims["width"]
    return F.elementwise(e, ((e, a),), out_dtype=a)


def _softcap(op, s):    # c * tanh(x / c): a divide and a multiply; tanh, like exp, is not counted
    a = s.dtypes.act
    e = s.batch * op.dims["width"]
    return F.elementwise(e, ((e, a),), out_dtype=a, flops_per_element=2)


RESIDUAL = register(OpKind("residual", "residual", _residual))
ACTIVATION = register(OpKind("activation", "mlp", _activation))
SCALE = register(OpKind("scale", "embed", _scale, edge_cost=_scale))   # per layer: Llama-4's query temperature
SOFTCAP = register(OpKind("softcap", "head", edge_cost=_softcap))
