"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer and the top-k selection it makes for
latent attention (``formulas.mla``).

The indexer of one layer (transformers 5.24, ``DeepseekV32Indexer``): q = wq_b(q latent) [T, Hi, Di], one key
k = LayerNorm(wk(x)) [T, Di] per token (shared by its Hi heads), RoPE on the first qk_rope_dim of each, and
per (query, key) pair the score sum_h w_h relu(q_h . k) (w = weights_proj(x) [T, Hi]); each query keeps the
``index_topk`` keys of highest score, and MLA attends to those only.

Conventions (beside the package's):

* The indexer's key cache is stored as the engines store it (vLLM's ``DeepseekV32IndexerCache``, SGLang's
  ``index_k_with_scale_buffer``): fp8 e4m3 keys and one fp32 scale per block of ``INDEX_SCALE_BLOCK`` = 128
  elements, Di + 4 ceil(Di / 128) bytes per token and indexer layer (132 for Di = 128), whatever the run's
  --kv-dtype (which sizes the latent cache only).
* (query, key) pairs are counted exactly (``selected_pairs``: a query at position j, 1-based, sees j keys, the
  diagonal included), not by ``causal_pairs``' halving: the indexer scores n p + n (n + 1) / 2 pairs for n new
  tokens after p cached ones, and attention runs over sum_j min(j, topk) of them.
* The scores' FLOPs are the two products, 2 Hi (Di + 1) per pair (q . k, then the weighted sum over the heads);
  the scale and the ReLU are not counted, as softmax is not in attention. Its bytes: the keys of the chunk's
  context read once per sequence (fp8 + scales), q (act) and w (fp32) read, the scores written in fp32.
* The selection reads the fp32 scores and writes min(j, topk) int32 indices per query (comparisons are not
  FLOPs); sparse attention reads them back.
"""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b

INDEX_KEY_DTYPE = "fp8"      # the indexer's cached keys (e4m3)
INDEX_SCALE_BLOCK = 128      # elements per fp32 scale of a cached key
INDEX_BYTES = 4              # an fp32 score, an fp32 weight, an fp32 scale, an int32 index


def index_key_bytes(head_dim: int) -> int:
    """Bytes of one token's cached indexer key in one layer: head_dim fp8 values + an fp32 scale per 128."""
    return int(head_dim * _b(INDEX_KEY_DTYPE)) + -(-head_dim // INDEX_SCALE_BLOCK) * INDEX_BYTES


def index_cache_bytes(tokens: int, n_layers: int, head_dim: int) -> int:
    """Bytes that ``tokens`` cached tokens of one sequence occupy in the indexer's key cache of ``n_layers``
    layers. DeepSeek-V3.2 (Di 128, 61 layers) at 131,072 tokens: 131,072 x 61 x 132 = 1,055,391,744."""
    return tokens * n_layers * index_key_bytes(head_dim)


def selected_pairs(new_tokens: int, cached_tokens: int = 0, topk: int | None = None) -> int:
    """(query, key) pairs when the query at position j (1-based, j = cached + 1 ... cached + new) sees
    min(j, topk) keys (every earlier key when ``topk`` is None): with m = clamp(topk - cached, 0, new) queries
    below the cap, m p + m (m + 1) / 2 + (new - m) topk, an exact integer (p = cached)."""
    n, p = new_tokens, cached_tokens
    m = n if topk is None else max(0, min(topk - p, n))
    return m * p + m * (m + 1) // 2 + (n - m) * (topk or 0)


def index_append(tokens: int, head_dim: int, *, act_dtype: str = "bf16") -> Cost:
    """The chunk's indexer keys quantized and written to the indexer cache: read k [T, Di] (act), write its fp8
    values and scales (``index_key_bytes``); the absmax and the scaling are not FLOPs (as ``kv_append``)."""
    return Cost(0, tokens * (head_dim * _b(act_dtype) + index_key_bytes(head_dim)))


def index_scores(batch: int, new_tokens: int, cached_tokens: int, n_heads: int, head_dim: int, *,
                 act_dtype: str = "bf16") -> Cost:
    """The indexer's scores of ``new_tokens`` queries of each of ``batch`` sequences over every key up to their
    own (``selected_pairs`` with no cap; a decode step is new_tokens 1 over cached + 1 keys).

    FLOPs = pairs x 2 Hi (Di + 1). Bytes = per sequence, the cached keys of its context (cached + new tokens,
    ``index_key_bytes`` each) read once, q [n, Hi, Di] (act) and w [n, Hi] (fp32) read, the pairs' scores
    written (fp32)."""
    pairs = selected_pairs(new_tokens, cached_tokens)
    keys = (cached_tokens + new_tokens) * index_key_bytes(head_dim)
    q_w = new_tokens * n_heads * (head_dim * _b(act_dtype) + INDEX_BYTES)
    return Cost(batch * pairs * 2 * n_heads * (head_dim + 1), batch * (keys + q_w + pairs * INDEX_BYTES))


def index_topk(batch: int, new_tokens: int, cached_tokens: int, topk: int) -> Cost:
    """The top-k selection: read each query's fp32 scores (``selected_pairs`` uncapped) and write its
    min(j, topk) int32 indices (``selected_pairs`` capped); 0 FLOPs."""
    read = selected_pairs(new_tokens, cached_tokens)
    written = selected_pairs(new_tokens, cached_tokens, topk)
    return Cost(0, batch * (read + written) * INDEX_BYTES)
