"""Runners of multi-head latent attention's op kinds (DeepSeek): the latent cache append, the kv_b_proj work
(decode: the absorption GEMMs; prefill: every key's K and V up-projected) and the attention alone (absorbed
decode over the latent cache, or the naive prefill's torch path)."""

from __future__ import annotations

import torch

from .dsa import selection_mask
from .quant import decode_kv_b
from .runner_registry import runner
from .runners_linear import linear_run_config


@runner("latent_append")
def latent_append(ctx, spec):
    lat, tok_slot, pos = ctx.latent, ctx.tok_slot, ctx.pos

    def append():
        lat.ckv[tok_slot, pos] = lat.c_lat
        lat.kpe[tok_slot, pos] = lat.k_pe[:, 0]
    return append, {}


@runner("mla_up")
def mla_up(ctx, spec):
    """Decode: the absorption GEMMs (a float, dequantized, kv_b_proj); prefill: every key's K and V."""
    cfg, K, wkv = ctx.cfg, ctx.K, ctx.lw["wkv_b"]
    if ctx.phase == "decode":
        Hq, N = ctx.lcfg.n_heads, cfg.qk_nope_dim
        wb = decode_kv_b(ctx.lw).view(cfg.kv_lora_rank, Hq, N + cfg.v_head_dim)
        qn, ol = ctx.latent.q_nope, ctx.rnd(ctx.T, Hq, cfg.kv_lora_rank)

        def absorb():
            torch.einsum("bhn,rhn->bhr", qn, wb[..., :N])
            return torch.einsum("bhr,rhv->bhv", ol, wb[..., N:])
        return absorb, {"form": "absorbed (q W_UK, o W_UV)"} | (
            {"weights": f"{ctx.prec.run.weight(spec).name} kv_b_proj dequantized at load ({ctx.dname})"}
            if ctx.prec.run.quantized(spec) else {})
    lat = ctx.rows_of(cfg.kv_lora_rank) if ctx.n == ctx.kv_len else ctx.rnd(ctx.B * ctx.kv_len, cfg.kv_lora_rank)
    return (lambda: K.linear(lat, wkv)), {"form": "naive (every key up-projected)"} | (
        linear_run_config(ctx, lat.shape[0], wkv) if ctx.prec.run.quantized(spec) else {})


@runner("mla_attention")
def mla_attention(ctx, spec):
    """The attention alone: its kv_b_proj work is mla_up's runner (and cost)."""
    cfg, K, rnd, lat = ctx.cfg, ctx.K, ctx.rnd, ctx.latent
    T, B, n, kv_len, Hq = ctx.T, ctx.B, ctx.n, ctx.kv_len, ctx.lcfg.n_heads
    R, N, V, P = cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.v_head_dim, cfg.qk_rope_dim
    if ctx.phase == "decode" and ctx.index is not None:    # DSA: over the latents the indexer selected
        q_lat, idx, slots = rnd(T, Hq, R), ctx.index.indices, ctx.slots
        return ((lambda: K.mla_sparse_decode(q_lat, lat.q_pe, lat.ckv, lat.kpe, idx, slots, sm_scale=cfg.scale)),
                {"form": "sparse absorbed decode (Triton mla_sparse_decode)" if ctx.triton else
                 "sparse absorbed decode (torch path)", "topk": cfg.index_topk})
    if ctx.phase == "decode":        # the absorbed query [T, Hq, R] over the latent cache
        q_lat, lens_, slots = rnd(T, Hq, R), ctx.pos + 1, ctx.slots
        return ((lambda: K.mla_decode(q_lat, lat.q_pe, lat.ckv, lat.kpe, lens_, slots, sm_scale=cfg.scale,
                                      max_len=kv_len)),
                {"form": "absorbed decode (Triton mla_decode)" if ctx.triton else "absorbed decode (torch path)"})
    # naive prefill: per-head q [B, n, Hq, N + P] against every key's up-projected K and V
    qf, kf, vf = rnd(B, n, Hq, N + P), rnd(B, kv_len, Hq, N + P), rnd(B, kv_len, Hq, V)
    if ctx.index is not None:        # DSA: each query's top-k of the keys up to its own, as a mask
        keep = selection_mask(ctx.index.indices, kv_len).view(B, n, kv_len)
        return (lambda: K.mla_prefill(qf, kf, vf, sm_scale=cfg.scale, cached=0, keep=keep)), {
            "form": "naive prefill under the top-k mask (torch SDPA path)", "topk": cfg.index_topk}
    return (lambda: K.mla_prefill(qf, kf, vf, sm_scale=cfg.scale, cached=0)), {
        "form": "naive prefill (torch SDPA path)"}
