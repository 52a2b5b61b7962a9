"""Runners of the GEMM op kind ("linear": projections, the shared experts' linears, lm_head) and the config a
linear's runner reports (``linear_run_config``: the Triton tiles, or the quantized weights' torch path).

A linear reads the rows its weight's sharding says it follows: a row-parallel weight (``q_rows``,
``mla_o_rows``: over the attention's heads; ``i_rows``: over the MLP's intermediate features) the output of the
op before it (the attention output, the activation), any other the hidden rows; a width that differs from
those (MLA's low-rank inputs, a shared expert's) gets rows of its own width.
"""

from __future__ import annotations

from .linear import linear_config
from .quant import weight_label
from .quant_weight import QuantWeight, weight_format
from .runner_registry import runner

# the weight's sharding rule -> the RunContext input a linear of that weight reads (others: the hidden rows)
INPUT_OF_SHARD = {"q_rows": "o", "mla_o_rows": "o", "i_rows": "act"}


def linear_run_config(ctx, M: int, wt) -> dict:
    """What a [M, K] x ``wt`` linear runs: the Triton kernel's tiles (a quantized weight's: its format's
    ``triton_config``), or on the torch backend the quantized weights' implementation (the ecosystem op, or a
    dequantize reference); a quantized weight's format as the precision registry says it (``weight_label``)."""
    Kd, N = wt.shape
    if not isinstance(wt, QuantWeight):
        return linear_config(M, N, Kd, ctx.dt, ctx.dev) if ctx.triton else {}
    label = {"weights": weight_label(wt)}
    if not ctx.triton:
        return {**label, "impl": wt.torch_impl or "not prepared"}
    return {**label, **weight_format(wt.dtype).triton_config(wt, M, ctx.dt, ctx.dev)}


@runner("linear")
def linear(ctx, spec):
    K, w = ctx.K, ctx.w
    if spec.part == "post":                                   # lm_head: the last rows of each sequence
        return (lambda: K.linear(ctx.last, w["lm_head"])), linear_run_config(ctx, len(ctx.last), w["lm_head"])
    wspec = spec.weights[0]
    bias = ctx.lw.get(spec.weights[1].key) if len(spec.weights) > 1 else None
    src = getattr(ctx, INPUT_OF_SHARD.get(wspec.shard, "h"))
    if src.shape[1] != spec.dims["in_features"]:              # MLA's, the shared expert's: their own width
        src = ctx.rows_of(spec.dims["in_features"])
    wt = ctx.lw[wspec.key]
    fn = (lambda: K.linear(src, wt)) if bias is None else (lambda: K.linear(src, wt, bias=bias))
    return fn, linear_run_config(ctx, ctx.T, wt) | ({"bias": True} if bias is not None else {})
