"""Elementwise and memory-movement ops: the gated activations (SwiGLU, GeGLU), the residual add, and the generic
ops a profiler trace records (elementwise, reduction, softmax, copy, fill: ``roofline.traces.cost`` costs a
trace's ops through these; their conventions are the package's)."""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b


def swiglu(tokens: int, intermediate: int, *, act_dtype: str = "bf16") -> Cost:
    """y = silu(gate) * up, silu(g) = g / (1 + exp(-g)).

    FLOPs = 5 per element (negate, add 1, divide, multiply by g, multiply by up); the exp
    is not counted. Bytes = read gate and up, write y.
    """
    flops = 5 * tokens * intermediate
    nbytes = 3 * tokens * intermediate * _b(act_dtype)
    return Cost(flops, nbytes)


def geglu(tokens: int, intermediate: int, *, act_dtype: str = "bf16") -> Cost:
    """y = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (Gemma's MLP).

    FLOPs = 9 per element: g^3 (2 multiplies), x 0.044715, + g, x sqrt(2/pi), 1 + tanh, x 0.5, x g,
    x up; the tanh, like the exp, is not counted. Bytes = read gate and up, write y (as ``swiglu``).
    """
    flops = 9 * tokens * intermediate
    nbytes = 3 * tokens * intermediate * _b(act_dtype)
    return Cost(flops, nbytes)


def relu2(tokens: int, intermediate: int, *, act_dtype: str = "bf16") -> Cost:
    """y = relu(x)^2 (Nemotron-H's MLP: not gated, up -> relu2 -> down).

    FLOPs = 2 per element (the max, the square). Bytes = read x, write y."""
    return Cost(2 * tokens * intermediate, 2 * tokens * intermediate * _b(act_dtype))


def residual_add(tokens: int, hidden: int, *, act_dtype: str = "bf16") -> Cost:
    """h = x + r: 1 FLOP per element; read two, write one (``elementwise`` with two inputs)."""
    e = tokens * hidden
    return elementwise(e, ((e, act_dtype), (e, act_dtype)), out_dtype=act_dtype)


def elementwise(out_elements: int, inputs=(), *, out_dtype: str = "bf16", flops_per_element: float = 1) -> Cost:
    """An elementwise op: ``inputs`` is ((elements, dtype), ...) of the tensors it reads.

    FLOPs = flops_per_element x output elements (1 for add/mul/neg/compare, 4 for SiLU as
    ``swiglu`` counts it, 0 for exp/rsqrt/casts: exponentials, reciprocals and square roots
    are not FLOPs). Bytes = every input read once (a broadcast input at its own size) + the
    output written once. A 0-dim input (a scalar) is a kernel argument: pass no entry for it.
    ``residual_add`` is this with two inputs of T*H.
    """
    nbytes = sum(e * _b(d) for e, d in inputs) + out_elements * _b(out_dtype)
    return Cost(flops_per_element * out_elements, nbytes)


def reduction(in_elements: int, out_elements: int, *, in_dtype: str = "bf16", out_dtype: str | None = None) -> Cost:
    """sum / mean / max / min / norm over some dimensions.

    FLOPs = one combine per input element (a mean's final division per output is NB: not
    counted). Bytes = input read once + output written once. (TraceLens: the same.)
    """
    return Cost(in_elements, in_elements * _b(in_dtype) + out_elements * _b(out_dtype or in_dtype))


def softmax(rows: int, cols: int, *, in_dtype: str = "bf16", out_dtype: str | None = None) -> Cost:
    """softmax over the last dimension of [rows, cols].

    FLOPs = 4 per element (max, subtract, sum, divide; the exp is not counted: TraceLens
    counts 3). Bytes = read once, write once (a fused kernel; the max and sum stay on chip).
    """
    e = rows * cols
    return Cost(4 * e, e * _b(in_dtype) + e * _b(out_dtype or in_dtype))


def copy(elements: int, *, src_dtype: str = "bf16", dst_dtype: str | None = None) -> Cost:
    """A copy or a cast (copy_, contiguous, .to(dtype), cat, a scatter of ``elements``): 0 FLOPs.

    Bytes = read in the source dtype + write in the destination dtype. ``kv_append`` is this
    with the K and V rows. Index tensors of a scatter or gather are NB: not counted.
    """
    return Cost(0, elements * _b(src_dtype) + elements * _b(dst_dtype or src_dtype))


def fill(elements: int, *, dtype: str = "bf16") -> Cost:
    """fill_ / zero_ / a factory that writes (zeros, arange, full): 0 FLOPs, the output written once."""
    return Cost(0, elements * _b(dtype))

