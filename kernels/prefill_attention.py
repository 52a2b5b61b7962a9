"""Prefill attention: FlashAttention-2 style, causal, GQA, over a KV cache with a cached prefix.

New queries q [B, n, Hq, D] sit at positions p..p+n-1 of their sequence; their keys and
values (prefix and new tokens, already appended) are read from the cache
k_cache/v_cache [n_slots, Hkv, L, D] rows slots[b]. Query i attends to keys 0..p+i.
Non-causal (``causal=False``) attends to all p+n keys.

Grid: one axis of cdiv(n, BLOCK_M) * B*Hq programs (no 65,535 limit on B*Hq), heads fastest.
Causal: the heaviest query tiles (the last rows, which see the most keys) are scheduled first,
so the short tiles fill the tail of the last wave instead of a long tile running alone.
Each program holds a BLOCK_M x D query tile and streams
BLOCK_N-key tiles with an online softmax (running max m, sum l, fp32 accumulator; exp2 with
log2(e) folded into the scale). Key tiles wholly below the diagonal run unmasked; only the
tiles that cross it apply the causal mask (the FA2 / Triton tutorial split). Under GQA a
query head reads its group's KV head; the Hq/Hkv programs of a group share those tiles in L2.

GPU: bf16/fp16 dots run natively on tensor cores (p is cast to v's dtype for the second
dot); under the interpreter (no bf16 math) every load is upcast to fp32. fp32 dots are IEEE
FMAs, whose operand layouts hold a whole D-long row per thread: the fp32 tile (32 x 16, 8 warps,
2 stages at D <= 128) is the one ``roofline check --compile`` finds spill-free on sm_80 and
sm_90 (64 x 32 with 4 warps spilled over 30 KB per thread on sm_90).

Sliding window (``window`` W, Mistral / Gemma-2/3): query i sees keys i-W < j <= i. A query tile starts
at the first key tile any of its queries sees (tiles below every window are never loaded); the tiles
every query sees fully run unmasked, and the window's lower edge runs masked in the same loop as the
diagonal band (two loops, not three: a third spilled on sm_80). Rows start from a finite running max
(-1e30), so a row that sees no key of its first tile gets p = 0, not NaN. Softcapping (``softcap`` c,
Gemma-2): s = c * tanh(s / c) on the scaled scores (``_common.tanh``), before the mask and the softmax.

Chunked local attention (``chunk`` C, Llama-4): query i sees keys (i // C) * C <= j <= i. It runs as the window
does (the ``WINDOW`` loops, ``CHUNK`` on): a query tile starts at its first query's chunk start, the keys from
its last query's chunk start on run unmasked below the diagonal, the rest masked to each query's chunk.

8-bit KV cache (int8 or fp8 caches with ``scales=(k_scale, v_scale)``, fp32 [n_slots, Hkv, L], written
by ``kernels.kv_append``): K and V tiles are loaded as 8-bit values (1 byte per element from DRAM)
and converted to q's dtype in registers (exact), and their per-token scales are applied where they
are cheapest: K's scale multiplies each key's column of scores (s[i, j] = scale_j sum_d q[i, d]
k8[j, d]), V's multiplies each key's column of probabilities before the P.V dot; the row sums of
the online softmax use the unscaled probabilities. A per-tensor fp8 cache (vLLM's ``k_scale`` / ``v_scale``, the
"fp8-tensor" KV format) passes one-element scales (``cache_scales``): the same kernel with scale strides 0.

Sinks (``sinks`` [Hq], GPT-OSS; ``kernels.sinks`` is the reference): each query head's learned logit joins
every row's denominator, p_j = exp(s_j - m) / (exp(sink - m) + sum_j exp(s_j - m)). The online softmax starts
from it: running max m = sink (times log2(e), clamped to -1e30 so a -inf sink weighs 0), running sum l = 1 (its
exp2 at that max), accumulator 0; the key loops are unchanged, so it is exact and costs one scalar load per
program. ``SINKS`` is a constexpr: without sinks the kernel compiles to the same instructions as before.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import (FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, check_window, dtype_name, next_pow2, slot_rows,
                      take, tanh)
from ._launch import launch
from .kv_append import CACHE_DTYPES, check_scales, dequantized
from .quant import kv_dtype_of


@triton.jit
def _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, lo, hi, kv_hi, gap_at, gap, qpos0,
               stride_kn, stride_sn, D, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, UPCAST: tl.constexpr,
               DOT_PREC: tl.constexpr, KV_QUANT: tl.constexpr, qk_scale, WINDOW: tl.constexpr, win,
               SOFTCAP: tl.constexpr, cap_scale, CHUNK: tl.constexpr = False):
    """Key tiles lo, lo + BLOCK_N, ... < hi (keys < kv_hi). WINDOW: masked to the window too, and tiles from
    ``gap_at`` on are shifted up by ``gap`` keys (the window's lower edge and the diagonal band in one loop)."""
    dmask = offs_d < D
    for virt in range(lo, hi, BLOCK_N):
        start = virt
        if WINDOW:
            start = tl.where(virt >= gap_at, virt + gap, virt)
        offs_n = start + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < kv_hi)
        k = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                    mask=kv_mask[None, :] & dmask[:, None], other=0.0)           # [D, BLOCK_N]
        if UPCAST:
            k = k.to(tl.float32)
        elif KV_QUANT:
            k = k.to(q.dtype)                                                    # 8-bit -> q's dtype: exact
        s = tl.dot(q, k, input_precision=DOT_PREC) * qk_scale                    # [BLOCK_M, BLOCK_N]
        if KV_QUANT:
            s = s * tl.load(ks_base + offs_n * stride_sn, mask=kv_mask, other=0.0)[None, :]   # each key's scale
        if SOFTCAP:
            s = tanh(s) * cap_scale                       # s was scaled by sm_scale / cap: cap * tanh(.) * log2(e)
        if MASKED:
            keep = ((qpos0 + offs_m)[:, None] >= offs_n[None, :]) & kv_mask[None, :]
            if WINDOW:
                if CHUNK:                                 # keys of the query's own chunk (win: the chunk)
                    keep = keep & (((qpos0 + offs_m) // win * win)[:, None] <= offs_n[None, :])
                else:
                    keep = keep & ((qpos0 + offs_m)[:, None] - win < offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                    mask=kv_mask[:, None] & dmask[None, :], other=0.0)           # [BLOCK_N, D]
        pv = p
        if KV_QUANT:
            pv = p * tl.load(vs_base + offs_n * stride_sn, mask=kv_mask, other=0.0)[None, :]  # each value row's
        if UPCAST:
            v = v.to(tl.float32)
        else:
            if KV_QUANT:
                v = v.to(q.dtype)
            pv = pv.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _prefill_attn_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, sink_ptr, o_ptr, slot_ptr, N_NEW, P, HQ, BH, GROUP, D,
                         qk_scale, win, cap_scale, stride_qb, stride_qn, stride_qh, stride_ob, stride_on, stride_oh,
                         stride_ks, stride_kh, stride_kn, stride_ss, stride_sh, stride_sn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         CAUSAL: tl.constexpr, HEAVY_FIRST: tl.constexpr, UPCAST: tl.constexpr,
                         DOT_PREC: tl.constexpr, KV_QUANT: tl.constexpr, WINDOW: tl.constexpr,
                         SOFTCAP: tl.constexpr, SINKS: tl.constexpr, CHUNK: tl.constexpr = False):
    pid = tl.program_id(0)
    pid_bh = pid % BH                                       # (batch, head) fastest
    pid_m = pid // BH
    if HEAVY_FIRST:                                         # causal: the last query tile has the most keys
        pid_m = tl.cdiv(N_NEW, BLOCK_M) - 1 - pid_m
    b = pid_bh // HQ
    h = pid_bh % HQ
    kvh = h // GROUP
    slot = tl.load(slot_ptr + b).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    qmask = (offs_m[:, None] < N_NEW) & (offs_d[None, :] < D)
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + offs_m[:, None] * stride_qn + h * stride_qh + offs_d[None, :],
                mask=qmask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + slot * stride_ks + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + slot * stride_ks + kvh.to(tl.int64) * stride_kh
    ks_base = ks_ptr + slot * stride_ss + kvh.to(tl.int64) * stride_sh    # scales of an 8-bit cache (else unused)
    vs_base = vs_ptr + slot * stride_ss + kvh.to(tl.int64) * stride_sh
    if SINKS:       # the sink's logit (log2 units) starts the running max, and its exp2 there (1) the sum
        sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros((BLOCK_M,), tl.float32) + tl.maximum(sink, -1.0e30)      # finite: a -inf sink weighs 0
        l_i = tl.full((BLOCK_M,), 1.0, tl.float32)
    else:
        if WINDOW:  # a row may see no key of its first tiles: a finite start keeps exp2(s - m) at 0, never NaN
            m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
        else:
            m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if CAUSAL:
        # [mid, diag_lo): keys every query of this tile sees, no mask; [diag_lo, hi): the diagonal band, masked.
        # A window adds [lo, mid), its lower edge, masked, run in the diagonal band's loop (two loops, not three:
        # a third spilled on sm_80); tiles wholly below the window of every query of this tile are never visited.
        q_first = P + pid_m * BLOCK_M
        hi = tl.minimum(q_first + BLOCK_M, P + N_NEW)
        diag_lo = (q_first // BLOCK_N) * BLOCK_N
        if WINDOW:
            if CHUNK:       # from the first query's chunk start; every query sees from the last one's chunk start
                lo = (q_first // win * win // BLOCK_N) * BLOCK_N
                full_lo = tl.cdiv((hi - 1) // win * win, BLOCK_N) * BLOCK_N
            else:
                lo = (tl.maximum(q_first - win + 1, 0) // BLOCK_N) * BLOCK_N
                full_lo = tl.cdiv(tl.maximum(hi - win, 0), BLOCK_N) * BLOCK_N     # seen by the tile's last query
            mid = tl.maximum(lo, tl.minimum(full_lo, diag_lo))
            diag_lo = tl.maximum(mid, diag_lo)
            acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, mid,
                                       diag_lo, diag_lo, 0, 0, P, stride_kn, stride_sn, D, BLOCK_N, False, UPCAST, DOT_PREC,
                                       KV_QUANT, qk_scale, False, win, SOFTCAP, cap_scale)
            acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, lo,
                                       mid + hi - diag_lo, hi, mid, diag_lo - mid, P, stride_kn, stride_sn, D, BLOCK_N, True,
                                       UPCAST, DOT_PREC, KV_QUANT, qk_scale, True, win, SOFTCAP, cap_scale, CHUNK)
        else:
            acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, 0,
                                       diag_lo, diag_lo, 0, 0, P, stride_kn, stride_sn, D, BLOCK_N, False, UPCAST, DOT_PREC,
                                       KV_QUANT, qk_scale, False, win, SOFTCAP, cap_scale)
            acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, diag_lo,
                                       hi, hi, 0, 0, P, stride_kn, stride_sn, D, BLOCK_N, True, UPCAST, DOT_PREC, KV_QUANT,
                                       qk_scale, False, win, SOFTCAP, cap_scale)
    else:
        S_KV = P + N_NEW
        full = (S_KV // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, 0, full,
                                   full, 0, 0, S_KV, stride_kn, stride_sn, D, BLOCK_N, False, UPCAST, DOT_PREC, KV_QUANT,
                                   qk_scale, False, win, SOFTCAP, cap_scale)
        acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, offs_m, offs_d, full, S_KV,
                                   S_KV, 0, 0, S_KV, stride_kn, stride_sn, D, BLOCK_N, True, UPCAST, DOT_PREC, KV_QUANT,
                                   qk_scale, False, win, SOFTCAP, cap_scale)
    if WINDOW:                                              # rows past the chunk may see no key at all
        l_i = tl.where(l_i > 0, l_i, 1.0)
    acc = acc / l_i[:, None]
    o = o_ptr + b.to(tl.int64) * stride_ob + offs_m[:, None] * stride_on + h * stride_oh + offs_d[None, :]
    tl.store(o, acc.to(o_ptr.dtype.element_ty), mask=qmask)


