"""Runners of the attention op kinds: rope (on q/k heads, or MLA's rope parts), kv_append into the point's KV
cache (8-bit with per-token scales when quantized) and attention over it (the layer's window, softcap and
sinks: the Triton kernels' variants, or the torch path)."""

from __future__ import annotations

from .model import attention_options
from .runner_registry import runner


@runner("rope")
def rope(ctx, spec):
    K, cos, sin, pos = ctx.K, ctx.cos, ctx.sin, ctx.pos
    q, k = (ctx.latent.q_pe, ctx.latent.k_pe) if ctx.latent is not None else (ctx.q, ctx.k)
    if spec.name == "index_rope":                         # DSA's indexer: its first qk_rope_dim of q and k
        P = ctx.cfg.qk_rope_dim
        q, k = ctx.index.q[..., :P], ctx.index.k[:, None, :P]
    return (lambda: K.rope(q, k, cos, sin, pos)), {}


@runner("kv_append")
def kv_append(ctx, spec):
    K, args, skw = ctx.K, (ctx.k, ctx.v, ctx.k_cache, ctx.v_cache, ctx.tok_slot, ctx.pos), ctx.skw
    return (lambda: K.kv_append(*args, **skw)), ({"kv_cache": ctx.kv_cfg["kv_cache"]} if ctx.qkv else {})


@runner("attention")
def attention(ctx, spec):
    akw = attention_options(ctx.cfg, spec.layers[0])
    extra = {key: val for key, val in akw.items() if key != "sm_scale"}
    if "sinks" in ctx.lw:        # GPT-OSS: the Triton kernels' SINKS variant, or the torch path (kernels.sinks)
        akw["sinks"] = ctx.lw["sinks"]
        extra = extra | {"sinks": "Triton kernel" if ctx.triton else "torch path (kernels.sinks)"}
    attend, q, kc, vc, skw = ctx.attend, ctx.q, ctx.k_cache, ctx.v_cache, ctx.skw
    return ((lambda: attend(q, kc, vc, **skw, **akw)),
            (ctx.attn_cfg if ctx.triton else {}) | ctx.kv_cfg | extra)
