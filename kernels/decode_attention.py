"""Decode attention: split-KV flash-decoding over a KV cache, GQA-grouped, ragged lengths.

One new query per sequence, q [B, Hq, D]; sequence b's keys are rows 0..lengths[b]-1 of
cache slot slots[b] in k_cache/v_cache [n_slots, Hkv, L, D] (the new token already appended).

Stage 1, grid (B, Hkv, SPLITS): a program takes ALL Hq/Hkv query heads of one KV head as the
rows of a [BLOCK_G, D] tile (BLOCK_G >= 16 so tl.dot is legal on a GPU), so each KV tile is
read from HBM once per KV head, and streams its split's keys [start, start + SPLIT_SIZE)
with an online softmax. It writes a partial output (normalised) and its log2-sum-exp.
Stage 2, grid (B, Hq): merges the splits' partials weighted by exp2(lse - max lse).

The split count comes from the SM count, batch, KV heads and the longest length: enough
programs for ``DECODE_BLOCKS_PER_SM`` resident programs on every SM (the occupancy the compile
check measures for this kernel), each split at least one key tile long, at most 64 splits
(``decode_config``). Splits past a short sequence's end do no work (lse = -inf, weight 0), so
ragged batches are handled in-kernel; a sequence of length 0 gets zeros.
fp32 (IEEE FMA dots) uses 32-key tiles and 8 warps: 64-key tiles with 4 warps spilled on sm_80.

Sliding window (``window`` W): the query at position len-1 sees keys max(0, len-W) .. len-1; the split
count is sized for min(max_len, W) keys and each sequence's splits start at its own window's first key
(no tile before it is read). Softcapping (``softcap`` c): s = c * tanh(s / c) before the softmax.
Chunked local attention (``chunk`` C, Llama-4): the query at position len-1 sees keys ((len-1) // C) * C ..
len-1; as a window, the splits are sized for min(max_len, C) keys and start at each sequence's chunk start.

8-bit KV cache (int8 or fp8 caches with ``scales=(k_scale, v_scale)``, fp32 [n_slots, Hkv, L], written
by ``kernels.kv_append``): as in prefill attention, tiles are read as 8-bit values and converted in
registers; K's per-token scale multiplies its column of scores, V's its column of probabilities
before the P.V dot (the online softmax's sums use the unscaled probabilities). A per-tensor fp8 cache (vLLM's
one ``k_scale`` / ``v_scale`` per layer: the "fp8-tensor" KV format) passes two one-element fp32 scales
(``prefill_attention.cache_scales``): the same kernel, its scale strides 0. fp8 e4m3 caches run under the
Triton interpreter too (e4m3 loads upcast to fp32 exactly); ``kernels.check_fp8`` checks both layouts.

Sinks (``sinks`` [Hq], GPT-OSS; ``kernels.sinks`` is the reference): each query head's logit joins the
denominator once, in the merge: m = max(sink, max lse), den = exp2(sink - m) + sum_s exp2(lse_s - m) (the sink
times log2(e), as the lse); the split kernel is unchanged. ``SINKS`` is the merge's constexpr: without sinks it
compiles as before. A sequence of length 0 still gets zeros.

The verify step of speculative decoding (``verify_attention``, issue 34): T = k + 1 queries per sequence, q
[B, T, Hq, D], the last T of its ``lengths[b]`` keys, query t at position lengths[b] - T + t, causal among the T.
The chunked-prefill path (``prefill_attention`` with ``cached``) computes the same thing, but for one prefix
length per batch and with 64- or 128-query tiles per (sequence, head) program, mostly padding at T <= 8, and no
split over the keys: at decode batch sizes it launches B x Hq programs that each stream the whole context. The
verify kernel is the split kernel above with (query, head) rows: one program takes the T x Hq/Hkv rows of one KV
head (at least 16, at most ``VERIFY_MAX_ROWS``), so each key tile is read once per KV head per split as in
decode, the causal mask applies per row (key j <= the row's position), and the running max starts finite
(-1e30: a split past a row's position gives it p = 0, weight 0 in the merge). The decode merge runs over the
[B, T x Hq] rows unchanged. Its cost is ``verify_cost``: formulas.prefill_attention with cached_tokens = the
context, as ``roofline.speculative.verify_step`` costs the verify step's attention.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import (FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, check_window, dtype_name, next_pow2, num_sms,
                      slot_rows, take, tanh)
from ._launch import launch
from .kv_append import CACHE_DTYPES, dequantized
from .prefill_attention import cache_scales, check_chunk, check_sinks, scale_strides


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, len_ptr, slot_ptr, mid_o_ptr, mid_lse_ptr,
                         GROUP, D, SPLIT_SIZE, qk_scale, win, cap_scale,
                         stride_qb, stride_qh, stride_ks, stride_kh, stride_kn, stride_ss, stride_sh, stride_sn,
                         stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, KV_QUANT: tl.constexpr,
                         WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, CHUNK: tl.constexpr = False):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    seq_len = tl.load(len_ptr + b).to(tl.int32)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    lo = sp * SPLIT_SIZE
    if CHUNK:                                              # the splits cover only the chunk's keys
        lo += tl.maximum(seq_len - 1, 0) // win * win
    elif WINDOW:                                           # the splits cover only the window's keys
        lo += tl.maximum(seq_len - win, 0)
    hi = tl.minimum(lo + SPLIT_SIZE, seq_len)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    gmask = offs_g < GROUP
    dmask = offs_d < D
    heads = kvh * GROUP + offs_g                                                   # query heads of the group
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)                  # [BLOCK_G, D]
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + slot * stride_ks + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + slot * stride_ks + kvh.to(tl.int64) * stride_kh
    ks_base = ks_ptr + slot * stride_ss + kvh.to(tl.int64) * stride_sh             # an 8-bit cache's scales
    vs_base = vs_ptr + slot * stride_ss + kvh.to(tl.int64) * stride_sh
    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        k = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                    mask=nmask[None, :] & dmask[:, None], other=0.0)              # [D, BLOCK_N]
        if UPCAST:
            k = k.to(tl.float32)
        elif KV_QUANT:
            k = k.to(q.dtype)                                                     # 8-bit -> q's dtype: exact
        s = tl.dot(q, k, input_precision=DOT_PREC) * qk_scale                     # [BLOCK_G, BLOCK_N]
        if KV_QUANT:
            s = s * tl.load(ks_base + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
        if SOFTCAP:
            s = tanh(s) * cap_scale                        # scaled by sm_scale / cap: cap * tanh(.) * log2(e)
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                    mask=nmask[:, None] & dmask[None, :], other=0.0)              # [BLOCK_N, D]
        pv = p
        if KV_QUANT:
            pv = p * tl.load(vs_base + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
        if UPCAST:
            v = v.to(tl.float32)
        else:
            if KV_QUANT:
                v = v.to(q.dtype)
            pv = pv.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PREC)
        m_i = m_new
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    mo = mid_o_ptr + b.to(tl.int64) * stride_mb + heads[:, None] * stride_mh + sp * stride_ms + offs_d[None, :]
    tl.store(mo, out, mask=gmask[:, None] & dmask[None, :])
    tl.store(mid_lse_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh + sp, lse, mask=gmask)


@triton.jit
def _decode_merge_kernel(mid_o_ptr, mid_lse_ptr, sink_ptr, o_ptr, HQ, D, SPLITS,
                         stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                         BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    smask = offs_s < SPLITS
    lse = tl.load(mid_lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    if SINKS:                                                  # the sink joins the denominator once, here
        sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634          # log2 units, as lse
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)                                       # length 0: every split empty
    w = tl.math.exp2(lse - m)                                                      # 0 for empty splits
    part = tl.load(mid_o_ptr + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :],
                   mask=smask[:, None] & (offs_d[None, :] < D), other=0.0)
    den = tl.sum(w, 0)
    if SINKS:
        den += tl.math.exp2(sink - m)
    o = tl.sum(part * w[:, None], 0) / tl.where(den > 0, den, 1.0)                # zeros, not 0/0
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(o_ptr.dtype.element_ty), mask=offs_d < D)


DECODE_BLOCKS_PER_SM = 4   # resident split programs per SM aimed at (compile check: 4 on sm_80, bf16)
MIN_SPLIT_TILES = 1        # a split streams >= 1 key tile: its partial (G x D fp32) is ~1/16 of what it reads
MAX_SPLITS = 64


def decode_config(batch: int, n_kv_heads: int, max_len: int, device="cpu", *, dtype=torch.bfloat16,
                  block_n=None, splits=None, kv_quant: bool = False) -> dict:
    """Split-KV count and tile from the SM count and occupancy: ``DECODE_BLOCKS_PER_SM`` x SMs programs
    over (batch, KV head, split), each split >= 1 key tile, at most 64 splits. fp32: 32-key tiles, 8 warps.
    An 8-bit cache (``kv_quant``): 32-key tiles (64 spilled 12 B per thread with fp8 on sm_90)."""
    if block_n is not None and (int(block_n) < 16 or int(block_n) & (int(block_n) - 1)):
        raise ValueError(f"block_n must be a power of two of at least 16 (tl.dot needs operands of 16 or more "
                         f"on a GPU), got {block_n}.")
    fp32 = dtype == torch.float32
    bn = block_n or (32 if fp32 or kv_quant else 64)
    if splits is None:
        want = cdiv(DECODE_BLOCKS_PER_SM * num_sms(device), max(1, batch * n_kv_heads))
        splits = max(1, min(want, cdiv(max_len, MIN_SPLIT_TILES * bn), MAX_SPLITS))
    splits = max(1, min(int(splits), cdiv(max_len, bn)))
    split_size = cdiv(cdiv(max_len, splits), bn) * bn
    splits = cdiv(max_len, split_size)
    return dict(block_n=bn, splits=splits, split_size=split_size, num_warps=8 if fp32 else 4, num_stages=2,
                programs=batch * n_kv_heads * splits)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     slots: torch.Tensor, *, max_len: int | None = None, sm_scale: float | None = None,
                     window: int | None = None, softcap: float | None = None, out=None, scales=None, sinks=None,
                     chunk: int | None = None, **config) -> torch.Tensor:
    """o [B, Hq, D]: each query over its sequence's ``lengths[b]`` cached keys.

    ``max_len`` (the largest of ``lengths``, known to the caller) avoids a device sync. An 8-bit cache
    (int8 / fp8) comes with ``scales=(k_scale, v_scale)`` [S, Hkv, L] fp32. ``window`` W: the query (at
    position lengths[b]-1) sees keys max(0, len-W) .. len-1, and the splits cover only those (min(max_len, W)
    keys split, each sequence's from its own first key). ``softcap`` c: scores c * tanh(s / c). ``sinks`` [Hq]
    (GPT-OSS; fp32, or q's dtype, upcast on load): each head's logit joins the softmax's denominator, once, in
    the merge (``kernels.sinks``); None compiles the merge without it. ``chunk`` C (not with a window): the query
    sees its own chunk's keys, ((len-1) // C) * C .. len-1 (Llama-4).
    """
    # q: [B, Hq, D]   k_cache, v_cache: [S, Hkv, L, D]   lengths, slots: [B]   o: [B, Hq, D]
    check_tensor("q", q, (None, None, None), dtypes=FLOAT_DTYPES)
    B, HQ, D = q.shape
    check_tensor("k_cache", k_cache, (None, None, None, D), dtypes=CACHE_DTYPES, device=q.device)
    kind, scales = cache_scales(k_cache, scales)
    if not kind:
        check_tensor("k_cache", k_cache, dtype=q.dtype)
    check_tensor("v_cache", v_cache, tuple(k_cache.shape), dtype=k_cache.dtype, device=q.device)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same strides.")
    _, HKV, L, _ = k_cache.shape
    if HQ % HKV:
        raise ValueError(f"q's heads ({HQ}) must be a multiple of the cache's KV heads ({HKV}).")
    check_tensor("lengths", lengths, (B,), dtypes=(torch.int32, torch.int64), device=q.device)
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=q.device)
    if max_len is None:
        max_len = int(lengths.max().item()) if B else 0
    if max_len > L:
        raise ValueError(f"lengths up to {max_len} exceed the cache length {L}.")
    window, softcap = check_window(window, softcap)
    chunk = check_chunk(chunk, window)
    check_sinks(sinks, HQ, q.device)
    out = torch.empty_like(q) if out is None else out
    check_tensor("out", out, (B, HQ, D), dtype=q.dtype)
    if B == 0 or max_len == 0:
        return out.zero_() if B else out                                 # no keys at all: zeros
    span = max_len if window is None else min(max_len, window)          # keys one query sees, at most
    span = span if chunk is None else min(max_len, chunk)
    c = decode_config(B, HKV, span, q.device, dtype=q.dtype, kv_quant=bool(kind), **config)
    G = HQ // HKV
    BD = max(16, next_pow2(D))
    mid_o = torch.empty(B, HQ, c["splits"], BD, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, HQ, c["splits"], dtype=torch.float32, device=q.device)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    if softcap is None:
        scale, cap_scale = scale * 1.4426950408889634, 1.0                    # log2(e) folded into the scale
    else:
        scale, cap_scale = scale / softcap, softcap * 1.4426950408889634      # tanh(s / c), then c * log2(e)
    prec = "ieee" if (q.dtype == torch.float32 or INTERPRET) else "tf32"
    ks, vs = scales if kind else (k_cache, v_cache)
    launch(_decode_split_kernel, (B, HKV, c["splits"]),
           q, k_cache, v_cache, ks, vs, lengths, slots, mid_o, mid_lse, G, D, c["split_size"], scale,
           window or chunk or 0,
           cap_scale,
           q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
           *scale_strides(ks), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
           BLOCK_G=max(16, next_pow2(G)), BLOCK_N=c["block_n"], BLOCK_D=BD, UPCAST=INTERPRET, DOT_PREC=prec,
           KV_QUANT=bool(kind), WINDOW=window is not None, SOFTCAP=softcap is not None, CHUNK=chunk is not None,
           num_warps=c["num_warps"], num_stages=c["num_stages"])
    launch(_decode_merge_kernel, (B, HQ), mid_o, mid_lse, mid_lse if sinks is None else sinks, out, HQ, D,
           c["splits"], mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
           out.stride(0), out.stride(1), BLOCK_S=max(2, next_pow2(c["splits"])), BLOCK_D=BD, SINKS=sinks is not None)
    return out


def reference(q, k_cache, v_cache, lengths, slots, *, sm_scale=None, window=None, softcap=None, scales=None,
              chunk=None):
    """Plain torch, one sequence at a time (ragged lengths; length 0 gives zeros), math in fp32 (fp64 for fp64);
    an 8-bit cache is dequantized (values x scales) first. ``window`` W: keys max(0, len-W) .. len-1;
    ``chunk`` C: keys ((len-1) // C) * C .. len-1; ``softcap`` c: scores c * tanh(s / c)."""
    B, HQ, D = q.shape
    HKV = k_cache.shape[1]
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    _, scales = cache_scales(k_cache, scales)
    ks, vs = scales if scales is not None else (None, None)
    outs = []
    for b in range(B):
        n, sl = int(lengths[b]), int(slots[b])
        k0 = max(0, n - window) if window is not None else 0
        k0 = max(0, n - 1) // chunk * chunk if chunk is not None else k0
        k = dequantized(k_cache[sl, :, k0:n], None if ks is None else ks[sl, :, k0:n], ct)
        v = dequantized(v_cache[sl, :, k0:n], None if vs is None else vs[sl, :, k0:n], ct)
        k = k.repeat_interleave(HQ // HKV, dim=0)                                      # [Hq, n - k0, D]
        v = v.repeat_interleave(HQ // HKV, dim=0)
        s = (k @ q[b].to(ct)[:, :, None])[..., 0] * scale                              # [Hq, n - k0]
        s = torch.tanh(s / softcap) * softcap if softcap is not None else s
        outs.append((s.softmax(-1)[:, None, :] @ v)[:, 0] if n else torch.zeros(HQ, D, dtype=ct, device=q.device))
    return torch.stack(outs).to(q.dtype)


def torch_decode(q, k_cache, v_cache, lengths, slots, *, max_len=None, sm_scale=None, window=None, softcap=None,
                 scales=None, chunk=None):
    """The batched torch peer: grouped-query matmuls over the cache rows, masked to each length.

    No K/V copy: the cache rows are a view when ``slots`` are 0..B-1 (``slot_rows``), and the
    Hq/Hkv query heads of a group are the rows of one matmul against their KV head (no
    repeat_interleave). SDPA's own GQA path is not used: it runs only in the flash kernel, which
    takes no per-sequence mask, and the math kernel it falls back to repeats K/V. An 8-bit cache
    is a dequantize reference (``prefill_attention.DEQUANT_NOTE``): its rows are dequantized first.
    A ``window`` W shorter than ``max_len`` gathers each sequence's last W rows (positions len-W ..
    len-1, a copy) instead of reading all max_len; ``softcap`` caps the fp32 scores. A ``chunk`` C gathers
    each sequence's chunk (positions from ((len-1) // C) * C, C rows, those past len masked) the same way.
    """
    B, HQ, D = q.shape
    HKV = k_cache.shape[1]
    S = max_len if max_len is not None else int(lengths.max())
    _, scales = cache_scales(k_cache, scales)
    window, softcap = check_window(window, softcap)
    chunk = check_chunk(chunk, window)
    span = window if window is not None else chunk
    if span is not None and S > span:
        if chunk is not None:   # [B, C] absolute: the chunk's rows, those not written yet masked
            pos = ((lengths - 1).clamp(min=0) // chunk * chunk)[:, None] + torch.arange(chunk, device=q.device)[None, :]
        else:                   # [B, W] absolute: the window's rows
            pos = lengths[:, None] - window + torch.arange(window, device=q.device)[None, :]
        keep = (pos >= 0) & (pos < lengths[:, None])
        idx = (slots[:, None], slice(None), pos.clamp(min=0, max=k_cache.shape[2] - 1))
        k, v = take(k_cache, idx).transpose(1, 2), take(v_cache, idx).transpose(1, 2)      # [B, Hkv, span, D]
        if scales is not None:
            k = dequantized(k, scales[0][idx].transpose(1, 2), q.dtype)
            v = dequantized(v, scales[1][idx].transpose(1, 2), q.dtype)
        S = span
    else:
        k = slot_rows(k_cache, slots, S)                                             # [B, Hkv, S, D]
        v = slot_rows(v_cache, slots, S)
        if scales is not None:
            k = dequantized(k, slot_rows(scales[0], slots, S), q.dtype)
            v = dequantized(v, slot_rows(scales[1], slots, S), q.dtype)
        j = torch.arange(S, device=q.device)[None, :]
        keep = j < lengths[:, None]                                                  # [B, S]
        if window is not None:
            keep &= j >= lengths[:, None] - window
        if chunk is not None:
            keep &= j >= ((lengths - 1).clamp(min=0) // chunk * chunk)[:, None]
    qg = q.view(B, HKV, HQ // HKV, D)                                                # [B, Hkv, G, D]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    s = (qg @ k.transpose(-1, -2)).float() * scale                                   # [B, Hkv, G, S]
    s = torch.tanh(s / softcap) * softcap if softcap is not None else s
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    p = s.softmax(-1).nan_to_num(0.0)                                                # length 0: zeros
    return (p.to(v.dtype) @ v).reshape(B, HQ, D)


def cost(batch: int, kv_len: int, n_heads: int, n_kv_heads: int, head_dim: int, dtype="bf16", kv_dtype=None, *,
         window: int | None = None, chunk: int | None = None):
    """formulas.decode_attention (softcapping costs no FLOPs: a tanh, like the exp)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.decode_attention(batch, kv_len, n_heads, n_kv_heads, head_dim, window=window, act_dtype=d,
                              kv_dtype=kv_dtype or d, chunk=chunk)


# ---- the verify step of speculative decoding: T = k + 1 queries per sequence over its cache, causal among them

@triton.jit
def _verify_split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, len_ptr, slot_ptr, mid_o_ptr, mid_lse_ptr,
                         GROUP, NQ, ROWS, RB, HQ, D, SPLIT_SIZE, qk_scale, win, cap_scale,
                         stride_qb, stride_qt, stride_qh, stride_ks, stride_kh, stride_kn, stride_ss, stride_sh,
                         stride_sn, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, KV_QUANT: tl.constexpr,
                         WINDOW: tl.constexpr, SOFTCAP: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // RB
    rb = tl.program_id(1) % RB
    sp = tl.program_id(2)
    seq_len = tl.load(len_ptr + b).to(tl.int32)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    lo = sp * SPLIT_SIZE
    if WINDOW:                                  # the splits cover only the keys the first query's window sees
        lo += tl.maximum(seq_len - NQ + 1 - win, 0)
    hi = tl.minimum(lo + SPLIT_SIZE, seq_len)
    offs_r = rb * BLOCK_R + tl.arange(0, BLOCK_R)         # row r: query t = r // GROUP of head g = r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    rmask = offs_r < ROWS
    dmask = offs_d < D
    t = offs_r // GROUP
    heads = kvh * GROUP + offs_r % GROUP
    qpos = seq_len - NQ + t                               # query t's position: it sees keys 0 .. qpos
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + t[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)          # [BLOCK_R, D]
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + slot * stride_ks + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + slot * stride_ks + kvh.to(tl.int64) * stride_kh
    ks_base = ks_ptr + slot * stride_ss + kvh.to(tl.int64) * stride_sh
    vs_base = vs_ptr + slot * stride_ss + kvh.to(tl.int64) * stride_sh
    m_i = tl.full((BLOCK_R,), -1.0e30, tl.float32)       # finite: a row may see no key of this split (p = 0)
    l_i = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        k = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                    mask=nmask[None, :] & dmask[:, None], other=0.0)              # [D, BLOCK_N]
        if UPCAST:
            k = k.to(tl.float32)
        elif KV_QUANT:
            k = k.to(q.dtype)
        s = tl.dot(q, k, input_precision=DOT_PREC) * qk_scale                     # [BLOCK_R, BLOCK_N]
        if KV_QUANT:
            s = s * tl.load(ks_base + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
        if SOFTCAP:
            s = tanh(s) * cap_scale
        keep = nmask[None, :] & (offs_n[None, :] <= qpos[:, None])                # causal among the NQ queries
        if WINDOW:
            keep = keep & (offs_n[None, :] > qpos[:, None] - win)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                    mask=nmask[:, None] & dmask[None, :], other=0.0)              # [BLOCK_N, D]
        pv = p
        if KV_QUANT:
            pv = p * tl.load(vs_base + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
        if UPCAST:
            v = v.to(tl.float32)
        else:
            if KV_QUANT:
                v = v.to(q.dtype)
            pv = pv.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PREC)
        m_i = m_new
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    row = t * HQ + heads                                   # the merge's row: (query, head) of [B, NQ * HQ]
    mo = mid_o_ptr + b.to(tl.int64) * stride_mb + row[:, None] * stride_mh + sp * stride_ms + offs_d[None, :]
    tl.store(mo, out, mask=rmask[:, None] & dmask[None, :])
    tl.store(mid_lse_ptr + b.to(tl.int64) * stride_lb + row * stride_lh + sp, lse, mask=rmask)


VERIFY_MAX_ROWS = 64   # (query, head) rows of one verify program, at most: more rows take more programs


def verify_config(batch: int, n_queries: int, n_heads: int, n_kv_heads: int, max_len: int, device="cpu", *,
                  dtype=torch.bfloat16, block_n=None, splits=None, kv_quant: bool = False) -> dict:
    """The verify kernel's tiles: the T = ``n_queries`` queries of the Hq/Hkv heads of one KV head are the rows
    of one program (T x G rows, a power of two of at least 16, at most ``VERIFY_MAX_ROWS``; more rows: more
    programs per KV head), and the split count is ``decode_config``'s over those programs."""
    rows = n_queries * (n_heads // n_kv_heads)
    br = min(VERIFY_MAX_ROWS, max(16, next_pow2(rows)))
    rb = cdiv(rows, br)
    c = decode_config(batch, n_kv_heads * rb, max_len, device, dtype=dtype, block_n=block_n, splits=splits,
                      kv_quant=kv_quant)
    return dict(c, block_r=br, row_blocks=rb)


def verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     slots: torch.Tensor, *, max_len: int | None = None, sm_scale: float | None = None,
                     window: int | None = None, softcap: float | None = None, out=None, scales=None, sinks=None,
                     **config) -> torch.Tensor:
    """o [B, T, Hq, D]: the verify step of speculative decoding. Sequence b's T new tokens (the last accepted
    one and the k = T - 1 drafts, already appended) are the last T of its ``lengths[b]`` cached keys, so query t
    sits at position lengths[b] - T + t and sees keys 0 .. lengths[b] - T + t (causal among the T; a position
    below 0 sees nothing: zeros). Split-KV as ``decode_attention`` (the T x Hq/Hkv rows of one KV head read each
    key tile once), merged by the decode merge over [B, T x Hq] rows. ``window`` W: query t sees the keys after
    its position - W; ``softcap``, ``scales`` (an 8-bit cache), ``sinks``, ``max_len``: as ``decode_attention``'s.
    ``out``, when given, must hold its T x Hq rows of one sequence at one stride (a contiguous [T, Hq, D])."""
    # q: [B, T, Hq, D]   k_cache, v_cache: [S, Hkv, L, D]   lengths, slots: [B]   o: [B, T, Hq, D]
    check_tensor("q", q, (None, None, None, None), dtypes=FLOAT_DTYPES)
    B, T, HQ, D = q.shape
    check_tensor("k_cache", k_cache, (None, None, None, D), dtypes=CACHE_DTYPES, device=q.device)
    kind, scales = cache_scales(k_cache, scales)
    if not kind:
        check_tensor("k_cache", k_cache, dtype=q.dtype)
    check_tensor("v_cache", v_cache, tuple(k_cache.shape), dtype=k_cache.dtype, device=q.device)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same strides.")
    _, HKV, L, _ = k_cache.shape
    if HQ % HKV:
        raise ValueError(f"q's heads ({HQ}) must be a multiple of the cache's KV heads ({HKV}).")
    check_tensor("lengths", lengths, (B,), dtypes=(torch.int32, torch.int64), device=q.device)
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=q.device)
    if max_len is None:
        max_len = int(lengths.max().item()) if B else 0
    if max_len > L:
        raise ValueError(f"lengths up to {max_len} exceed the cache length {L}.")
    window, softcap = check_window(window, softcap)
    check_sinks(sinks, HQ, q.device)
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    check_tensor("out", out, (B, T, HQ, D), dtype=q.dtype)
    if (T > 1 and out.stride(1) != HQ * out.stride(2)) or out.stride(3) != 1:
        raise ValueError(f"out must hold one sequence's T x Hq rows at one stride (a contiguous [T, Hq, D] per "
                         f"sequence), got strides {tuple(out.stride())}: pass out=None or a contiguous tensor.")
    if B * T == 0 or max_len == 0:
        return out.zero_() if B * T else out
    span = max_len if window is None else min(max_len, window + T - 1)   # keys some query of a sequence sees
    c = verify_config(B, T, HQ, HKV, span, q.device, dtype=q.dtype, kv_quant=bool(kind), **config)
    G, BD, rows = HQ // HKV, max(16, next_pow2(D)), T * HQ
    mid_o = torch.empty(B, rows, c["splits"], BD, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, rows, c["splits"], dtype=torch.float32, device=q.device)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    if softcap is None:
        scale, cap_scale = scale * 1.4426950408889634, 1.0
    else:
        scale, cap_scale = scale / softcap, softcap * 1.4426950408889634
    prec = "ieee" if (q.dtype == torch.float32 or INTERPRET) else "tf32"
    ks, vs = scales if kind else (k_cache, v_cache)
    launch(_verify_split_kernel, (B, HKV * c["row_blocks"], c["splits"]),
           q, k_cache, v_cache, ks, vs, lengths, slots, mid_o, mid_lse, G, T, T * G, c["row_blocks"], HQ, D,
           c["split_size"], scale, window or 0, cap_scale,
           q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
           *scale_strides(ks), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
           BLOCK_R=c["block_r"], BLOCK_N=c["block_n"], BLOCK_D=BD, UPCAST=INTERPRET, DOT_PREC=prec,
           KV_QUANT=bool(kind), WINDOW=window is not None, SOFTCAP=softcap is not None,
           num_warps=c["num_warps"], num_stages=c["num_stages"])
    sk = mid_lse if sinks is None else sinks.repeat(T)                   # merge row t * Hq + h reads sinks[h]
    launch(_decode_merge_kernel, (B, rows), mid_o, mid_lse, sk, out, rows, D,
           c["splits"], mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
           out.stride(0), out.stride(2), BLOCK_S=max(2, next_pow2(c["splits"])), BLOCK_D=BD, SINKS=sinks is not None)
    return out


def verify_visible(lengths: torch.Tensor, n_queries: int, S: int, window=None) -> torch.Tensor:
    """[B, T, S] bool: query t of sequence b (position lengths[b] - T + t) sees key j iff j <= its position and
    (under ``window`` W) j > its position - W."""
    pos = lengths[:, None] - n_queries + torch.arange(n_queries, device=lengths.device)[None, :]     # [B, T]
    j = torch.arange(S, device=lengths.device)[None, None, :]
    keep = j <= pos[:, :, None]
    return keep & (j > pos[:, :, None] - window) if window is not None else keep


def verify_reference(q, k_cache, v_cache, lengths, slots, *, sm_scale=None, window=None, softcap=None, scales=None,
                     sinks=None):
    """Plain torch, one sequence at a time, math in fp32 (fp64 for fp64): every query over the keys it sees
    (``verify_visible``; none: zeros), an 8-bit cache dequantized first, ``sinks`` [Hq] joining each
    denominator."""
    B, T, HQ, D = q.shape
    HKV = k_cache.shape[1]
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    _, scales = cache_scales(k_cache, scales)
    ks, vs = scales if scales is not None else (None, None)
    outs = []
    for b in range(B):
        n, sl = int(lengths[b]), int(slots[b])
        k = dequantized(k_cache[sl, :, :n], None if ks is None else ks[sl, :, :n], ct)
        v = dequantized(v_cache[sl, :, :n], None if vs is None else vs[sl, :, :n], ct)
        k = k.repeat_interleave(HQ // HKV, dim=0)                                     # [Hq, n, D]
        v = v.repeat_interleave(HQ // HKV, dim=0)
        s = q[b].to(ct).transpose(0, 1) @ k.transpose(-1, -2) * scale                 # [Hq, T, n]
        s = torch.tanh(s / softcap) * softcap if softcap is not None else s
        s = s.masked_fill(~verify_visible(lengths[b:b + 1], T, n, window)[0][None], float("-inf"))
        if sinks is not None:
            s = torch.cat([sinks.to(ct)[:, None, None].expand(HQ, T, 1), s], -1)
        p = s.softmax(-1).nan_to_num(0.0)
        p = p[..., 1:] if sinks is not None else p
        outs.append((p @ v).transpose(0, 1))                                            # [T, Hq, D]
    return torch.stack(outs).to(q.dtype)


def torch_verify(q, k_cache, v_cache, lengths, slots, *, max_len=None, sm_scale=None, window=None, softcap=None,
                 scales=None, sinks=None):
    """The batched torch peer: the T x Hq/Hkv (query, head) rows of a KV head are the rows of one matmul against
    its cache rows (a view when ``slots`` are 0..B-1: ``slot_rows``), masked to each query's keys
    (``verify_visible``; a window is a mask here, every row up to ``max_len`` read), fp32 scores; an 8-bit cache
    is dequantized first (a dequantize reference, ``prefill_attention.DEQUANT_NOTE``)."""
    B, T, HQ, D = q.shape
    HKV = k_cache.shape[1]
    G = HQ // HKV
    S = max_len if max_len is not None else int(lengths.max())
    _, scales = cache_scales(k_cache, scales)
    window, softcap = check_window(window, softcap)
    k, v = slot_rows(k_cache, slots, S), slot_rows(v_cache, slots, S)                 # [B, Hkv, S, D]
    if scales is not None:
        k = dequantized(k, slot_rows(scales[0], slots, S), q.dtype)
        v = dequantized(v, slot_rows(scales[1], slots, S), q.dtype)
    qg = q.view(B, T, HKV, G, D).permute(0, 2, 3, 1, 4).reshape(B, HKV, G * T, D)     # rows (g, t)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    s = ((qg @ k.transpose(-1, -2)).float() * scale).view(B, HKV, G, T, S)
    s = torch.tanh(s / softcap) * softcap if softcap is not None else s
    s = s.masked_fill(~verify_visible(lengths, T, S, window)[:, None, None], float("-inf"))
    if sinks is not None:
        sk = sinks.float().view(1, HKV, G, 1, 1).expand(B, HKV, G, T, 1)
        p = torch.cat([sk, s], -1).softmax(-1).nan_to_num(0.0)[..., 1:]
    else:
        p = s.softmax(-1).nan_to_num(0.0)                                              # no key: zeros
    o = p.to(v.dtype).view(B, HKV, G * T, S) @ v                                       # [B, Hkv, G T, D]
    return o.view(B, HKV, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, HQ, D)


def verify_cost(batch: int, context: int, k: int, n_heads: int, n_kv_heads: int, head_dim: int, dtype="bf16",
                kv_dtype=None, *, window: int | None = None):
    """The verify step's attention as ``roofline.speculative.verify_step`` costs it: each sequence's k + 1 queries
    after ``context`` cached keys, causal among them (formulas.prefill_attention with cached_tokens = context)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.prefill_attention(batch, k + 1, n_heads, n_kv_heads, head_dim, cached_tokens=context, window=window,
                               act_dtype=d, kv_dtype=kv_dtype or d)