def attention_config(n_new: int, head_dim: int, dtype=torch.bfloat16, *, block_m=None, block_n=None,
                     kv_quant: bool = False) -> dict:
    """Query tile, key tile, warps and stages. fp32 (IEEE FMA dots) takes small tiles that do not spill; an 8-bit
    cache (``kv_quant``) 32-key tiles in 16 bits (its scale loads spilled 4 B per thread at 64 keys on sm_80)."""
    for name, v in (("block_m", block_m), ("block_n", block_n)):
        if v is not None and (int(v) < 16 or int(v) & (int(v) - 1)):
            raise ValueError(f"{name} must be a power of two of at least 16 (tl.dot needs operands of 16 or more "
                             f"on a GPU), got {v}.")
    if dtype == torch.float32:
        bm, bn, warps, stages = (32, 16, 8, 2) if head_dim <= 128 else (16, 16, 4, 2)
    else:
        bm, bn = (128 if head_dim <= 128 else 64), 64
        warps, stages = (8 if bm >= 128 else 4), (3 if head_dim <= 128 else 2)
    if kv_quant:
        bn = min(bn, 32)
    bm, bn = block_m or bm, block_n or bn
    return dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                      cached: int = 0, *, causal: bool = True, sm_scale: float | None = None, window: int | None = None,
                      softcap: float | None = None, out=None, scales=None, sinks=None, chunk: int | None = None,
                      **config) -> torch.Tensor:
    """o [B, n, Hq, D] for new queries at positions cached..cached+n-1 over cache rows ``slots``; an 8-bit
    cache (int8 / fp8) comes with ``scales=(k_scale, v_scale)`` [S, Hkv, L] fp32.

    ``window`` W (causal only): query i sees keys i-W < j <= i (transformers' sliding window); key tiles
    below every query's window are skipped. ``softcap`` c (Gemma-2): scores s = c * tanh(s / c) before the
    softmax (s already times ``sm_scale``). ``sinks`` [Hq] (GPT-OSS; fp32, or q's dtype, upcast on load): each
    head's logit joins every softmax denominator (``kernels.sinks``); None compiles the kernel without it.
    ``chunk`` C (causal only, not with a window): query i sees keys (i // C) * C <= j <= i (Llama-4)."""
    # q: [B, n, Hq, D]   k_cache, v_cache: [S, Hkv, L, D] (any strides but D contiguous)   slots: [B]
    check_tensor("q", q, (None, None, None, None), dtypes=FLOAT_DTYPES)
    B, n, HQ, D = q.shape
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
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=q.device)
    if cached < 0 or cached + n > L:
        raise ValueError(f"positions {cached}..{cached + n - 1} do not fit the cache length {L}.")
    window, softcap = check_window(window, softcap)
    chunk = check_chunk(chunk, window, causal)
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal attention: pass causal=True, or window=None.")
    check_sinks(sinks, HQ, q.device)
    out = torch.empty_like(q) if out is None else out
    check_tensor("out", out, (B, n, HQ, D), dtype=q.dtype)
    if B * n == 0:
        return out
    c = attention_config(n, D, q.dtype, kv_quant=bool(kind), **config)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    if softcap is None:
        scale, cap_scale = scale * 1.4426950408889634, 1.0                    # log2(e) folded into the scale
    else:
        scale, cap_scale = scale / softcap, softcap * 1.4426950408889634      # tanh(s / c), then c * log2(e)
    prec = "ieee" if (q.dtype == torch.float32 or INTERPRET) else "tf32"
    grid = (cdiv(n, c["block_m"]) * B * HQ,)
    ks, vs = scales if kind else (k_cache, v_cache)
    sk = q if sinks is None else sinks                                          # unused without sinks
    launch(_prefill_attn_kernel, grid, q, k_cache, v_cache, ks, vs, sk, out, slots, n, int(cached), HQ, B * HQ,
           HQ // HKV, D, scale, window or chunk or 0, cap_scale, q.stride(0), q.stride(1), q.stride(2), out.stride(0),
           out.stride(1), out.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *scale_strides(ks),
           BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], BLOCK_D=max(16, next_pow2(D)),
           CAUSAL=causal, HEAVY_FIRST=causal, UPCAST=INTERPRET, DOT_PREC=prec, KV_QUANT=bool(kind),
           WINDOW=window is not None or chunk is not None, SOFTCAP=softcap is not None, SINKS=sinks is not None,
           CHUNK=chunk is not None, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


