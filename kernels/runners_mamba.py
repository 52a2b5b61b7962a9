"""The runner of Mamba-2's ssd_scan (``roofline.ops.mamba``): the SSD chunked scan of a prefill from zeros (the
config's chunk_size), or the recurrent decode step on the point's states after ``context`` tokens, on random x,
dt, B, C of the layer's sizes and the layer's A_log, dt_bias and D (the states are random, as the KV cache is).
Mamba-2's conv1d and gated norm are kinds Gated DeltaNet shares (``kernels.conv1d``, ``kernels.mamba``'s
``gated_group_rmsnorm``)."""

from __future__ import annotations


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
    state = ctx.rnd(B, H, P, N).float()
    if ctx.phase == "decode":
        conf = step_config(P, N) if ctx.triton else {}
        return (lambda: K.ssd_decode(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots)), conf
    conf = ssd_config(d["chunk"], P, N, ctx.dt) if ctx.triton else {}
    return (lambda: K.ssd_prefill(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, chunk=d["chunk"])), conf
