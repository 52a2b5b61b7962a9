"""Multi-head latent attention (DeepSeek-V2/V3): absorbed decode over the latent cache, naive prefill in torch.

The cache holds per token one latent c_kv [R] (kv_a_layernorm applied; R = kv_lora_rank) and one rope
key k_pe [P] (rope applied; P = qk_rope_head_dim), shared by every head: ckv_cache [S, L, R] and
kpe_cache [S, L, P] (S slots, L positions). transformers' DeepseekV3Attention expands them every step
(k_nope = c_kv W_UK^T, v = c_kv W_UV^T from kv_b_proj) and runs plain attention: the NAIVE form, which
this module keeps for prefill (``mla_prefill``: a torch path, stated, see below). Decode runs the
ABSORBED form: W_UK is folded into the query (q_latent = q_nope W_UK, ``absorb_query``) and W_UV applied
to the output (o = o_latent W_UV^T, ``unabsorb_output``), so the scores and the output live in the
latent space and the cache is read as it is:

    o_latent[b, h] = softmax((q_latent[b, h] . c_kv[j] + q_pe[b, h] . k_pe[j]) * sm_scale) @ c_kv  (j < len)

Decode kernel (split-KV, as ``kernels.decode_attention``): stage 1, grid (head blocks, splits, B), a
program holds BLOCK_H (>= 16, so tl.dot is legal) heads of one sequence as the rows of its tiles and
streams its split's keys; each [BLOCK_N, R] latent tile is loaded ONCE and used twice (as K for the
scores, as V for the output), with its [BLOCK_N, P] rope tile. All heads of a sequence share the tile:
with H > BLOCK_H the head blocks of one (split, sequence) are adjacent in launch order (axis 0), so they
run together and the tile comes from DRAM once per sequence, then L2 (the formula's convention).
Stage 2, grid (B, H): merges the splits' partials over rank chunks of ``MERGE_BLOCK_R`` (a whole
512-wide rank times 64 splits would not fit registers).

Tiles (``mla_decode_config``): 16-bit dtypes BLOCK_H 16 (the [16, 512] fp32 accumulator is 64 registers
per thread at 4 warps), BLOCK_N 32, 4 warps, 2 stages; fp32 (IEEE FMA dots) BLOCK_N 16 and 8 warps.
The compile check covers DeepSeek-V3's shapes (H 128, R 512, P 64) in bf16 and fp16 on sm_80 / sm_90: the
split kernel takes 128 registers and 55 KB of shared memory with no spills (2 resident programs per SM on
sm_80, bound by shared memory; 4 on sm_90), so the rank need not be split across the loop.

Quantized weights (``kernels.quant``): prefill's up-projection runs kv_b_proj as a quantized linear; absorbed
decode uses the per-head W_UK / W_UV as einsum operands, not as a linear, so it reads a copy of kv_b_proj
dequantized ONCE at load into the activation dtype (``kernels.quant.absorbed_kv_b``, as vLLM does): the same
values, read in the activation dtype every step (``roofline.workload`` charges decode's "mla_up" so).

Prefill: ``kernels.prefill_attention`` needs V's head dim equal to Q/K's (its v_cache has k_cache's
shape; MLA has q/k 192 and v 128 per head), so MLA prefill is the torch path ``mla_prefill`` (SDPA,
which takes a different V dim) with the fp32 loop ``mla_prefill_reference`` beside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name, next_pow2, num_sms, slot_rows
from ._launch import launch

LOG2E = 1.4426950408889634


@triton.jit
def _mla_decode_split_kernel(ql_ptr, qp_ptr, ckv_ptr, kpe_ptr, len_ptr, slot_ptr, mid_o_ptr, mid_lse_ptr,
                             H, R, P, SPLIT_SIZE, qk_scale,
                             stride_qlb, stride_qlh, stride_qpb, stride_qph, stride_cs, stride_cn, stride_ps,
                             stride_pn, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                             BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_P: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr):
    hb = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2)
    seq_len = tl.load(len_ptr + b).to(tl.int32)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    lo = sp * SPLIT_SIZE
    hi = tl.minimum(lo + SPLIT_SIZE, seq_len)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    hmask = heads < H
    rmask = offs_r < R
    pmask = offs_p < P
    ql = tl.load(ql_ptr + b.to(tl.int64) * stride_qlb + heads[:, None] * stride_qlh + offs_r[None, :],
                 mask=hmask[:, None] & rmask[None, :], other=0.0)                  # [BLOCK_H, R]
    qp = tl.load(qp_ptr + b.to(tl.int64) * stride_qpb + heads[:, None] * stride_qph + offs_p[None, :],
                 mask=hmask[:, None] & pmask[None, :], other=0.0)                  # [BLOCK_H, P]
    if UPCAST:
        ql = ql.to(tl.float32)
        qp = qp.to(tl.float32)
    c_base = ckv_ptr + slot * stride_cs
    p_base = kpe_ptr + slot * stride_ps
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_R), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        kv = tl.load(c_base + offs_n[:, None].to(tl.int64) * stride_cn + offs_r[None, :],
                     mask=nmask[:, None] & rmask[None, :], other=0.0)              # [BLOCK_N, R]: K and V
        pe = tl.load(p_base + offs_n[:, None].to(tl.int64) * stride_pn + offs_p[None, :],
                     mask=nmask[:, None] & pmask[None, :], other=0.0)              # [BLOCK_N, P]
        if UPCAST:
            kv = kv.to(tl.float32)
            pe = pe.to(tl.float32)
        s = tl.dot(ql, tl.trans(kv), input_precision=DOT_PREC)
        s = tl.dot(qp, tl.trans(pe), s, input_precision=DOT_PREC) * qk_scale      # [BLOCK_H, BLOCK_N]
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv, input_precision=DOT_PREC)
        m_i = m_new
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    mo = mid_o_ptr + b.to(tl.int64) * stride_mb + heads[:, None] * stride_mh + sp * stride_ms + offs_r[None, :]
    tl.store(mo, out, mask=hmask[:, None] & rmask[None, :])
    tl.store(mid_lse_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh + sp, lse, mask=hmask)


@triton.jit
def _mla_decode_merge_kernel(mid_o_ptr, mid_lse_ptr, o_ptr, R, SPLITS,
                             stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                             BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    smask = offs_s < SPLITS
    lse = tl.load(mid_lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)                                       # length 0: every split empty
    w = tl.math.exp2(lse - m)                                                      # 0 for empty splits
    den = tl.sum(w, 0)
    den = tl.where(den > 0, den, 1.0)                                              # zeros, not 0/0
    for r0 in range(0, R, BLOCK_R):                                                # the rank in chunks
        offs_r = r0 + tl.arange(0, BLOCK_R)
        part = tl.load(mid_o_ptr + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_r[None, :],
                       mask=smask[:, None] & (offs_r[None, :] < R), other=0.0)
        o = tl.sum(part * w[:, None], 0) / den
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_r, o.to(o_ptr.dtype.element_ty), mask=offs_r < R)


MLA_BLOCKS_PER_SM = 4    # resident split programs per SM aimed at, as decode attention
MAX_SPLITS = 64
MERGE_BLOCK_R = 128      # rank chunk of the merge: [64 splits, 128] fp32 = 64 registers per thread at 4 warps


def mla_decode_config(batch: int, n_heads: int, max_len: int, device="cpu", *, dtype=torch.bfloat16,
                      block_h=None, block_n=None, splits=None) -> dict:
    """Head block, key tile and split count: BLOCK_H 16 heads, 32-key tiles, 4 warps (fp32: 16-key tiles, 8
    warps); ``MLA_BLOCKS_PER_SM`` x SMs programs over (head blocks, splits, batch), each split >= 1 key tile,
    at most 64 splits."""
    for name, v in (("block_h", block_h), ("block_n", block_n)):
        if v is not None and (int(v) < 16 or int(v) & (int(v) - 1)):
            raise ValueError(f"{name} must be a power of two of at least 16 (tl.dot needs operands of 16 or more "
                             f"on a GPU), got {v}.")
    fp32 = dtype == torch.float32
    bh = int(block_h or 16)
    bn = int(block_n or (16 if fp32 else 32))
    head_blocks = cdiv(n_heads, bh)
    if splits is None:
        want = cdiv(MLA_BLOCKS_PER_SM * num_sms(device), max(1, batch * head_blocks))
        splits = max(1, min(want, cdiv(max_len, bn), MAX_SPLITS))
    splits = max(1, min(int(splits), cdiv(max_len, bn)))
    split_size = cdiv(cdiv(max_len, splits), bn) * bn
    splits = cdiv(max_len, split_size)
    return dict(block_h=bh, block_n=bn, splits=splits, split_size=split_size, head_blocks=head_blocks,
                num_warps=8 if fp32 else 4, num_stages=2, programs=batch * head_blocks * splits)


def _check(q_nope_latent, q_pe, ckv_cache, kpe_cache, lengths, slots):
    check_tensor("q_nope_latent", q_nope_latent, (None, None, None), dtypes=FLOAT_DTYPES)
    B, H, R = q_nope_latent.shape
    dev, dt = q_nope_latent.device, q_nope_latent.dtype
    check_tensor("q_pe", q_pe, (B, H, None), dtype=dt, device=dev)
    P = q_pe.shape[2]
    check_tensor("ckv_cache", ckv_cache, (None, None, R), dtype=dt, device=dev)
    S, L, _ = ckv_cache.shape
    check_tensor("kpe_cache", kpe_cache, (S, L, P), dtype=dt, device=dev)
    check_tensor("lengths", lengths, (B,), dtypes=(torch.int32, torch.int64), device=dev)
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=dev)
    return B, H, R, P, L


def mla_decode(q_nope_latent: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
               lengths: torch.Tensor, slots: torch.Tensor, *, sm_scale: float, max_len: int | None = None, out=None,
               **config) -> torch.Tensor:
    """o_latent [B, H, R] = softmax((q_lat . c_kv + q_pe . k_pe) * sm_scale) @ c_kv over each sequence's
    ``lengths[b]`` cached latents (rows of slot ``slots[b]``; the new token already appended).

    q_nope_latent [B, H, R] (q_nope times W_UK: absorbed), q_pe [B, H, P] (rope applied), ckv_cache
    [S, L, R], kpe_cache [S, L, P], all one float dtype. ``sm_scale``: DeepSeek's 1/sqrt(nope + rope)
    (times yarn's mscale^2), not derivable from R. ``max_len`` (the largest length) avoids a device sync.
    A sequence of length 0 gets zeros. ``config``: block_h, block_n, splits (``mla_decode_config``).
    """
    B, H, R, P, L = _check(q_nope_latent, q_pe, ckv_cache, kpe_cache, lengths, slots)
    if max_len is None:
        max_len = int(lengths.max().item()) if B else 0
    if max_len > L:
        raise ValueError(f"lengths up to {max_len} exceed the cache length {L}.")
    out = torch.empty_like(q_nope_latent) if out is None else out
    check_tensor("out", out, (B, H, R), dtype=q_nope_latent.dtype, device=q_nope_latent.device)
    if B == 0 or max_len == 0:
        return out.zero_() if B else out
    dt = q_nope_latent.dtype
    c = mla_decode_config(B, H, max_len, q_nope_latent.device, dtype=dt, **config)
    BR = max(16, next_pow2(R))
    mid_o = torch.empty(B, H, c["splits"], BR, dtype=torch.float32, device=q_nope_latent.device)
    mid_lse = torch.empty(B, H, c["splits"], dtype=torch.float32, device=q_nope_latent.device)
    prec = "ieee" if (dt == torch.float32 or INTERPRET) else "tf32"
    launch(_mla_decode_split_kernel, (c["head_blocks"], c["splits"], B),
           q_nope_latent, q_pe, ckv_cache, kpe_cache, lengths, slots, mid_o, mid_lse, H, R, P, c["split_size"],
           float(sm_scale) * LOG2E, q_nope_latent.stride(0), q_nope_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
           ckv_cache.stride(0), ckv_cache.stride(1), kpe_cache.stride(0), kpe_cache.stride(1),
           mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
           BLOCK_H=c["block_h"], BLOCK_N=c["block_n"], BLOCK_R=BR, BLOCK_P=max(16, next_pow2(P)), UPCAST=INTERPRET,
           DOT_PREC=prec, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return merge_partials(mid_o, mid_lse, out)


def merge_partials(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Stage 2: out [B, H, R] from the splits' partial outputs mid_o [B, H, splits, >= R] (fp32) and their base-2
    log-sum-exps mid_lse [B, H, splits] (also ``kernels.dsa``'s sparse decode)."""
    B, H, R = out.shape
    launch(_mla_decode_merge_kernel, (B, H), mid_o, mid_lse, out, R, mid_o.shape[2], mid_o.stride(0), mid_o.stride(1),
           mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1),
           BLOCK_S=max(2, next_pow2(mid_o.shape[2])), BLOCK_R=min(MERGE_BLOCK_R, max(16, next_pow2(R))))
    return out


