"""Runners of Gated DeltaNet's op kinds (``roofline.ops.deltanet``): the causal conv1d over q, k, v with the point's
conv states, the gates, the gated delta rule (the chunked prefill from zeros, the recurrent decode step on the
point's states after ``context`` tokens), the gated RMSNorm, and the gated attention's output gate. Inputs are the
context's ``delta`` (``kernels.runner_context.DeltaInputs``); the states are random, as the KV cache is. The conv1d
and gated_norm kinds are Mamba-2's too: a Mamba-2 model's point runs ``kernels.runners_mamba``'s."""

from __future__ import annotations

from roofline import formulas as F

from .conv1d import conv1d_config
from .deltanet import delta_config
from .runner_registry import runner
from .runners_mamba import mamba_conv1d, mamba_gated_norm


@runner("conv1d")
def conv1d(ctx, spec):
    if ctx.mamba is not None:                     # Mamba-2's, over x, B, C with its bias
        return mamba_conv1d(ctx, spec)
    K, d, wt = ctx.K, ctx.delta, ctx.lw["w_conv"]
    return (lambda: K.conv1d(d.qkv, wt, None, d.conv, ctx.slots)), (
        conv1d_config(ctx.n, spec.dims["channels"]) if ctx.triton else {})


@runner("delta_gates")
def delta_gates(ctx, spec):
    K, d, a_log, dt = ctx.K, ctx.delta, ctx.lw["a_log"], ctx.lw["dt_bias"]
    return (lambda: K.delta_gates(d.a, d.b, a_log, dt)), {}


@runner("gated_delta")
def gated_delta(ctx, spec):
    K, d, dims = ctx.K, ctx.delta, spec.dims
    conf = delta_config(dims["k_dim"], dims["v_dim"], chunk=dims["chunk"], dtype=ctx.dt) if ctx.triton else {}
    if ctx.phase == "decode":
        q, k, v = d.q[:, 0], d.k[:, 0], d.v[:, 0]
        g, beta = d.g[:, 0].contiguous(), d.beta[:, 0].contiguous()
        conf = {"block_k": conf["block_k"], "block_v": conf["block_v"], "num_warps": 4} if conf else {}
        return (lambda: K.delta_decode(q, k, v, g, beta, d.state, ctx.slots)), conf
    if dims["chunk"] != F.DELTA_CHUNK:
        raise ValueError(f"the chunked rule runs chunks of {F.DELTA_CHUNK}, not {dims['chunk']}.")
    return (lambda: K.delta_prefill(d.q, d.k, d.v, d.g, d.beta, d.state, ctx.slots)), conf


@runner("gated_norm")
def gated_norm(ctx, spec):
    if ctx.mamba is not None:                     # Mamba-2's, in groups over the inner width
        return mamba_gated_norm(ctx, spec)
    K, d, wt, eps = ctx.K, ctx.delta, ctx.lw["w_gnorm"], ctx.cfg.rms_eps
    return (lambda: K.gated_rmsnorm(d.o, d.z, wt, eps)), {}


@runner("sigmoid_gate")
def sigmoid_gate(ctx, spec):
    K, o, gate = ctx.K, ctx.o, ctx.rows_of(spec.dims["width"])
    return (lambda: K.sigmoid_gate(o, gate)), {}
