"""Multi-head latent attention's kinds (DeepSeek): latent_append (the chunk's c_kv and rope key written to
the cache), mla_up (kv_b_proj) and mla_attention.

Decode runs absorbed: W_UK / W_UV folded into the query and the output, read in the activation dtype (a
quantized kv_b_proj is dequantized once at load: ``kernels.quant.absorbed_kv_b``). Prefill runs naive: every
key of the prefix and the chunk up-projected by kv_b_proj as stored, then plain attention."""

from __future__ import annotations

from .. import formulas as F
from ..cost import Cost
from ..dtypes import bytes_per_element
from .registry import OpKind, register

_FLOAT = ("bf16", "fp16", "fp32")


def _latent_append(op, s):
    return F.copy(s.rows * op.dims["width"], src_dtype=s.dtypes.act, dst_dtype=s.dtypes.kv)


def _up(op, s):
    d, dt = op.dims, s.dtypes
    H_, R, N, V = d["n_heads"], d["rank"], d["nope"], d["v"]
    if s.decode:
        w = R * H_ * (N + V) * bytes_per_element(dt.weight if dt.weight in _FLOAT else dt.act)
        io = s.rows * H_ * (N + R + R + V) * bytes_per_element(dt.act)
        return Cost(F.mla_absorb_flops(s.rows, H_, N, V, R), w + io)
    return F.linear(s.batch * (s.cached + s.chunk), R, H_ * (N + V), act_dtype=dt.act, **dt.weight_quant)


def _up_weight_bytes(op, s):
    """Prefill reads kv_b_proj as stored (scales included); decode the copy dequantized at load (act dtype)."""
    dt, shape = s.dtypes, op.weights[0].shape
    if s.decode:
        return shape[0] * shape[1] * bytes_per_element(dt.act)
    return F.quantized_weight_bytes(*shape, act_dtype=dt.act, **dt.weight_quant)


def _attention(op, s):
    d, dt = op.dims, s.dtypes
    if s.decode:
        return F.mla_decode_attention(s.batch, s.cached + 1, d["n_heads"], d["rank"], d["rope"], act_dtype=dt.act,
                                      kv_dtype=dt.kv)
    return F.mla_prefill_attention(s.batch, s.chunk, d["n_heads"], d["nope"], d["rope"], d["v"], cached_tokens=s.cached,
                                   kv_lora_rank=d["rank"], act_dtype=dt.act, kv_dtype=dt.kv)


LATENT_APPEND = register(OpKind("latent_append", "attention", _latent_append))
MLA_UP = register(OpKind("mla_up", "attention", _up, weight_bytes=_up_weight_bytes, tensor=True))
MLA_ATTENTION = register(OpKind("mla_attention", "attention", _attention, tensor=True))