def reference(q_nope_latent, q_pe, ckv_cache, kpe_cache, lengths, slots, *, sm_scale: float):
    """Plain torch, one sequence at a time (ragged lengths; length 0 gives zeros), math in fp32 (fp64 for
    fp64): scores c_kv q_lat + k_pe q_pe per head, softmax over the keys, probabilities times c_kv."""
    B, H, R = q_nope_latent.shape
    ct = torch.float64 if q_nope_latent.dtype == torch.float64 else torch.float32
    outs = []
    for b in range(B):
        n, sl = int(lengths[b]), int(slots[b])
        if n == 0:
            outs.append(torch.zeros(H, R, dtype=ct, device=q_nope_latent.device))
            continue
        ckv, kpe = ckv_cache[sl, :n].to(ct), kpe_cache[sl, :n].to(ct)                 # [n, R], [n, P]
        s = (q_nope_latent[b].to(ct) @ ckv.T + q_pe[b].to(ct) @ kpe.T) * sm_scale      # [H, n]
        outs.append(s.softmax(-1) @ ckv)                                               # [H, R]
    return torch.stack(outs).to(q_nope_latent.dtype)


def torch_decode(q_nope_latent, q_pe, ckv_cache, kpe_cache, lengths, slots, *, sm_scale: float, max_len=None):
    """The batched torch peer: the heads of a sequence are the rows of one matmul against its latent rows
    (read as a view when ``slots`` are 0..B-1: ``slot_rows``), scores in fp32, masked to each length."""
    B, H, R = q_nope_latent.shape
    S = max_len if max_len is not None else (int(lengths.max()) if B else 0)
    ckv = slot_rows(ckv_cache[:, None], slots, S)[:, 0]                               # [B, S, R]
    kpe = slot_rows(kpe_cache[:, None], slots, S)[:, 0]                               # [B, S, P]
    s = (q_nope_latent @ ckv.transpose(1, 2) + q_pe @ kpe.transpose(1, 2)).float() * sm_scale   # [B, H, S]
    keep = torch.arange(S, device=q_nope_latent.device)[None, :] < lengths[:, None]
    p = s.masked_fill(~keep[:, None, :], float("-inf")).softmax(-1).nan_to_num(0.0)   # length 0: zeros
    return p.to(ckv.dtype) @ ckv


