"""The embedding kind: the rows of every new token gathered from the table (vocab-parallel under tensor
parallelism: ``formulas.embedding``'s ``vocab_shards``)."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _edge_cost(op, s):
    a = s.dtypes.act
    return F.embedding(s.rows, op.dims["hidden"], weight_dtype=s.dtypes.precision.element_dtype(op, a), act_dtype=a,
                       vocab_shards=s.tp)


EMBEDDING = register(OpKind("embedding", "embed", edge_cost=_edge_cost))