def cache_scales(k_cache: torch.Tensor, scales) -> tuple:
    """(kind, scales) of a KV cache: "" for a float cache; "int8" / "fp8" with scales [S, Hkv, L] fp32 per token
    per KV head (``kernels.kv_append.check_scales``), or with one fp32 scale per layer's K and one for its V
    (vLLM's ``k_scale`` / ``v_scale``: the "fp8-tensor" KV format), returned as [S, Hkv, L] views of stride 0, so
    the kernels, the torch peers and the references read either layout the same way."""
    kind = kv_dtype_of(k_cache)
    if kind and scales is not None and len(scales) == 2 and all(
            isinstance(t, torch.Tensor) and t.numel() == 1 and t.dim() <= 1 for t in scales):
        S, HKV, L, _ = k_cache.shape
        for n, t in zip(("k_scale", "v_scale"), scales):
            check_tensor(n, t, dtype=torch.float32, device=k_cache.device)
        return kind, tuple(t.reshape(1, 1, 1).expand(S, HKV, L) for t in scales)
    return check_scales(k_cache, scales), scales


def scale_strides(ks: torch.Tensor) -> tuple:
    """(slot, head, token) strides of an 8-bit cache's scales for the kernels (0, 0, 0 for one per tensor); a float
    cache passes itself (unused: token stride 1)."""
    return (ks.stride(0), ks.stride(1), ks.stride(2) if ks.dim() == 3 else 1)


