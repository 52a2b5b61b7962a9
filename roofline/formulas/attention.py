"""Attention with a KV cache: rotary embedding, the cache append, prefill and decode attention (causal, sliding
window, chunked local attention, GQA), the (query, key) pair counts behind them and the bytes a cache occupies.

Chunked local attention (``chunk`` C, Llama-4's attention_chunk_size): positions are cut into chunks
[0, C), [C, 2C), ...; a query sees the keys of its own chunk up to itself (j // C == i // C, j <= i). Unlike a
window, what a query sees restarts at each chunk start: the query at position i sees i % C + 1 keys."""

from __future__ import annotations

import operator

from ..cost import Cost
from ..dtypes import bytes_per_element as _b
from .pointwise import copy
from .quant import kv_scale_bytes


def rope(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
         act_dtype: str = "bf16") -> Cost:
    """Rotary embedding (Hugging Face half-rotation layout) applied to q and k in place.

    FLOPs = 3 per element of q and k (x*cos, rotate_half(x)*sin, their sum).
    Bytes = read and write q [T, Hq, D] and k [T, Hkv, D] (activations) + the cos and sin
    tables for each token's position, D/2 values each in fp32 (4*D bytes per token).
    """
    elems = tokens * (n_heads + n_kv_heads) * head_dim
    flops = 3 * elems
    nbytes = 2 * elems * _b(act_dtype) + tokens * head_dim * 4
    return Cost(flops, nbytes)


def kv_append(tokens: int, n_kv_heads: int, head_dim: int, *,
              act_dtype: str = "bf16", kv_dtype: str = "bf16", kv_scales: bool = True) -> Cost:
    """Write the new tokens' K and V into the cache: 0 FLOPs.

    Bytes = read k and v [T, Hkv, D] (activations) + write them into the cache (KV dtype) + an
    8-bit cache's scales (``kv_scale_bytes``). Quantizing (an absmax per row, a scale) is NB: not FLOPs.
    """
    c = copy(2 * tokens * n_kv_heads * head_dim, src_dtype=act_dtype, dst_dtype=kv_dtype)
    return c + Cost(0, kv_scale_bytes(tokens, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales))


def causal_pairs(new_tokens: int, cached_tokens: int = 0) -> float:
    """(query, key) pairs that causal attention computes, by the halving convention.

    New queries at positions p..p+n-1 see the whole cached prefix (n*p pairs) and each
    other causally. The causal block is counted as n*n/2, the FlashAttention and Triton
    tutorial convention (the exact count is n*(n+1)/2; the diagonal is NB: ignored).
    """
    return new_tokens * cached_tokens + new_tokens * new_tokens / 2


def window_pairs(new_tokens: int, cached_tokens: int = 0, window: int | None = None) -> float:
    """(query, key) pairs of causal attention under a sliding window of ``window`` keys.

    A query at position i sees keys i - W < j <= i (W keys, itself included). By the halving
    convention of ``causal_pairs`` the count is the integral over x in [0, n] of min(W, p + x) dx
    (p = cached, n = new tokens): n*p + n^2/2 while p + n <= W (no key falls out: ``causal_pairs``),
    n*W once p >= W (every query sees a full window), and the two pieces summed between
    ((W - p)*p + (W - p)^2/2 up to the window's fill, then W per query). ``window`` None: no window.
    """
    n, p = new_tokens, cached_tokens
    if window is None or p + n <= _window(window):
        return causal_pairs(n, p)
    w = _window(window)
    if p >= w:
        return n * w
    fill = w - p                                   # new tokens until a query's window is full
    return fill * p + fill * fill / 2 + (n - fill) * w


def chunk_pairs(new_tokens: int, cached_tokens: int = 0, chunk: int | None = None) -> float:
    """(query, key) pairs of chunked local attention (``chunk`` C) by the halving convention of ``causal_pairs``.

    The new queries p..p+n-1 split at the chunk starts into runs within one chunk; a run of m queries whose
    chunk started s positions before it (s = p % C for the first run, 0 for the others) counts m*s + m^2/2
    (``causal_pairs(m, s)``). ``chunk`` None: plain causal. Prefill of S from empty: (S // C) * C^2/2 + r^2/2
    (r = S % C)."""
    n, p = new_tokens, cached_tokens
    if chunk is None:
        return causal_pairs(n, p)
    c = _window(chunk, "chunk")
    pairs, pos, end = 0.0, p, p + n
    while pos < end:
        start = pos - pos % c                          # this run's chunk start
        m = min(end, start + c) - pos
        pairs += causal_pairs(m, pos - start)
        pos += m
    return pairs


def chunk_keys(tokens: int, chunk: int) -> int:
    """Keys of the current chunk before position ``tokens`` (what a chunked layer's query there reads from the
    cache, besides itself): tokens % C."""
    return tokens % _window(chunk, "chunk")


def _window(window, name: str = "window") -> int:
    """``window`` as an int of at least 1, or a ValueError naming the rule."""
    try:
        w = operator.index(window)
    except TypeError:
        w = 0
    if isinstance(window, bool) or w < 1:
        raise ValueError(f"{name} must be a whole number of keys of at least 1 (or None: no {name}), got {window!r}.")
    return w


