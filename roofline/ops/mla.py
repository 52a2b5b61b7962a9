"""Multi-head latent attention's kinds (DeepSeek): latent_append (the chunk's c_kv and rope key written to
the cache), mla_up (kv_b_proj) and mla_attention (over the indexer's top-k selection when ``topk``: DeepSeek Sparse
Attention, ``roofline.ops.dsa``).

Decode runs absorbed: W_UK / W_UV folded into the query and the output, read in the activation dtype (a
quantized kv_b_proj is dequantized once at load: ``kernels.quant.absorbed_kv_b``). Prefill runs naive: every
key of the prefix and the chunk up-projected by kv_b_proj as stored, then plain attention."""

from __future__ import annotations

from .. import formulas as F
from ..cost import Cost
from ..dtypes import bytes_per_element
from .registry import OpKind, held_bytes, register


def _decode_copy(op, s) -> float:
    """Bytes of one element of kv_b_proj as decode reads it: its float, or the activation dtype when quantized
    (the copy dequantized at load)."""
    dt = s.dtypes
    return bytes_per_element(dt.act if dt.precision.quantized(op) else dt.precision.element_dtype(op, dt.act))


def _latent_append(op, s):
    return F.copy(s.rows * op.dims["width"], src_dtype=s.dtypes.act, dst_dtype=s.dtypes.kv)


def _up(op, s):
    d, dt = op.dims, s.dtypes
    H_, R, N, V = d["n_heads"], d["rank"], d["nope"], d["v"]
    if s.decode:
        w = R * H_ * (N + V) * _decode_copy(op, s)
        io = s.rows * H_ * (N + R + R + V) * bytes_per_element(dt.act)
        return Cost(F.mla_absorb_flops(s.rows, H_, N, V, R), w + io)
    return F.linear(s.batch * (s.cached + s.chunk), R, H_ * (N + V), act_dtype=dt.act,
                    weight_bytes=dt.precision.weight_bytes(op, R, H_ * (N + V), dt.act))


def _up_weight_bytes(op, s):
    """Prefill reads kv_b_proj as stored (scales included); decode the copy dequantized at load (act dtype)."""
    dt, shape = s.dtypes, op.weights[0].shape
    if s.decode:
        return shape[0] * shape[1] * _decode_copy(op, s)
    return dt.precision.weight_bytes(op, *shape, dt.act)


def _up_held(op, w, precision, act) -> float:
    """kv_b_proj in memory: as stored (prefill's), + its copy dequantized to the activation dtype when it is
    quantized (decode's: ``kernels.quant.absorbed_kv_b``)."""
    n = w.shape[0] * w.shape[1]
    return held_bytes(op, w, precision, act) + (n * bytes_per_element(act) if precision.quantized(op) else 0)


def _attention(op, s):
    d, dt = op.dims, s.dtypes
    if s.decode:
        return F.mla_decode_attention(s.batch, s.cached + 1, d["n_heads"], d["rank"], d["rope"], act_dtype=dt.act,
                                      kv_dtype=dt.kv, topk=d.get("topk", 0))
    return F.mla_prefill_attention(s.batch, s.chunk, d["n_heads"], d["nope"], d["rope"], d["v"], cached_tokens=s.cached,
                                   kv_lora_rank=d["rank"], act_dtype=dt.act, kv_dtype=dt.kv, topk=d.get("topk", 0))


LATENT_APPEND = register(OpKind("latent_append", "attention", _latent_append))
MLA_UP = register(OpKind("mla_up", "attention", _up, weight_bytes=_up_weight_bytes, tensor=True, resident=_up_held,
                         per_sequence=True))
MLA_ATTENTION = register(OpKind("mla_attention", "attention", _attention, tensor=True, per_sequence=True))
