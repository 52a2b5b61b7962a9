"""Multi-head latent attention's layer (DeepSeek-V2/V3, Kimi, GLM MoE) and DeepSeek Sparse Attention's indexer
(DeepSeek-V3.2, GLM-5) as ``kernels.model``'s layers call them: the latent projections and their cache, the
indexer's keys, scores and top-k selection, and the prefill and decode attends over the latent cache (the selected
rows where an indexer chose them), split out of ``kernels.model``, whose layers call them."""
from __future__ import annotations

import torch

from roofline.models import ModelConfig

from . import dsa as DSA
from .quant import decode_kv_b


def mla_attention(ops, cfg: ModelConfig, w: dict, h, cos, sin, pos, tok_slot, ckv_cache, kpe_cache, attend,
                  index_cache=None):
    """DeepSeek's latent attention on T rows: q (low-rank), the latent c_kv and the rope key appended to
    their caches ([slots, L, R], [slots, L, P]), then ``attend(q_nope, q_pe, ckv_cache, kpe_cache, w)`` (naive
    prefill or absorbed decode: ``mla_prefill_attend`` / ``mla_decode_attend``) -> [T, H * v_head_dim].
    DeepSeek Sparse Attention (``cfg.index_topk``): the indexer's query, key (appended to ``index_cache``) and
    head weights go to ``attend`` as ``index=``, which attends to each query's top-k (``indexer``); a layer with
    no indexer of its own (GLM-5's "shared") passes ``SHARED``: the selection the step's last indexer made."""
    T, Hq, N, P, R = h.shape[0], cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.kv_lora_rank
    index = None
    if "wq_a" in w:
        q_resid = ops.rmsnorm(ops.linear(h, w["wq_a"]), w["q_a_norm"], cfg.rms_eps)
        q = ops.linear(q_resid, w["wq_b"])
        if cfg.index_topk:               # GLM-5's shared layers (no indexer weights) reuse the last selection
            index = indexer(ops, cfg, w, h, q_resid, cos, sin, pos, tok_slot, index_cache) if "wi_q" in w else SHARED
    else:
        q = ops.linear(h, w["wq"])
    q = q.view(T, Hq, N + P)
    kv = ops.linear(h, w["wkv_a"])                                        # [T, R + P]
    c = ops.rmsnorm(kv[:, :R].contiguous(), w["kv_a_norm"], cfg.rms_eps)  # the latent: normalised, then cached
    q_pe, k_pe = q[..., N:].contiguous(), kv[:, R:].contiguous().view(T, 1, P)
    ops.rope(q_pe, k_pe, cos, sin, pos)
    ckv_cache[tok_slot, pos] = c.to(ckv_cache.dtype)
    kpe_cache[tok_slot, pos] = k_pe[:, 0].to(kpe_cache.dtype)
    o = attend(q[..., :N], q_pe, ckv_cache, kpe_cache, w, **({"index": index} if index else {}))   # [T, H, V]
    return o.reshape(T, Hq * cfg.v_head_dim)


INDEX_NORM_EPS = 1e-6     # transformers' DeepseekV32Indexer.k_norm (nn.LayerNorm(head_dim, eps=1e-6))
SHARED = "shared"         # attend's index on a layer that reuses the previous indexer's selection (GLM-5)


def indexer(ops, cfg: ModelConfig, w: dict, h, q_resid, cos, sin, pos, tok_slot, index_cache) -> tuple:
    """DeepSeek Sparse Attention's lightning indexer on T rows (transformers' DeepseekV32Indexer): q = wq_b(q
    latent) [T, Hi, Di], k = LayerNorm(wk(h)) [T, Di] (appended to ``index_cache`` [slots, L, Di]), RoPE
    (half-split) on the first qk_rope_dim of each, the head weights weights_proj(h) x Hi^-0.5 in fp32 ->
    (q, w, index_cache) for ``attend``'s selection (``kernels.dsa``)."""
    T, Hi, Di, P = h.shape[0], cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_dim
    qi = ops.linear(q_resid, w["wi_q"]).view(T, Hi, Di)
    ki = ops.layernorm(ops.linear(h, w["wi_k"]), w["wi_knorm"], w["bi_knorm"], INDEX_NORM_EPS).view(T, 1, Di)
    ops.rope(qi[..., :P], ki[..., :P], cos, sin, pos)
    wi = ops.linear(h, w["wi_w"]).float() * Hi ** -0.5
    index_cache[tok_slot, pos] = ki[:, 0].to(index_cache.dtype)
    return qi, wi, index_cache


