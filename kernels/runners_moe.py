"""Runners of the mixture-of-experts op kinds: the router (the gate GEMM and the top-k), the routed experts (one
grouped GEMM on the point's own routing; under expert parallelism this rank's experts on the rows dispatched to
it, with that load's cost) and the shared expert's sigmoid gate (Qwen2-MoE)."""

from __future__ import annotations

import torch

from roofline import formulas as F
from roofline.ops.moe import expert_bytes

from .model import route
from .quant import expert_weights_config
from .runner_registry import runner
from .tp import own_rows


def _expert_kw(ctx) -> dict:
    lw = ctx.lw
    return dict(activation=ctx.cfg.expert_activation, b_gate=lw.get("experts_gate_bias"),
                b_up=lw.get("experts_up_bias"), b_down=lw.get("experts_down_bias"))


@runner("router")
def router(ctx, spec):
    K, lcfg, lw, h = ctx.K, ctx.lcfg, ctx.lw, ctx.h
    return (lambda: route(K, lcfg, lw, h)), {"router": ctx.cfg.router}


@runner("experts")
def experts(ctx, spec):
    if ctx.ep:
        return _ep_experts(ctx, spec)
    K, lw, h, rt, e_kw = ctx.K, ctx.lw, ctx.h, ctx.routing, _expert_kw(ctx)
    return ((lambda: K.moe_experts(h, lw.get("experts_gate"), lw["experts_up"], lw["experts_down"], rt.weights, rt.ids,
                                   **e_kw)),
            {"experts_touched": rt.touched, "of": ctx.cfg.n_experts, "expert_imbalance": rt.imbalance,
             "routing": "this point's own (random rows through the layer's router)"}
            | expert_weights_config(lw["experts_up"], K.name))


def _ep_experts(ctx, spec) -> tuple:
    """(fn, config with its "cost") of one rank's routed experts under expert parallelism: its E/N experts on the
    rows this point's routing dispatches to it (each weighted by its routing weight), then the sum of its owned
    tokens' k returned partials; the cost is ``formulas.moe_experts_ep`` for exactly that load (the rows and the
    distinct experts it saw)."""
    K, cfg, lw, h, sh, rank, plan = ctx.K, ctx.cfg, ctx.lw, ctx.h, ctx.sh, ctx.tp.rank, ctx.routing.plan
    xs = h[plan.recv_tok]
    back = h.new_zeros(sum(plan.send), h.shape[1])              # the combine's returned partials
    T = h.shape[0]
    own = h.new_zeros(len(own_rows(T, sh.tp, rank)), h.shape[1])
    e_kw = _expert_kw(ctx)
    rows, ids_, w_ = xs.shape[0], plan.recv_ids[:, None], plan.recv_w

    def fn():
        if rows:
            K.moe_experts(xs, lw.get("experts_gate"), lw["experts_up"], lw["experts_down"], w_, ids_, **e_kw)
        own.zero_().index_add_(0, plan.token, back)

    distinct = int(torch.unique(plan.recv_ids).numel()) if ctx.dev.type != "meta" else 0
    cost = F.moe_experts_ep(T, cfg.hidden, cfg.moe_intermediate, cfg.n_experts, cfg.n_active, sh.ep, rows=rows,
                            distinct=distinct, activation=cfg.expert_activation, bias=cfg.expert_bias,
                            act_dtype=ctx.dname, expert_bytes=expert_bytes(spec, ctx.prec.run, ctx.dname))
    return fn, {"cost": cost, "experts_touched": distinct, "of": sh.n_experts, "rows": rows,
                "routing": "this point's own (random rows through the layer's router), dispatched to this rank's "
                           f"experts {sh.experts(rank).start}..{sh.experts(rank).stop - 1}"} | expert_weights_config(
        lw["experts_up"], K.name)


@runner("gate")
def gate(ctx, spec):
    K, gv, h, x = ctx.K, ctx.lw["ws_gate_vec"], ctx.h, ctx.x
    return (lambda: torch.sigmoid(K.linear(h, gv)) * x), {}
