"""The norm kinds: RMSNorm over ``width`` features, ``rows`` rows per token (q_norm: one per head); after the
layers (the final norm) over one row per sequence; layernorm (nn.LayerNorm, with a bias: the DSA indexer's k_norm)."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _cost(op, s):   # no weight: Llama-4's qk-norm (x / rms(x))
    a = s.dtypes.act
    return F.rmsnorm(s.rows * op.dims["rows"], op.dims["width"], act_dtype=a, weight_dtype=a, weight=bool(op.weights))


def _edge_cost(op, s):
    a = s.dtypes.act
    return F.rmsnorm(s.batch, op.dims["width"], act_dtype=a, weight_dtype=a)


NORM = register(OpKind("norm", "norm", _cost, _edge_cost))


def _layernorm(op, s):
    a = s.dtypes.act
    return F.layernorm(s.rows * op.dims["rows"], op.dims["width"], act_dtype=a, weight_dtype=a)


LAYERNORM = register(OpKind("layernorm", "norm", _layernorm))   # nn.LayerNorm with its bias (the DSA indexer's)
