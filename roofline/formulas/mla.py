"""Multi-head latent attention (DeepSeek-V2/V3).

The cache holds one latent per token per layer: c_kv (kv_lora_rank, after kv_a_layernorm) and the shared
rope key k_pe (qk_rope_head_dim, rope applied), the same for every head. K and V are kv_b_proj's
up-projections of c_kv: k_nope = c_kv W_UK^T (nope dims per head), v = c_kv W_UV^T (v_head_dim per head).
"""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b
from .attention import causal_pairs
from .dsa import INDEX_BYTES, selected_pairs


def mla_cache_bytes(tokens: int, n_layers: int, kv_lora_rank: int, rope_dim: int, *, kv_dtype: str = "bf16") -> float:
    """Bytes that ``tokens`` cached tokens of one sequence occupy across ``n_layers`` MLA layers:
    tokens * L * (kv_lora_rank + rope_dim) * bytes (one latent and one rope key per token, shared by
    every head). DeepSeek-V3 (rank 512, rope 64, 61 layers, bf16) at 4,096 tokens: 287,834,112."""
    return tokens * n_layers * (kv_lora_rank + rope_dim) * _b(kv_dtype)


def mla_decode_attention(batch: int, kv_len: int, n_heads: int, kv_lora_rank: int, rope_dim: int, *,
                         act_dtype: str = "bf16", kv_dtype: str = "bf16", topk: int = 0) -> Cost:
    """ABSORBED MLA decode (what ``kernels.mla.mla_decode`` runs): one query per sequence over ``kv_len``
    cached latents (the new token's included), scores and output in the latent space.

    The query arrives absorbed (q_nope W_UK: a [rank] vector per head) with its rope part (rope_dim);
    per head per key the score is q_latent . c_kv (rank) + q_pe . k_pe (rope dim), and the output is
    the probabilities times c_kv (rank): FLOPs = 2*B*H*S*(rank + rope) + 2*B*H*S*rank.
    Bytes = the latent cache, B * S * (rank + rope) (KV dtype), read ONCE per sequence: every head
    shares it (MQA-like, intensity ~ 2H FLOP per cached element), + q read (B*H*(rank + rope)) and
    o_latent written (B*H*rank) in the activation dtype. The absorption GEMMs (q_nope W_UK before,
    o_latent W_UV after) are not here: ``mla_absorb_flops``.

    ``topk`` (DeepSeek Sparse Attention, ``formulas.dsa``): the query attends to the min(kv_len, topk) latents
    the indexer selected, gathered by their int32 indices (read too); 0: every one.
    """
    idx = 0
    if topk:
        kv_len = min(kv_len, topk)
        idx = batch * kv_len * INDEX_BYTES
    flops = 2 * batch * n_heads * kv_len * (kv_lora_rank + rope_dim) + 2 * batch * n_heads * kv_len * kv_lora_rank
    cache = batch * kv_len * (kv_lora_rank + rope_dim) * _b(kv_dtype)
    q_o = batch * n_heads * (2 * kv_lora_rank + rope_dim) * _b(act_dtype)
    return Cost(flops, cache + q_o + idx)


def mla_prefill_attention(batch: int, new_tokens: int, n_heads: int, nope_dim: int, rope_dim: int, v_dim: int, *,
                          cached_tokens: int = 0, kv_lora_rank: int | None = None, causal: bool = True,
                          act_dtype: str = "bf16", kv_dtype: str = "bf16", topk: int = 0) -> Cost:
    """NAIVE MLA attention (prefill, as transformers' DeepseekV3Attention runs it): K and V are up-projected
    from the latents (kv_b_proj, a linear op counted apart) for all S_kv = cached + new tokens, then plain
    multi-head attention with per-head q/k dims nope + rope and v dims ``v_dim`` (H KV heads: no sharing).

    FLOPs = 2*B*H*pairs*(nope + rope) + 2*B*H*pairs*v_dim; pairs as ``prefill_attention`` (causal halving,
    ``causal_pairs``; S_q * S_kv non-causal). Bytes (activation dtype for the computed tensors): q read
    (B*n*H*(nope + rope)), K read (B*S_kv*H*(nope + rope)), V read (B*S_kv*H*v_dim), o written (B*n*H*v_dim),
    + the latent cache read for the cached prefix (B * cached * (``kv_lora_rank`` + rope), KV dtype; the new
    tokens' latents come from the projection), so ``kv_lora_rank`` is needed when ``cached_tokens`` > 0.
    With new_tokens=1 and causal=False it is the naive decode (each step re-expands the whole cache).
    ``topk`` (DeepSeek Sparse Attention, ``formulas.dsa``): each query attends to min(j, topk) keys (j its
    1-based position: ``selected_pairs``, exact), whose int32 indices it reads; K and V are still expanded and
    read once for every token (the keys any query selected), as transformers' expand_kv does.
    """
    if cached_tokens and kv_lora_rank is None:
        raise ValueError("mla_prefill_attention with cached_tokens > 0 reads the latent cache: pass kv_lora_rank.")
    s_kv = cached_tokens + new_tokens
    if topk:
        pairs = selected_pairs(new_tokens, cached_tokens, topk)
    else:
        pairs = causal_pairs(new_tokens, cached_tokens) if causal else new_tokens * s_kv
    qk = nope_dim + rope_dim
    flops = 2 * batch * n_heads * pairs * qk + 2 * batch * n_heads * pairs * v_dim
    act = batch * n_heads * (new_tokens * (qk + v_dim) + s_kv * (qk + v_dim)) * _b(act_dtype)
    latent = batch * cached_tokens * ((kv_lora_rank or 0) + rope_dim) * _b(kv_dtype)
    return Cost(flops, act + latent + (batch * pairs * INDEX_BYTES if topk else 0))


def mla_absorb_flops(tokens: int, n_heads: int, nope_dim: int, v_dim: int, kv_lora_rank: int) -> int:
    """FLOPs of the absorbed form's two per-head GEMMs for ``tokens`` queries: q_latent = q_nope W_UK
    (2*T*H*nope*rank) before the attention and o = o_latent W_UV^T (2*T*H*rank*v) after it:
    2*T*H*rank*(nope + v), the same as applying kv_b_proj to T tokens (their weight bytes are
    kv_b_proj's, H*(nope + v)*rank, read once per step)."""
    return 2 * tokens * n_heads * kv_lora_rank * (nope_dim + v_dim)

