"""Runners of the row-wise op kinds: the embedding gather, the embedding scale, RMSNorm (the layer's norms, the
qk-norms per head, the final norm), the residual add, the MLP activation (SwiGLU / GeGLU / ReLU²) and the final
logit softcap."""

from __future__ import annotations

import torch

from .runner_registry import runner
from .tp import embed_local


@runner("embedding")
def embedding(ctx, spec):
    K, ids, table = ctx.K, ctx.ids, ctx.w["embed"]
    if ctx.tp is None:
        return (lambda: K.embedding(ids, table)), {}
    rows = ctx.sh.vocab_rows(ctx.tp.rank)                 # this rank's part of the vocab-parallel table
    return (lambda: embed_local(K, ids, table, rows)), {}


@runner("scale")
def scale(ctx, spec):
    f = spec.dims["factor"]
    if isinstance(f, tuple):        # Falcon-H1's mup vector: a factor per part of in_proj's output, one per column
        s_ = torch.ones(spec.dims["width"], dtype=ctx.dt, device=ctx.dev)
    else:
        s_ = torch.tensor(f, dtype=ctx.dt, device=ctx.dev)
    # the logits' scale, Llama-4's query temperature (a factor per position: timed as one), the embedding's, or a
    # layer's multiplier on rows of its width (Falcon-H1's muP)
    x = (ctx.logits if spec.part == "post" else ctx.q if spec.name == "attn_temperature"
         else ctx.x if spec.part == "pre" else ctx.rows_of(spec.dims["width"]))
    return (lambda: x * s_), {}


@runner("norm")
def norm(ctx, spec):
    K, eps = ctx.K, ctx.cfg.rms_eps
    if spec.weights:
        key = spec.weights[0].key
        nw = ctx.w[key] if key in ctx.w else ctx.lw[key]
    else:                                                 # Llama-4's weightless qk-norm: x / rms(x)
        nw = torch.ones(spec.dims["width"], dtype=ctx.dt, device=ctx.dev)
    if spec.part == "post":
        src = ctx.last
    elif spec.dims["rows"] > 1:                           # qk-norm: each head's D features (OLMo-2's: one row)
        src = (ctx.q if spec.name == "q_norm" else ctx.k).view(-1, ctx.cfg.head_dim)
    else:
        src = ctx.rows_of(spec.dims["width"])
    return (lambda: K.rmsnorm(src, nw, eps)), {}


@runner("residual")
def residual(ctx, spec):
    K, x, r = ctx.K, ctx.x, ctx.r
    if spec.dims.get("scale"):                            # x + m * r (Granite)
        m = spec.dims["scale"]
        return (lambda: K.residual_add(x, r * m)), {}
    return (lambda: K.residual_add(x, r)), {}


@runner("activation")
def activation(ctx, spec):
    K, width = ctx.K, spec.dims["width"]
    if spec.dims.get("fn") == "relu2":                    # Nemotron-H's MLP or shared expert: relu(up)^2, no gate
        u = ctx.up if width == ctx.lcfg.intermediate else ctx.rnd(ctx.T, width)
        return (lambda: K.relu2(u)), {}
    if width != ctx.lcfg.intermediate:                    # a shared expert's (its own width), Mamba-2's y x silu(z)
        g2, u2 = ctx.rnd(ctx.T, width), ctx.rnd(ctx.T, width)
        return (lambda: K.swiglu(g2, u2)), {}
    fn = K.swiglu if ctx.cfg.activation == "silu" else K.geglu
    gate, up = ctx.gate, ctx.up
    return (lambda: fn(gate, up)), {}


@runner("softcap")
def softcap(ctx, spec):
    c, logits = spec.dims["cap"], ctx.logits
    return (lambda: torch.tanh(logits / c) * c), {}