def prefill_attention(batch: int, new_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                      cached_tokens: int = 0, causal: bool = True, window: int | None = None,
                      act_dtype: str = "bf16", kv_dtype: str = "bf16", kv_scales: bool = True,
                      chunk: int | None = None) -> Cost:
    """softmax(q k^T / sqrt(D)) v for ``new_tokens`` queries over the prefix and themselves.

    FLOPs = 4 * B * Hq * D * pairs (2 for q.k, 2 for p.v per pair); pairs =
    S_q * S_kv non-causal, causal_pairs(S_q, prefix) causal (halved: the convention
    FlopCounterMode does NOT follow, so it reports twice ours for causal attention),
    window_pairs under a sliding ``window`` (causal only).
    Bytes = q read and o written (activations, Hq heads) + K and V of all
    S_kv = prefix + new tokens read once per KV head from the cache (KV dtype): under
    GQA a KV tile is shared by the Hq/Hkv query heads of its group. Under a window only the
    keys some query can see are read: S_kv = min(p + n, n + W - 1). Under chunked attention (``chunk`` C)
    the pairs are ``chunk_pairs`` and the keys read those from the first query's chunk start on:
    S_kv = p % C + n. An 8-bit cache adds its
    scales (``kv_scale_bytes`` of the S_kv tokens), read with it. Logit softcapping
    (s = c * tanh(s / c)) adds NB: no FLOPs (a tanh, like the exp, is not counted).
    """
    s_kv = cached_tokens + new_tokens
    if window is not None and chunk is not None:
        raise ValueError("a layer has a sliding window or chunked attention, not both: pass one of them.")
    if (window is not None or chunk is not None) and not causal:
        raise ValueError("a sliding window or chunked attention needs causal attention: pass causal=True.")
    if window is not None:
        s_kv = min(s_kv, new_tokens + _window(window) - 1)
    if chunk is not None:
        s_kv = chunk_keys(cached_tokens, chunk) + new_tokens
        pairs = chunk_pairs(new_tokens, cached_tokens, chunk)
    else:
        pairs = window_pairs(new_tokens, cached_tokens, window) if causal else new_tokens * s_kv
    flops = 4 * batch * n_heads * head_dim * pairs
    q_o = 2 * batch * new_tokens * n_heads * head_dim * _b(act_dtype)
    kv = 2 * batch * s_kv * n_kv_heads * head_dim * _b(kv_dtype)
    kv += kv_scale_bytes(batch * s_kv, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales)
    return Cost(flops, q_o + kv)


def decode_attention(batch: int, kv_len: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                     window: int | None = None, act_dtype: str = "bf16", kv_dtype: str = "bf16",
                     kv_scales: bool = True, chunk: int | None = None) -> Cost:
    """One new query per sequence over ``kv_len`` cached keys (the new token's included).

    FLOPs = 4 * B * Hq * S_kv * D, no causal halving (one query sees every key).
    Bytes = K and V, B * S_kv * Hkv * D each, read once per KV head (KV dtype) + q read
    and o written (activations). Intensity ~ Hq/Hkv FLOP per KV element: it does not grow
    with context, and batching does not share KV reads between sequences. An 8-bit cache adds
    its scales (``kv_scale_bytes`` of the B * S_kv tokens). Under a sliding ``window`` the query
    sees S_kv = min(kv_len, W) keys (FLOPs and bytes both); under chunked attention (``chunk`` C) the keys of
    its own chunk, S_kv = (kv_len - 1) % C + 1. Softcapping adds NB: no FLOPs (a tanh).
    """
    if window is not None:
        kv_len = min(kv_len, _window(window))
    if chunk is not None and kv_len > 0:
        kv_len = chunk_keys(kv_len - 1, chunk) + 1
    flops = 4 * batch * n_heads * kv_len * head_dim
    kv = 2 * batch * kv_len * n_kv_heads * head_dim * _b(kv_dtype)
    kv += kv_scale_bytes(batch * kv_len, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales)
    q_o = 2 * batch * n_heads * head_dim * _b(act_dtype)
    return Cost(flops, kv + q_o)


def kv_cache_bytes(tokens: int, n_layers: int, n_kv_heads: int, head_dim: int, *, kv_dtype: str = "bf16",
                   kv_scales: bool = True, window: int | None = None, chunk: int | None = None) -> float:
    """Bytes that ``tokens`` cached tokens of one sequence occupy across ``n_layers`` layers: 2 (K, V) * L *
    Hkv * D * bytes, plus an 8-bit cache's scales (L x ``kv_scale_bytes``). Sliding-window layers
    (``window``) hold at most W tokens (a ring buffer): tokens = min(tokens, W). Chunked layers (``chunk`` C)
    need only the current chunk's keys (a server frees the past chunks), but a sequence that reaches
    ``tokens`` passed through every earlier chunk's end, so what it must be given is the peak, min(tokens, C)
    (the keys a step reads are ``chunk_keys``). A model that mixes kinds of layers calls this once per kind."""
    if window is not None:
        tokens = min(tokens, _window(window))
    if chunk is not None:
        tokens = min(tokens, _window(chunk, "chunk"))
    return (2 * tokens * n_layers * n_kv_heads * head_dim * _b(kv_dtype)
            + n_layers * kv_scale_bytes(tokens, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales))