def check_sinks(sinks, n_heads: int, device) -> None:
    """``sinks``: None, or one logit per query head ([Hq], a float dtype, on q's device)."""
    if sinks is not None:
        check_tensor("sinks", sinks, (n_heads,), dtypes=FLOAT_DTYPES, device=device)


def check_chunk(chunk, window, causal: bool = True):
    """``chunk`` as an int >= 1 or None; refused beside a window or without causal attention."""
    if chunk is None:
        return None
    if isinstance(chunk, bool) or not hasattr(chunk, "__index__") or int(chunk) < 1:
        raise ValueError(f"chunk must be a whole number of positions of at least 1 (or None), got {chunk!r}.")
    if window is not None or not causal:
        raise ValueError("chunked attention is causal and has no window: pass causal=True and window=None.")
    return int(chunk)


def visible(rows: torch.Tensor, S: int, window=None, chunk=None) -> torch.Tensor:
    """[len(rows), S] bool: query at position rows[i] sees key j iff j <= rows[i] and rows[i] - window < j
    (``window``), or (rows[i] // chunk) * chunk <= j (``chunk``: its own chunk)."""
    j = torch.arange(S, device=rows.device)[None, :]
    keep = j <= rows[:, None]
    if chunk is not None:
        keep = keep & (j >= (rows // chunk * chunk)[:, None])
    return keep & (j > rows[:, None] - window) if window is not None else keep


def capped(s: torch.Tensor, softcap=None) -> torch.Tensor:
    """Gemma-2's logit softcapping: softcap * tanh(s / softcap); s itself without one."""
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def reference(q, k_cache, v_cache, slots, cached: int = 0, *, causal: bool = True, sm_scale=None, window=None,
              softcap=None, scales=None, chunk=None):
    """Plain torch: softmax(cap(q k^T * scale) + mask) v, math in q's dtype (fp32 when q is lower); an 8-bit
    cache is dequantized (values x scales) first. ``window``/``softcap``/``chunk``: as ``prefill_attention``."""
    B, n, HQ, D = q.shape
    HKV = k_cache.shape[1]
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    S = cached + n
    _, scales = cache_scales(k_cache, scales)
    ks, vs = scales if scales is not None else (None, None)
    kd = dequantized(take(k_cache, slots)[:, :, :S], None if ks is None else ks[slots][:, :, :S], ct)
    vd = dequantized(take(v_cache, slots)[:, :, :S], None if vs is None else vs[slots][:, :, :S], ct)
    k = kd.repeat_interleave(HQ // HKV, dim=1)                                     # [B, Hq, S, D]
    v = vd.repeat_interleave(HQ // HKV, dim=1)
    qq = q.to(ct).transpose(1, 2)                                                 # [B, Hq, n, D]
    s = capped(qq @ k.transpose(-1, -2) * (sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)), softcap)
    if causal:
        s = s.masked_fill(~visible(cached + torch.arange(n, device=q.device), S, window, chunk), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).to(q.dtype)                       # [B, n, Hq, D]


def sdpa(q, k_cache, v_cache, slots, cached: int = 0, *, causal: bool = True, sm_scale=None, window=None,
         softcap=None, scales=None, chunk=None):
    """The fast torch peer: F.scaled_dot_product_attention in the inputs' dtype (flash on a GPU).

    K/V are the cache rows themselves (a view when slots are 0..B-1) and GQA is SDPA's own
    (``enable_gqa``, torch >= 2.5): no repeat_interleave copy; older torch repeats K/V. An 8-bit
    cache is a dequantize reference (``DEQUANT_NOTE``): torch has no attention op over int8/fp8 K/V
    with per-token scales, so the rows read are dequantized to q's dtype first. A ``window`` reads
    only the keys some query sees (from cached - W + 1) under a boolean mask (SDPA's memory-efficient
    or math kernel: flash takes no mask). ``softcap``: SDPA has no hook for it, so the scores are
    computed by matmuls, capped, masked and softmaxed in fp32 (``_capped_sdpa``). A ``chunk`` reads from the
    first query's chunk start, under the boolean mask of each query's chunk.
    """
    B, n, HQ, D = q.shape
    HKV = k_cache.shape[1]
    S = cached + n
    _, scales = cache_scales(k_cache, scales)
    window, softcap = check_window(window, softcap)
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal attention: pass causal=True, or window=None.")
    chunk = check_chunk(chunk, window, causal)
    k0 = max(0, cached - window + 1) if window is not None else 0   # keys below every window: unread
    if chunk is not None:
        k0 = cached // chunk * chunk                                 # keys before the first query's chunk: unread
    k, v = slot_rows(k_cache, slots, S)[:, :, k0:], slot_rows(v_cache, slots, S)[:, :, k0:]  # [B, Hkv, S-k0, D]
    if scales is not None:
        k = dequantized(k, slot_rows(scales[0], slots, S)[:, :, k0:], q.dtype)
        v = dequantized(v, slot_rows(scales[1], slots, S)[:, :, k0:], q.dtype)
    qq = q.transpose(1, 2)
    mask = None
    if causal and (cached or window is not None or chunk is not None):
        mask = visible(cached + torch.arange(n, device=q.device), S, window, chunk)[:, k0:]
    if softcap is not None:
        return _capped_sdpa(qq, k, v, mask if causal else None, causal and mask is None, sm_scale, softcap)
    kw = dict(attn_mask=mask) if mask is not None else dict(is_causal=causal)
    if sm_scale is not None:
        kw["scale"] = sm_scale
    if HQ != HKV:
        try:
            o = torch.nn.functional.scaled_dot_product_attention(qq, k, v, enable_gqa=True, **kw)
            return o.transpose(1, 2)
        except TypeError:                                                          # torch < 2.5
            k, v = k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(qq, k, v, **kw).transpose(1, 2)


def _capped_sdpa(qq, k, v, mask, is_causal, sm_scale, softcap):
    """Softcapped attention by matmuls (qq [B, Hq, n, D], k/v [B, Hkv, S, D]); the scores in fp32, grouped
    query heads as the rows of one matmul per KV head (no K/V repeat)."""
    B, HQ, n, D = qq.shape
    HKV, S = k.shape[1], k.shape[2]
    qg = qq.reshape(B, HKV, HQ // HKV * n, D)
    s = (qg @ k.transpose(-1, -2)).float().view(B, HKV, HQ // HKV, n, S)
    s = capped(s * (sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)), softcap)
    if is_causal:
        mask = visible(torch.arange(n, device=qq.device) + S - n, S)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = s.softmax(-1).to(v.dtype).view(B, HKV, HQ // HKV * n, S)
    return (p @ v).view(B, HQ, n, D).transpose(1, 2)


DEQUANT_NOTE = ("dequantize reference: the 8-bit K/V rows are dequantized to the activation dtype, then the float "
                "attention runs (torch has no attention op over int8/fp8 K/V with per-token scales)")


def cost(batch: int, new_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, *, cached: int = 0,
         causal: bool = True, window: int | None = None, dtype="bf16", kv_dtype=None, chunk: int | None = None):
    """formulas.prefill_attention (softcapping costs no FLOPs: a tanh, like the exp)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.prefill_attention(batch, new_tokens, n_heads, n_kv_heads, head_dim, cached_tokens=cached,
                               causal=causal, window=window, act_dtype=d, kv_dtype=kv_dtype or d, chunk=chunk)
