"""Elementwise kinds: the residual add and the gated activation (per layer), the scale (per layer: Falcon-H1's
multipliers; before the layers: the embedding's, over every new token; after them: the logits', over one row per
sequence) and the logits' softcap (after the layers, over one row per sequence)."""

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
    return ACTIVATION_FORMULAS[d["fn"]](s.rows, d["width"], act_dtype=s.dtypes.act)


# the MLP's activation (ModelConfig.activation) -> its formula: gated (silu, gelu_tanh) or not (relu2)
ACTIVATION_FORMULAS = {"silu": F.swiglu, "gelu_tanh": F.geglu, "relu2": F.relu2}


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
SCALE = register(OpKind("scale", "embed", _scale, edge_cost=_scale))   # per layer: Llama-4's query temperature,
                                                                        # Falcon-H1's multipliers
SOFTCAP = register(OpKind("softcap", "head", edge_cost=_softcap))
