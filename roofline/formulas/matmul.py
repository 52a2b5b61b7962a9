"""GEMMs: the generic matrix multiply, the linear layer (a GEMM with the weight as B, its scales and bias) and the
lm_head, and what a linear's FLOPs say about its weight."""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b
from .quant import weight_scale_bytes


def linear(tokens: int, in_features: int, out_features: int, *,
           weight_dtype: str = "bf16", act_dtype: str = "bf16", group_size: int | None = None,
           zero_point: bool = False, bias: bool = False, weight_bytes: float | None = None) -> Cost:
    """y[T, N] = x[T, K] @ W[K, N] (+ b[N] with ``bias``).

    FLOPs = 2*T*K*N, + T*N with a bias (one add per output). Bytes = weight K*N (weight dtype,
    read once per call) + its scales (``weight_scale_bytes``: 0 for a float weight) + input T*K +
    output T*N (activation dtype), + the bias's N elements once (activation dtype; Llama has no
    bias, Qwen2's q/k/v have one). The dequantization multiplies are NB: not FLOPs (a
    weight-only kernel folds them into the GEMM's epilogue or per group); the bias is added in
    the epilogue, so y is written once. ``weight_bytes``: the weight's bytes as stored, scales included, when
    its format says them (``roofline.precision``: ``Precision.weight_bytes``), instead of the dtype's.
    """
    if weight_bytes is not None:
        return gemm(tokens, in_features, out_features, a_dtype=act_dtype, out_dtype=act_dtype,
                    bias=out_features if bias else 0, bias_dtype=act_dtype, b_bytes=weight_bytes)
    c = gemm(tokens, in_features, out_features, a_dtype=act_dtype, b_dtype=weight_dtype, out_dtype=act_dtype,
             bias=out_features if bias else 0, bias_dtype=act_dtype)
    return c + Cost(0, weight_scale_bytes(in_features, out_features, weight_dtype=weight_dtype, act_dtype=act_dtype,
                                          group_size=group_size, zero_point=zero_point))


def gemm(m: int, k: int, n: int, *, batch: int = 1, a_dtype: str = "bf16", b_dtype: str = "bf16",
         out_dtype: str | None = None, bias: int = 0, bias_dtype: str | None = None,
         b_bytes: float | None = None) -> Cost:
    """C[batch, M, N] = A[batch, M, K] @ B[batch, K, N] (+ a bias of ``bias`` elements).

    FLOPs = 2*batch*M*N*K, plus batch*M*N for the bias add when there is one (one add per
    output; alpha/beta scaling is not counted). Bytes = A + B + C, each once in its own
    dtype (C in ``out_dtype``, default A's: an fp8 ``_scaled_mm`` writing bf16 is costed so),
    plus the bias once. ``linear`` is this with B the weight. Matches TraceLens's GEMM perf
    model (A + B + C + bias; 2MNK + MN with a bias). ``b_bytes``: B's bytes per batch as stored (a quantized
    weight, its scales included), instead of K*N in ``b_dtype``.
    """
    out_dtype = out_dtype or a_dtype
    flops = 2 * batch * m * n * k + (batch * m * n if bias else 0)
    b = k * n * _b(b_dtype) if b_bytes is None else b_bytes
    nbytes = batch * (m * k * _b(a_dtype) + b + m * n * _b(out_dtype))
    if bias:
        nbytes += bias * _b(bias_dtype or out_dtype)
    return Cost(flops, nbytes)


def linear_weight_elements_from_flops(flops: float, rows: int) -> float:
    """A linear's K x N weight elements from its FLOPs (2 * rows * K * N, ``linear``) and its rows (tokens): times
    an element's bytes, what its repeated calls keep touching (a cache's working set). A bias is left out."""
    return flops / (2 * rows) if rows > 0 else 0.0


def weight_only_intensity(tokens: int, in_features: int, out_features: int, *,
                          weight_dtype: str = "bf16") -> float:
    """The seed's weight-only FLOP/byte: 2*T*K*N / (K*N*bytes_w). Activations ignored."""
    return 2 * tokens * in_features * out_features / (in_features * out_features * _b(weight_dtype))


def lm_head(rows: int, hidden: int, vocab: int, *, weight_dtype: str = "bf16", act_dtype: str = "bf16",
            group_size: int | None = None, zero_point: bool = False, weight_bytes: float | None = None) -> Cost:
    """Logits for ``rows`` positions: a linear [rows, H] x [H, vocab].

    In prefill only the last position of each sequence needs logits, so rows = batch
    (NB: frameworks that compute logits for every prompt position pay prompt x more).
    """
    return linear(rows, hidden, vocab, weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size,
                  zero_point=zero_point, weight_bytes=weight_bytes)

