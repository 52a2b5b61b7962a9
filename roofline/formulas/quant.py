"""Quantization's bytes: the scales (and zero points) of quantized weights, a weight as stored, an 8-bit KV
cache's scales (the conventions: ``roofline.formulas``)."""

from __future__ import annotations

from ..dtypes import bytes_per_element as _b


QUANTIZED_WEIGHTS = ("int8", "int4", "fp8")   # weight dtypes that carry scales (weight-only quantization)
QUANTIZED_KV = ("int8", "fp8")                 # KV-cache dtypes with per-token-per-head scales
INT4_GROUP = 128                               # the default int4 group: input rows sharing one scale
KV_SCALE_BYTES = 4                             # a KV scale is fp32


def weight_scale_bytes(in_features: int, out_features: int, *, weight_dtype: str, act_dtype: str = "bf16",
                       group_size: int | None = None, zero_point: bool = False) -> float:
    """Bytes of the scales (and zero points) that dequantize a K x N weight, in the activation dtype.

    int8 / fp8: N (one symmetric scale per output channel). int4: ceil(K / g) x N scales, g =
    ``group_size`` (default ``INT4_GROUP``), doubled with ``zero_point``. Float weights: 0.
    """
    if weight_dtype not in QUANTIZED_WEIGHTS:
        return 0.0
    if weight_dtype != "int4":
        return out_features * _b(act_dtype)
    g = int(group_size or INT4_GROUP)
    groups = -(-in_features // g)
    return groups * out_features * _b(act_dtype) * (2 if zero_point else 1)


def quantized_weight_bytes(in_features: int, out_features: int, *, weight_dtype: str, act_dtype: str = "bf16",
                           group_size: int | None = None, zero_point: bool = False) -> float:
    """A K x N weight as stored: K*N in its dtype + ``weight_scale_bytes`` (int4, g=128: K*N/2 + K*N/128 x act)."""
    return in_features * out_features * _b(weight_dtype) + weight_scale_bytes(
        in_features, out_features, weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size,
        zero_point=zero_point)


def kv_scale_bytes(tokens: int, n_kv_heads: int, *, kv_dtype: str, kv_scales: bool = True) -> float:
    """The KV cache's scales for ``tokens`` tokens: 2 (K, V) x tokens x Hkv x 4 bytes (fp32, per token per KV
    head) for an int8 / fp8 cache; 0 for a float cache or with ``kv_scales=False``."""
    if not kv_scales or kv_dtype not in QUANTIZED_KV:
        return 0.0
    return 2 * tokens * n_kv_heads * KV_SCALE_BYTES

