"""The linear kind: y = x W (+ b), per layer over every row of the chunk; after the layers (lm_head) over one
row per sequence, vocab-parallel under tensor parallelism (``formulas.lm_head``)."""

from __future__ import annotations

from .. import formulas as F
from ..dtypes import bytes_per_element
from .registry import OpKind, register


def stored(op, s) -> float:
    """The op's K x N weight as its format stores it, scales included (``roofline.precision``:
    ``Precision.weight_bytes``)."""
    d, dt = op.dims, s.dtypes
    return dt.precision.weight_bytes(op, d["in_features"], d["out_features"], dt.act)


def _cost(op, s):
    d, dt = op.dims, s.dtypes
    return F.linear(s.rows, d["in_features"], d["out_features"], act_dtype=dt.act, bias=d["bias"],
                    weight_bytes=stored(op, s))


def _edge_cost(op, s):   # lm_head: only the last position of each sequence needs logits
    d, dt = op.dims, s.dtypes
    return F.lm_head(s.batch, d["in_features"], d["out_features"], act_dtype=dt.act, weight_bytes=stored(op, s))


def _weight_bytes(op, s):
    """The weight as stored, its scales included (``stored``), + a bias in the activation dtype."""
    d, dt = op.dims, s.dtypes
    return stored(op, s) + (d["out_features"] * bytes_per_element(dt.act) if d.get("bias") else 0)


LINEAR = register(OpKind("linear", "mlp", _cost, _edge_cost, _weight_bytes, tensor=True, linear=True))
