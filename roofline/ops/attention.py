"""The attention kinds of a KV cache: rope (q and k rotated in place), kv_append (the chunk's K and V written
to the cache) and attention (prefill: the chunk's queries over the cached prefix and themselves; decode: one
query over the context + 1 keys; ``window`` keys under a sliding window, 0 for full; ``chunk`` positions per chunk
under chunked local attention, 0 for none)."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _rope(op, s):
    d = op.dims
    return F.rope(s.rows, d["n_heads"], d["n_kv_heads"], d["head_dim"], act_dtype=s.dtypes.act)


def _kv_append(op, s):
    d, dt = op.dims, s.dtypes
    return F.kv_append(s.rows, d["n_kv_heads"], d["head_dim"], act_dtype=dt.act, kv_dtype=dt.kv,
                       kv_scales=dt.kv_scales)


def _attention(op, s):
    d, dt = op.dims, s.dtypes
    w, c = d["window"] or None, d.get("chunk") or None
    if s.decode:
        return F.decode_attention(s.batch, s.cached + 1, d["n_heads"], d["n_kv_heads"], d["head_dim"], window=w,
                                  act_dtype=dt.act, kv_dtype=dt.kv, kv_scales=dt.kv_scales, chunk=c)
    return F.prefill_attention(s.batch, s.chunk, d["n_heads"], d["n_kv_heads"], d["head_dim"], cached_tokens=s.cached,
                               window=w, act_dtype=dt.act, kv_dtype=dt.kv, kv_scales=dt.kv_scales, chunk=c)


ROPE = register(OpKind("rope", "attention", _rope))
KV_APPEND = register(OpKind("kv_append", "attention", _kv_append))
ATTENTION = register(OpKind("attention", "attention", _attention, tensor=True, per_sequence=True))
