"""Attention with sinks (GPT-OSS): a learned logit per query head joins every softmax's denominator.

    p_j = exp(s_j - m) / (exp(sink_h - m) + sum_j exp(s_j - m)),  m = max(sink_h, max_j s_j)

so a query can put weight on "nothing" and its output shrinks toward 0 (transformers' eager GPT-OSS
attention concatenates the sink to the scores, softmaxes, and drops its column: the same numbers).
The torch backend runs these functions (prefill and decode, with the window and score scale of the other
attention kernels); the triton backend runs the Triton attention kernels with ``sinks=`` (their SINKS variants:
``prefill_attention`` starts its online softmax at the sink, ``decode_attention`` adds it in the split merge),
and these are their reference (tests/test_sinks_triton.py). The runners' config says which ran. Scores in fp32
(fp64 for fp64). An 8-bit KV cache (int8 / fp8 with ``scales=(k_scale, v_scale)`` [S, Hkv, L]) is dequantized
(values x per-token scales, ``kv_append.dequantized``) as the rows are read, as the other attention references do.
``cost``: the attention formulas' (a sink adds one exp and one add per query and head: not counted, like the
softmax's exps).
"""

from __future__ import annotations

import math

import torch

from roofline import formulas as F

from ._common import slot_rows
from .kv_append import dequantized
from .prefill_attention import visible


def _softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """s [B, H, n, S] (already masked with -inf), sinks [H] -> probabilities [B, H, n, S] (sink column dropped)."""
    sink = sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)
    p = torch.cat([s, sink], dim=-1).softmax(-1)
    return p[..., :-1]


def prefill_with_sinks(q, k_cache, v_cache, slots, cached: int = 0, *, sinks, sm_scale=None, window=None,
                       causal: bool = True, scales=None):
    """o [B, n, Hq, D] for queries at positions cached..cached+n-1 over the cache rows of ``slots``; an 8-bit
    cache comes with ``scales=(k_scale, v_scale)`` [S, Hkv, L] fp32 and is dequantized as it is read."""
    B, n, HQ, D = q.shape
    HKV, S = k_cache.shape[1], cached + n
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    ks, vs = (None, None) if scales is None else (slot_rows(sc, slots, S) for sc in scales)   # [B, Hkv, S]
    k = dequantized(slot_rows(k_cache, slots, S), ks, ct).repeat_interleave(HQ // HKV, dim=1)   # [B, Hq, S, D]
    v = dequantized(slot_rows(v_cache, slots, S), vs, ct).repeat_interleave(HQ // HKV, dim=1)
    s = q.to(ct).transpose(1, 2) @ k.transpose(-1, -2) * (sm_scale if sm_scale is not None else 1 / math.sqrt(D))
    if causal:
        s = s.masked_fill(~visible(cached + torch.arange(n, device=q.device), S, window), float("-inf"))
    return (_softmax_with_sinks(s, sinks) @ v).transpose(1, 2).to(q.dtype)


def decode_with_sinks(q, k_cache, v_cache, lengths, slots, *, sinks, sm_scale=None, window=None, max_len=None,
                      scales=None):
    """o [B, Hq, D]: each query (at position lengths[b] - 1) over its sequence's cached keys (an 8-bit cache
    with its ``scales``, as ``prefill_with_sinks``)."""
    B, HQ, D = q.shape
    out = torch.empty_like(q)
    for b in range(B):
        L = int(lengths[b])
        o = prefill_with_sinks(q[b][None, None], k_cache, v_cache, slots[b: b + 1], L - 1, sinks=sinks,
                               sm_scale=sm_scale, window=window, scales=scales)
        out[b] = o[0, 0]
    return out


def cost(batch: int, new_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, *, cached: int = 0,
         window=None, dtype="bf16"):
    return F.prefill_attention(batch, new_tokens, n_heads, n_kv_heads, head_dim, cached_tokens=cached, window=window,
                               act_dtype=dtype, kv_dtype=dtype)
