"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer's scores and top-k, and latent
attention over the selected latents (``roofline.formulas.dsa``; transformers 5.24's DeepseekV32Indexer).

Indexer scores (``index_scores``): T query rows, each with its slot and its number of visible keys ``limits[t]``
(its position + 1: causal, the diagonal included), over the indexer's key cache ``k_cache`` [S, L, Di] (one key
per token, shared by the Hi heads):

    score[t, j] = sum_h w[t, h] * relu(q[t, h] . k[slot_t, j] * scale)     (j < limits[t]; -inf after)

with ``w`` the weights_proj output times Hi^-0.5 in fp32 and ``scale`` = Di^-0.5, as transformers computes it
(its ReLU of the scaled product, then the weighted sum over the heads). Kernel: grid (T, key blocks); a program
holds one query's BLOCK_H (>= 16, so tl.dot is legal) heads as the rows of [BLOCK_H, Di] and one [BLOCK_N, Di]
key tile, every load upcast to fp32 (the interpreter has no bf16 dot), the dot in IEEE fp32 for fp32 inputs
(tf32 otherwise, exact for 16-bit inputs). ``index_topk``: torch.topk of each row (k = min(topk, keys)); a
query with fewer visible keys than k gets -1 for the rest (the mask transformers adds keeps them out too).
Ties: torch.topk's order, on both backends (the scores are the same fp32 numbers in the same order).

Sparse decode (``mla_sparse_decode``): ``kernels.mla``'s absorbed decode, but over the latents a query's
``indices`` [B, K] name (int32, -1: none) instead of its first ``lengths[b]``: split-KV over index positions,
each [BLOCK_N] block of indices loaded, its latent and rope rows gathered from the slot's cache, the partials
merged by ``kernels.mla``'s merge kernel. Prefill attends densely under a mask that keeps each query's top-k
(``selection_mask``; transformers' eager/sdpa path), a torch path on both backends as MLA prefill is.

The indexer's key cache here holds the activation dtype (fp32 in the parity tests: transformers' numbers
exactly), not the engines' fp8 + per-128 scales that ``formulas.dsa`` prices (``index_key_bytes``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name, next_pow2
from ._launch import launch
from .mla import LOG2E, merge_partials, mla_decode_config

INDEX_BLOCK_N = 64       # keys per program of the scores kernel


@triton.jit
def _index_scores_kernel(q_ptr, w_ptr, k_ptr, slot_ptr, lim_ptr, out_ptr, HI, D, scale,
                         stride_qt, stride_qh, stride_wt, stride_ks, stride_kn, stride_ot,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         DOT_PREC: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    nb = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    lim = tl.load(lim_ptr + t).to(tl.int32)
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    hmask = heads < HI
    dmask = offs_d < D
    nmask = offs_n < lim
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)            # [BLOCK_H, D]
    w = tl.load(w_ptr + t * stride_wt + heads, mask=hmask, other=0.0).to(tl.float32)       # [BLOCK_H]
    k = tl.load(k_ptr + slot * stride_ks + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)            # [BLOCK_N, D]
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale                          # [BLOCK_H, BLOCK_N]
    s = tl.maximum(s, 0.0)
    score = tl.sum(s * w[:, None], 0)
    score = tl.where(nmask, score, float("-inf"))
    tl.store(out_ptr + t * stride_ot + offs_n, score)                                     # the padded width


def _check_scores(q, w, k_cache, slots, limits):
    check_tensor("q", q, (None, None, None), dtypes=FLOAT_DTYPES + (torch.float64,))
    T, Hi, Di = q.shape
    check_tensor("w", w, (T, Hi), dtypes=(torch.float32, torch.float64), device=q.device)
    check_tensor("k_cache", k_cache, (None, None, Di), dtype=q.dtype, device=q.device)
    check_tensor("slots", slots, (T,), dtypes=(torch.int32, torch.int64), device=q.device)
    check_tensor("limits", limits, (T,), dtypes=(torch.int32, torch.int64), device=q.device)
    return T, Hi, Di


