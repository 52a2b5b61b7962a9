"""Runners of DeepSeek Sparse Attention's op kinds (``roofline.ops.dsa``, ``kernels.dsa``): the indexer's k_norm
(layernorm), its key cache append, its scores over every visible key and their top-k. The indexer's projections
are linears (``runners_linear``), its RoPE the rope runner's, the sparse attention mla_attention's
(``runners_mla``)."""

from __future__ import annotations

from .dsa import index_topk
from .mla_layer import INDEX_NORM_EPS
from .runner_registry import runner


@runner("layernorm")
def layernorm(ctx, spec):
    K, x = ctx.K, ctx.rows_of(spec.dims["width"])
    w, b = (ctx.lw[ws.key] for ws in spec.weights)
    return (lambda: K.layernorm(x, w, b, INDEX_NORM_EPS)), {"form": "torch layer_norm (both backends)"}


@runner("index_append")
def index_append(ctx, spec):
    ix, tok_slot, pos = ctx.index, ctx.tok_slot, ctx.pos

    def append():
        ix.cache[tok_slot, pos] = ix.k
    return append, {"index_cache": f"{ctx.dname} keys (the formula prices fp8 + fp32 scales per 128)"}


@runner("index_scores")
def index_scores(ctx, spec):
    K, ix, S = ctx.K, ctx.index, ctx.kv_len
    return ((lambda: K.index_scores(ix.q, ix.w, ix.cache, ix.slots, ix.limits, max_len=S)),
            {"form": "Triton index_scores" if ctx.triton else "torch path (batched matmuls)"})


@runner("index_topk")
def index_topk_(ctx, spec):
    scores, k = ctx.index.scores, spec.dims["topk"]
    return (lambda: index_topk(scores, k)), {"form": "torch.topk (both backends)"}