def _select(ops, cfg: ModelConfig, index, slots, limits, max_len: int, last: dict):
    """Each query row's top-k key indices [T, min(topk, max_len)] (int32, -1: none) from ``indexer``'s output,
    kept in ``last`` (the attend closure's: one step, every layer) for the ``SHARED`` layers after it."""
    if isinstance(index, str):
        return last["indices"]
    qi, wi, icache = index
    last["indices"] = DSA.index_topk(ops.index_scores(qi, wi, icache, slots, limits, max_len=max_len), cfg.index_topk)
    return last["indices"]


def _kv_b(cfg: ModelConfig, w: dict):
    """kv_b_proj [R, H * (nope + v)] as [R, H, nope + v] (a quantized one's load-time dequantized copy)."""
    return decode_kv_b(w).view(cfg.kv_lora_rank, cfg.n_heads, cfg.qk_nope_dim + cfg.v_head_dim)


def mla_prefill_attend(ops, cfg: ModelConfig, slots, cached: int, n: int):
    """Naive MLA for n new tokens per sequence after ``cached``: every key's latent up-projected to per-head
    K (nope, + the shared rope key) and V, then causal attention (``ops.mla_prefill``, a torch path)."""
    last = {}

    def attend(q_nope, q_pe, ckv, kpe, w, index=None):
        B, S, Hq = slots.shape[0], cached + n, cfg.n_heads
        N, V = cfg.qk_nope_dim, cfg.v_head_dim
        c = ckv[slots, :S]                                                # [B, S, R]
        kvb = ops.linear(c.reshape(B * S, -1), w["wkv_b"]).view(B, S, Hq, N + V)    # quantized or float
        k = torch.cat([kvb[..., :N], kpe[slots, :S][:, :, None, :].expand(B, S, Hq, -1)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1).reshape(B, n, Hq, -1)
        keep = None
        if index is not None:          # DSA: each query attends to its top-k of the keys up to its own
            lim = (cached + 1 + torch.arange(n, device=q.device)).repeat(B)
            idx = _select(ops, cfg, index, slots.repeat_interleave(n), lim, S, last)
            keep = DSA.selection_mask(idx, S).view(B, n, S)
        o = ops.mla_prefill(q, k, kvb[..., N:], sm_scale=cfg.scale, cached=cached, keep=keep)
        return o.reshape(B * n, Hq, V)
    return attend


def mla_decode_attend(ops, cfg: ModelConfig, lengths, slots, max_len: int):
    """Absorbed MLA for one new token per sequence: q_nope W_UK -> the latent query, ``ops.mla_decode`` over the
    latent cache, the latent output times W_UV."""
    last = {}

    def attend(q_nope, q_pe, ckv, kpe, w, index=None):
        wb = _kv_b(cfg, w)                                                # [R, H, N + V]
        N = cfg.qk_nope_dim
        q_lat = torch.einsum("bhn,rhn->bhr", q_nope, wb[..., :N])
        if index is not None:          # DSA: the latents the indexer selected
            idx = _select(ops, cfg, index, slots, lengths, max_len, last)
            o_lat = ops.mla_sparse_decode(q_lat.contiguous(), q_pe, ckv, kpe, idx, slots, sm_scale=cfg.scale)
        else:
            o_lat = ops.mla_decode(q_lat.contiguous(), q_pe, ckv, kpe, lengths, slots, sm_scale=cfg.scale,
                                   max_len=max_len)
        return torch.einsum("bhr,rhv->bhv", o_lat, wb[..., N:])
    return attend
