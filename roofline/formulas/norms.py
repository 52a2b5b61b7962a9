"""Normalisation: RMSNorm, alone and fused with the residual add before it."""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b


def rmsnorm(tokens: int, hidden: int, *, act_dtype: str = "bf16", weight_dtype: str = "bf16",
            weight: bool = True) -> Cost:
    """y = x / sqrt(mean(x^2) + eps) * w.

    FLOPs = 4 per element (square, sum, scale, weight); the rsqrt is not counted.
    Bytes = read x, write y (activations) + the weight vector once. ``weight`` False: no w (Llama-4's
    weightless qk-norm): 3 per element, no weight bytes.
    """
    flops = (4 if weight else 3) * tokens * hidden
    nbytes = 2 * tokens * hidden * _b(act_dtype) + (hidden * _b(weight_dtype) if weight else 0)
    return Cost(flops, nbytes)


def add_rmsnorm(tokens: int, hidden: int, *, act_dtype: str = "bf16", weight_dtype: str = "bf16") -> Cost:
    """Fused residual add + RMSNorm: h = x + r; y = rmsnorm(h).

    FLOPs = 5 per element (the add, then rmsnorm's 4). Bytes = read x and r, write h
    (the new residual stream) and y, plus the weight once: 4 activation passes instead
    of the 3 + 2 = 5 of the unfused pair.
    """
    flops = 5 * tokens * hidden
    nbytes = 4 * tokens * hidden * _b(act_dtype) + hidden * _b(weight_dtype)
    return Cost(flops, nbytes)



def layernorm(tokens: int, hidden: int, *, act_dtype: str = "bf16", weight_dtype: str = "bf16") -> Cost:
    """y = (x - mean(x)) / sqrt(var(x) + eps) * w + b (nn.LayerNorm; the DSA indexer's k_norm).

    FLOPs = 7 per element (the mean's sum, the subtraction, the square, the variance's sum, the scale, the
    weight and the bias); the rsqrt is not counted. Bytes = read x, write y + the weight and bias once.
    """
    return Cost(7 * tokens * hidden, 2 * tokens * hidden * _b(act_dtype) + 2 * hidden * _b(weight_dtype))
