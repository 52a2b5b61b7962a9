"""The runners of Mamba-2's ops (``roofline.ops.mamba``): the SSD scan (ssd_scan: the chunked scan of a prefill from
zeros by the config's chunk_size and dt clamp, or the recurrent decode step on the point's states after ``context``
tokens, on random x, dt, B, C of the layer's sizes and the layer's A_log, dt_bias and D), and Mamba-2's conv1d (over
x, B, C with its bias, from the point's conv states) and gated group norm, kinds Gated DeltaNet shares
(``kernels.runners_deltanet`` hands a Mamba-2 model's points here). Inputs are the context's ``mamba``
(``kernels.runner_context.MambaInputs``); the states are random, as the KV cache is. The norm-then-gate order
(Falcon-H1's ``mamba_norm_first``) is timed as the gated norm kernel: the same work."""

from __future__ import annotations


from .conv1d import conv1d_config
from .mamba import ssd_config, step_config
from .runner_registry import runner


@runner("ssd_scan")
def ssd_scan(ctx, spec):
    K, B, n, d, w = ctx.K, ctx.B, ctx.n, spec.dims, ctx.lw
    H, P, N, G = d["heads"], d["head_dim"], d["state"], d["groups"]
    a_log, dt_bias, D = w["A_log"], w["dt_bias"], w["D"]
    slots = ctx.slots
    lead = (B,) if ctx.phase == "decode" else (B, n)
    x, dt, Bm, Cm = ctx.rnd(*lead, H, P), ctx.rnd(*lead, H), ctx.rnd(*lead, G, N), ctx.rnd(*lead, G, N)
    state = ctx.mamba.state if ctx.mamba is not None else ctx.rnd(B, H, P, N).float()
    if ctx.phase == "decode":
        conf = step_config(P, N) if ctx.triton else {}
        return (lambda: K.ssd_decode(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots)), conf
    conf = ssd_config(d["chunk"], P, N, ctx.dt) if ctx.triton else {}
    lim = (ctx.cfg.mamba_dt_min, ctx.cfg.mamba_dt_max or float("inf"))
    return (lambda: K.ssd_prefill(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, chunk=d["chunk"],
                                  dt_limit=lim)), conf


def mamba_conv1d(ctx, spec):
    K, m = ctx.K, ctx.mamba
    wt, bias = ctx.lw["w_conv"], ctx.lw.get("b_conv")
    return (lambda: K.conv1d(m.xbc, wt, bias, m.conv, ctx.slots)), (
        conv1d_config(ctx.n, spec.dims["channels"]) if ctx.triton else {})


def mamba_gated_norm(ctx, spec):
    K, m, wt, eps, G = ctx.K, ctx.mamba, ctx.lw["w_gnorm"], ctx.cfg.rms_eps, spec.dims["groups"]
    return (lambda: K.gated_group_rmsnorm(m.y, m.z, wt, G, eps)), {}