# ---- absorption (torch): transformers' kv_b_proj split into the per-head W_UK and W_UV ----------------------

def split_kv_b(weight: torch.Tensor, n_heads: int, nope_dim: int, v_dim: int) -> tuple:
    """kv_b_proj's weight [H * (nope + v), R] (nn.Linear layout, as transformers stores it) as
    (W_UK [H, nope, R], W_UV [H, v, R]): head h's rows are its nope key dims, then its value dims."""
    check_tensor("kv_b_proj weight", weight, (n_heads * (nope_dim + v_dim), None))
    w = weight.view(n_heads, nope_dim + v_dim, weight.shape[1])
    return w[:, :nope_dim], w[:, nope_dim:]


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_latent [B, H, R] = q_nope [B, H, nope] times W_UK [H, nope, R], per head (k_nope = c_kv W_UK^T, so
    q_nope . k_nope = q_latent . c_kv): 2*B*H*nope*R FLOPs (``formulas.mla_absorb_flops``' first half)."""
    return torch.einsum("bhn,hnr->bhr", q_nope, w_uk)


def unabsorb_output(o_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o [B, H, v] = o_latent [B, H, R] times W_UV^T per head (p @ (c_kv W_UV^T) = (p @ c_kv) W_UV^T)."""
    return torch.einsum("bhr,hvr->bhv", o_latent, w_uv)


# ---- prefill: the naive form, a torch path -----------------------------------------------------------------

def mla_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sm_scale: float, cached: int = 0,
                causal: bool = True, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Naive MLA prefill, a TORCH path (SDPA): q [B, n, H, nope + rope] at positions cached..cached+n-1,
    k [B, cached + n, H, nope + rope] and v [B, cached + n, H, v_dim] (the latents up-projected by kv_b_proj,
    k_pe broadcast to every head); o [B, n, H, v_dim]. ``kernels.prefill_attention`` is not used: its V must
    have Q/K's head dim. ``keep`` [B, n, cached + n] bool: the keys each query may see besides causality
    (DeepSeek Sparse Attention's top-k: ``kernels.dsa.selection_mask``; each row keeps at least its diagonal)."""
    B, n, H, D = _check_prefill(q, k, v, cached)
    qq, kk, vv = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kw = dict(scale=float(sm_scale))
    if keep is not None:
        check_tensor("keep", keep, (B, n, cached + n), dtype=torch.bool, device=q.device)
        kw["attn_mask"] = (keep & _visible(cached, n, q.device) if causal else keep)[:, None]
    elif causal and cached:
        kw["attn_mask"] = _visible(cached, n, q.device)
    else:
        kw["is_causal"] = causal
    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, **kw).transpose(1, 2)


def mla_prefill_reference(q, k, v, *, sm_scale: float, cached: int = 0, causal: bool = True):
    """``mla_prefill`` by explicit matmuls, math in fp32 (fp64 for fp64)."""
    B, n, H, D = _check_prefill(q, k, v, cached)
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = q.to(ct).transpose(1, 2) @ k.to(ct).permute(0, 2, 3, 1) * sm_scale           # [B, H, n, cached + n]
    if causal:
        s = s.masked_fill(~_visible(cached, n, q.device), float("-inf"))
    return (s.softmax(-1) @ v.to(ct).transpose(1, 2)).transpose(1, 2).to(q.dtype)    # [B, n, H, v_dim]


def _visible(cached: int, n: int, device) -> torch.Tensor:
    """[n, cached + n] bool: query i (position cached + i) sees keys j <= cached + i."""
    return torch.arange(cached + n, device=device)[None, :] <= cached + torch.arange(n, device=device)[:, None]


def _check_prefill(q, k, v, cached):
    check_tensor("q", q, (None, None, None, None), dtypes=FLOAT_DTYPES + (torch.float64,))   # fp64: references
    B, n, H, D = q.shape
    if cached < 0:
        raise ValueError(f"cached must be 0 or more tokens, got {cached}.")
    check_tensor("k", k, (B, cached + n, H, D), dtype=q.dtype, device=q.device)
    check_tensor("v", v, (B, cached + n, H, None), dtype=q.dtype, device=q.device)
    return B, n, H, D


def cost(batch: int, kv_len: int, n_heads: int, kv_lora_rank: int, rope_dim: int, dtype="bf16", kv_dtype=None):
    """formulas.mla_decode_attention: the absorbed decode this module's kernel runs."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.mla_decode_attention(batch, kv_len, n_heads, kv_lora_rank, rope_dim, act_dtype=d,
                                  kv_dtype=kv_dtype or d)


def prefill_cost(batch: int, new_tokens: int, n_heads: int, nope_dim: int, rope_dim: int, v_dim: int, *,
                 cached: int = 0, kv_lora_rank: int | None = None, causal: bool = True, dtype="bf16", kv_dtype=None):
    """formulas.mla_prefill_attention: the naive prefill ``mla_prefill`` runs."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.mla_prefill_attention(batch, new_tokens, n_heads, nope_dim, rope_dim, v_dim, cached_tokens=cached,
                                   kv_lora_rank=kv_lora_rank, causal=causal, act_dtype=d, kv_dtype=kv_dtype or d)