def index_scores(q: torch.Tensor, w: torch.Tensor, k_cache: torch.Tensor, slots: torch.Tensor,
                 limits: torch.Tensor, *, max_len: int, scale: float | None = None, out=None,
                 block_n: int | None = None) -> torch.Tensor:
    """scores [T, max_len] fp32 of T query rows (q [T, Hi, Di], w [T, Hi] fp32: weights_proj x Hi^-0.5) over
    the keys of their slots (k_cache [S, L, Di]), -inf at j >= limits[t]. ``scale``: Di^-0.5 by default."""
    T, Hi, Di = _check_scores(q, w, k_cache, slots, limits)
    if max_len > k_cache.shape[1]:
        raise ValueError(f"max_len {max_len} exceeds the indexer cache length {k_cache.shape[1]}.")
    bn = int(block_n or INDEX_BLOCK_N)
    width = cdiv(max_len, bn) * bn
    buf = torch.empty(T, width, dtype=torch.float32, device=q.device) if out is None else out
    check_tensor("out", buf, (T, width), dtype=torch.float32, device=q.device)
    if T and max_len:
        prec = "ieee" if (q.dtype == torch.float32 or INTERPRET) else "tf32"
        launch(_index_scores_kernel, (T, width // bn), q, w, k_cache, slots, limits, buf, Hi, Di,
               float(Di ** -0.5 if scale is None else scale), q.stride(0), q.stride(1), w.stride(0),
               k_cache.stride(0), k_cache.stride(1), buf.stride(0),
               BLOCK_H=max(16, next_pow2(Hi)), BLOCK_N=bn, BLOCK_D=max(16, next_pow2(Di)), DOT_PREC=prec,
               num_warps=4, num_stages=1)
    return buf[:, :max_len]


def scores_reference(q, w, k_cache, slots, limits, *, max_len: int, scale: float | None = None):
    """transformers' scores, batched in torch (fp32; fp64 for fp64): relu(q k^T scale), weighted by w and
    summed over the heads, -inf past each row's limit."""
    T, Hi, Di = _check_scores(q, w, k_cache, slots, limits)
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    k = k_cache[slots.long(), :max_len].to(ct)                                   # [T, S, Di]
    s = torch.relu(torch.matmul(q.to(ct), k.transpose(1, 2)) * (Di ** -0.5 if scale is None else scale))
    score = torch.matmul(w.to(ct)[:, None, :], s)[:, 0]                          # [T, S]
    keep = torch.arange(max_len, device=q.device)[None, :] < limits[:, None]
    return score.masked_fill(~keep, float("-inf")).float()


def index_topk(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, min(topk, keys)] int32 key indices of each row's highest scores (torch.topk's order); -1 where the
    row had fewer visible (finite) keys."""
    check_tensor("scores", scores, (None, None), dtype=torch.float32)
    k = min(int(topk), scores.shape[1])
    vals, idx = scores.topk(k, dim=-1)
    return idx.masked_fill(vals == float("-inf"), -1).to(torch.int32)


def selection_mask(indices: torch.Tensor, keys: int) -> torch.Tensor:
    """[T, keys] bool: True at the keys row t selected (indices -1 are none)."""
    keep = torch.zeros(indices.shape[0], keys + 1, dtype=torch.bool, device=indices.device)
    keep.scatter_(1, torch.where(indices < 0, keys, indices).long(), True)
    return keep[:, :keys]


# ---- sparse absorbed decode ---------------------------------------------------------------------------------

@triton.jit
def _mla_sparse_split_kernel(ql_ptr, qp_ptr, ckv_ptr, kpe_ptr, idx_ptr, slot_ptr, mid_o_ptr, mid_lse_ptr,
                             H, R, P, K, SPLIT_SIZE, qk_scale,
                             stride_qlb, stride_qlh, stride_qpb, stride_qph, stride_cs, stride_cn, stride_ps,
                             stride_pn, stride_ib, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                             BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_P: tl.constexpr, DOT_PREC: tl.constexpr):
    hb = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    lo = sp * SPLIT_SIZE
    hi = tl.minimum(lo + SPLIT_SIZE, K)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    hmask = heads < H
    rmask = offs_r < R
    pmask = offs_p < P
    ql = tl.load(ql_ptr + b.to(tl.int64) * stride_qlb + heads[:, None] * stride_qlh + offs_r[None, :],
                 mask=hmask[:, None] & rmask[None, :], other=0.0).to(tl.float32)   # [BLOCK_H, R]
    qp = tl.load(qp_ptr + b.to(tl.int64) * stride_qpb + heads[:, None] * stride_qph + offs_p[None, :],
                 mask=hmask[:, None] & pmask[None, :], other=0.0).to(tl.float32)   # [BLOCK_H, P]
    c_base = ckv_ptr + slot * stride_cs
    p_base = kpe_ptr + slot * stride_ps
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_R), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_i = start + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + b.to(tl.int64) * stride_ib + offs_i, mask=offs_i < hi, other=-1)
        nmask = idx >= 0
        rows = tl.where(nmask, idx, 0).to(tl.int64)                                # the selected latents
        kv = tl.load(c_base + rows[:, None] * stride_cn + offs_r[None, :],
                     mask=nmask[:, None] & rmask[None, :], other=0.0).to(tl.float32)   # [BLOCK_N, R]: K and V
        pe = tl.load(p_base + rows[:, None] * stride_pn + offs_p[None, :],
                     mask=nmask[:, None] & pmask[None, :], other=0.0).to(tl.float32)   # [BLOCK_N, P]
        s = tl.dot(ql, tl.trans(kv), input_precision=DOT_PREC)
        s = tl.dot(qp, tl.trans(pe), s, input_precision=DOT_PREC) * qk_scale      # [BLOCK_H, BLOCK_N]
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)                      # a block of no selection
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, kv, input_precision=DOT_PREC)
        m_i = m_new
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    mo = mid_o_ptr + b.to(tl.int64) * stride_mb + heads[:, None] * stride_mh + sp * stride_ms + offs_r[None, :]
    tl.store(mo, out, mask=hmask[:, None] & rmask[None, :])
    tl.store(mid_lse_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh + sp, lse, mask=hmask)


def _check_sparse(q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots):
    check_tensor("q_nope_latent", q_nope_latent, (None, None, None), dtypes=FLOAT_DTYPES + (torch.float64,))
    B, H, R = q_nope_latent.shape
    dev, dt = q_nope_latent.device, q_nope_latent.dtype
    check_tensor("q_pe", q_pe, (B, H, None), dtype=dt, device=dev)
    check_tensor("ckv_cache", ckv_cache, (None, None, R), dtype=dt, device=dev)
    S, L, _ = ckv_cache.shape
    check_tensor("kpe_cache", kpe_cache, (S, L, q_pe.shape[2]), dtype=dt, device=dev)
    check_tensor("indices", indices, (B, None), dtypes=(torch.int32, torch.int64), device=dev)
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=dev)
    return B, H, R, q_pe.shape[2], indices.shape[1]


def mla_sparse_decode(q_nope_latent: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor,
                      kpe_cache: torch.Tensor, indices: torch.Tensor, slots: torch.Tensor, *, sm_scale: float,
                      out=None, **config) -> torch.Tensor:
    """o_latent [B, H, R] = softmax over the selected latents of (q_lat . c_kv + q_pe . k_pe) * sm_scale, times
    c_kv: ``kernels.mla.mla_decode`` over the rows ``indices`` [B, K] (-1: none) of slot ``slots[b]``. A query
    with no selection gets zeros. ``config``: block_h, block_n, splits (``kernels.mla.mla_decode_config`` over K)."""
    B, H, R, P, K = _check_sparse(q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots)
    out = torch.empty_like(q_nope_latent) if out is None else out
    check_tensor("out", out, (B, H, R), dtype=q_nope_latent.dtype, device=q_nope_latent.device)
    if B == 0 or K == 0:
        return out.zero_() if B else out
    dt = q_nope_latent.dtype
    c = mla_decode_config(B, H, K, q_nope_latent.device, dtype=dt, **config)
    BR = max(16, next_pow2(R))
    mid_o = torch.empty(B, H, c["splits"], BR, dtype=torch.float32, device=q_nope_latent.device)
    mid_lse = torch.empty(B, H, c["splits"], dtype=torch.float32, device=q_nope_latent.device)
    prec = "ieee" if (dt == torch.float32 or INTERPRET) else "tf32"
    launch(_mla_sparse_split_kernel, (c["head_blocks"], c["splits"], B),
           q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots, mid_o, mid_lse, H, R, P, K, c["split_size"],
           float(sm_scale) * LOG2E, q_nope_latent.stride(0), q_nope_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
           ckv_cache.stride(0), ckv_cache.stride(1), kpe_cache.stride(0), kpe_cache.stride(1), indices.stride(0),
           mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
           BLOCK_H=c["block_h"], BLOCK_N=c["block_n"], BLOCK_R=BR, BLOCK_P=max(16, next_pow2(P)), DOT_PREC=prec,
           num_warps=c["num_warps"], num_stages=c["num_stages"])
    return merge_partials(mid_o, mid_lse, out)


def sparse_reference(q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots, *, sm_scale: float):
    """Plain torch, one sequence at a time, math in fp32 (fp64 for fp64): the selected rows gathered, then
    ``kernels.mla.reference``'s softmax over them (no selection: zeros)."""
    B, H, R, P, K = _check_sparse(q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots)
    ct = torch.float64 if q_nope_latent.dtype == torch.float64 else torch.float32
    outs = []
    for b in range(B):
        rows = indices[b][indices[b] >= 0].long()
        if rows.numel() == 0:
            outs.append(torch.zeros(H, R, dtype=ct, device=q_nope_latent.device))
            continue
        ckv, kpe = ckv_cache[int(slots[b]), rows].to(ct), kpe_cache[int(slots[b]), rows].to(ct)
        s = (q_nope_latent[b].to(ct) @ ckv.T + q_pe[b].to(ct) @ kpe.T) * sm_scale
        outs.append(s.softmax(-1) @ ckv)
    return torch.stack(outs).to(q_nope_latent.dtype)


