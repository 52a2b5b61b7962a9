"""DeepSeek Sparse Attention's kinds (DeepSeek-V3.2, GLM-5: ``roofline.formulas.dsa``): index_append (the chunk's
indexer keys written to their fp8 cache), index_scores (every query's scores over every key up to its own) and
index_topk (the selection MLA attends to: ``mla_attention``'s ``topk``). The indexer's projections (wq_b, wk,
weights_proj) are linears, its k_norm a layernorm, its RoPE a rope."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _append(op, s):
    return F.index_append(s.rows, op.dims["head_dim"], act_dtype=s.dtypes.act)


def _scores(op, s):
    d = op.dims
    return F.index_scores(s.batch, s.chunk, s.cached, d["n_heads"], d["head_dim"], act_dtype=s.dtypes.act)


def _topk(op, s):
    return F.index_topk(s.batch, s.chunk, s.cached, op.dims["topk"])


INDEX_APPEND = register(OpKind("index_append", "attention", _append))
# tensor: the engines' scoring (DeepGEMM's fp8_mqa_logits) runs on tensor cores; decode is bound by the keys' bytes
INDEX_SCORES = register(OpKind("index_scores", "attention", _scores, tensor=True, per_sequence=True))
INDEX_TOPK = register(OpKind("index_topk", "attention", _topk, per_sequence=True))