def torch_sparse_decode(q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots, *, sm_scale: float):
    """The batched torch peer: every sequence's selected rows gathered at once ([B, K, R]), scores in fp32,
    the unselected (-1) masked."""
    B, H, R, P, K = _check_sparse(q_nope_latent, q_pe, ckv_cache, kpe_cache, indices, slots)
    keep = indices >= 0
    rows = torch.where(keep, indices, 0).long()
    sl = slots.long()[:, None]
    ckv, kpe = ckv_cache[sl, rows], kpe_cache[sl, rows]                          # [B, K, R], [B, K, P]
    s = (q_nope_latent @ ckv.transpose(1, 2) + q_pe @ kpe.transpose(1, 2)).float() * sm_scale   # [B, H, K]
    p = s.masked_fill(~keep[:, None, :], float("-inf")).softmax(-1).nan_to_num(0.0)
    return p.to(ckv.dtype) @ ckv


def scores_cost(batch: int, new_tokens: int, cached: int, n_heads: int, head_dim: int, dtype="bf16"):
    """formulas.index_scores (its bytes are the engines' fp8 key cache, not this module's activation-dtype one)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.index_scores(batch, new_tokens, cached, n_heads, head_dim, act_dtype=d)


def topk_cost(batch: int, new_tokens: int, cached: int, topk: int):
    """formulas.index_topk."""
    return F.index_topk(batch, new_tokens, cached, topk)


def cost(batch: int, kv_len: int, n_heads: int, kv_lora_rank: int, rope_dim: int, topk: int, dtype="bf16",
         kv_dtype=None):
    """formulas.mla_decode_attention with ``topk``: the sparse decode this module's kernel runs."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.mla_decode_attention(batch, kv_len, n_heads, kv_lora_rank, rope_dim, act_dtype=d,
                                  kv_dtype=kv_dtype or d, topk=topk)
