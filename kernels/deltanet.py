"""Gated DeltaNet (Qwen3-Next, Qwen3.5): the gates, the chunked gated delta rule (prefill) and its recurrent step
(decode), the gated RMSNorm; and the gated attention's x * sigmoid(gate). Its short causal conv1d over q, k, v with
the conv state is ``kernels.conv1d``'s (Mamba-2's too: no bias here).

Shapes (one layer): q, k [B, T, Hk, dk], v [B, T, Hv, dv] (each q/k head serves Hv / Hk consecutive value heads,
as transformers' repeat_interleave); g (the decay, log space, fp32) and beta [B, T, Hv]. A sequence's recurrent
state is ``state[slots[b]]`` of state [S, Hv, dk, dv] fp32 (read once when the sequence has one, written once per
call); its conv state ``conv_state[slots[b]]`` [S, C, kernel - 1] (the last kernel - 1 inputs of the C = 2 Hk dk +
Hv dv channels, activation dtype), read and rewritten by every call (a fresh sequence's: zeros, the caller's).

Kernels (every load upcast to fp32, fp32 math, one cast at each store):

* The chunked rule in chunks of ``chunk`` tokens (``formulas.DELTA_CHUNK`` = 64: the formula's convention and
  FLA's), transformers' ``torch_chunk_gated_delta_rule`` step by step (the last partial chunk padded with zeros as
  it pads), in two kernels (one held every [chunk, dk] tile at once and spilled: the compile check):
  ``_chunk_prep_kernel``, grid (B, Hv, chunks), every chunk at once: k l2-normalised, the cumulative decay g_cum,
  A = (beta k) k^T x decay (strictly lower), T = (I + A)^-1 by forward substitution (row by row, in registers),
  w = T (beta k exp(g_cum)) and u = T (beta v), written to fp32 scratch ([B, Hv, chunks x chunk, dk / dv]: HBM
  traffic the formula does not count); ``_chunk_kernel``, grid (B, Hv, cdiv(dv, BLOCK_V)): one program scans its
  sequence's chunks with a [dk, BLOCK_V] slice of the state in registers: v_new = u - w S,
  o = (q exp(g_cum)) S + (q k^T x decay, causal) v_new (q l2-normalised, x dk^-0.5), and
  S <- S exp(g_last) + (k exp(g_last - g_cum))^T v_new.
* ``_recurrent_kernel``, grid (B, Hv, cdiv(dv, BLOCK_V)): one token per sequence; the state slice read once,
  decayed, updated by the delta rule, read by q, written once (``torch_recurrent_gated_delta_rule``).
* ``_gates_kernel`` (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)), ``_gated_norm_kernel``
  (rmsnorm(x) w x silu(z), one row per token and value head), ``_sigmoid_gate_kernel``.

The torch references (``chunk_reference``, ``recurrent_reference``, ...) are transformers 5.24's
torch fallbacks (modeling_qwen3_next.py: ``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``,
``Qwen3NextRMSNormGated``) with the slot states gathered and scattered around them:
the torch backend runs them. ``*_cost`` are ``roofline.formulas.deltanet``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as Fn
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name, next_pow2
from ._launch import launch

L2_EPS = 1e-6   # transformers' (and FLA's) l2norm eps of q and k


@triton.jit
def _l2norm_rows(x, eps):
    return x / tl.sqrt(tl.sum(x * x, 1) + eps)[:, None]


@triton.jit
def _chunk_prep_kernel(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, T, GROUP, DK, DV, eps,
                       sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sg_b, sg_t, sw_b, sw_h, sw_t, su_b, su_h, su_t,
                       CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PREC: tl.constexpr):
    """One chunk of one sequence and value head: T = (I + A)^-1, w = T (beta k exp(g_cum)), u = T (beta v)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    t0 = tl.program_id(2) * CHUNK
    offs_c = tl.arange(0, CHUNK)
    offs_k = tl.arange(0, BLOCK_K)
    t = t0 + offs_c
    tmask = t < T
    kmask = offs_k < DK
    k = tl.load(k_ptr + b * sk_b + (h // GROUP) * sk_h + t[:, None] * sk_t + offs_k[None, :],
                mask=tmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
    g = tl.load(g_ptr + b * sg_b + h + t * sg_t, mask=tmask, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + b * sg_b + h + t * sg_t, mask=tmask, other=0.0).to(tl.float32)
    k = _l2norm_rows(k, eps)
    gc = tl.cumsum(g, 0)
    rows = offs_c[:, None]
    strict = rows > offs_c[None, :]
    kb = k * beta[:, None]
    A = tl.dot(kb, tl.trans(k), input_precision=DOT_PREC) * tl.exp(tl.where(strict, gc[:, None] - gc[None, :], 0.0))
    A = tl.where(strict, A, 0.0)
    Tm = tl.where(rows == offs_c[None, :], 1.0, 0.0)                # (I + A)^-1, row i from rows 0..i-1
    for i in range(1, CHUNK):
        a_i = tl.sum(tl.where(rows == i, A, 0.0), 0)                                    # A[i, :]
        r_i = tl.sum(a_i[:, None] * Tm, 0)                                              # sum_j A[i, j] Tm[j, :]
        Tm = tl.where(rows == i, Tm - r_i[None, :], Tm)
    w = tl.dot(Tm, kb * tl.exp(gc)[:, None], input_precision=DOT_PREC)                 # [CHUNK, BLOCK_K]
    tl.store(w_ptr + b * sw_b + h * sw_h + t[:, None] * sw_t + offs_k[None, :], w, mask=kmask[None, :])
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        vmask = offs_v < DV
        v = tl.load(v_ptr + b * sv_b + h * sv_h + t[:, None] * sv_t + offs_v[None, :],
                    mask=tmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        u = tl.dot(Tm, v * beta[:, None], input_precision=DOT_PREC)                    # [CHUNK, BLOCK_V]
        tl.store(u_ptr + b * su_b + h * su_h + t[:, None] * su_t + offs_v[None, :], u, mask=vmask[None, :])


@triton.jit
def _chunk_kernel(q_ptr, k_ptr, g_ptr, w_ptr, u_ptr, o_ptr, s_ptr, slot_ptr, T, GROUP, DK, DV, scale, eps,
                  sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sg_b, sg_t, sw_b, sw_h, sw_t, su_b, su_h, su_t,
                  so_b, so_t, so_h, ss_s, ss_h, ss_k,
                  CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, HAS_STATE: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    """The scan over one sequence's chunks for one value head and value block, the state slice in registers."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = h // GROUP
    slot = tl.load(slot_ptr + b).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = offs_k < DK
    vmask = offs_v < DV
    s_ptrs = s_ptr + slot * ss_s + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :]
    smask = kmask[:, None] & vmask[None, :]
    if HAS_STATE:
        S = tl.load(s_ptrs, mask=smask, other=0.0).to(tl.float32)                      # [BLOCK_K, BLOCK_V]
    else:
        S = tl.zeros((BLOCK_K, BLOCK_V), tl.float32)
    causal = offs_c[:, None] >= offs_c[None, :]
    q_base = q_ptr + b.to(tl.int64) * sq_b + kh * sq_h
    k_base = k_ptr + b.to(tl.int64) * sk_b + kh * sk_h
    g_base = g_ptr + b.to(tl.int64) * sg_b + h
    w_base = w_ptr + b.to(tl.int64) * sw_b + h * sw_h
    u_base = u_ptr + b.to(tl.int64) * su_b + h * su_h
    o_base = o_ptr + b.to(tl.int64) * so_b + h * so_h
    for start in range(0, T, CHUNK):
        t = start + offs_c
        tmask = t < T
        qk_mask = tmask[:, None] & kmask[None, :]
        g = tl.load(g_base + t * sg_t, mask=tmask, other=0.0).to(tl.float32)
        gc = tl.cumsum(g, 0)                                                            # [CHUNK]
        w = tl.load(w_base + t[:, None] * sw_t + offs_k[None, :], mask=kmask[None, :], other=0.0)
        u = tl.load(u_base + t[:, None] * su_t + offs_v[None, :], mask=vmask[None, :], other=0.0)
        vn = u - tl.dot(w, S, input_precision=DOT_PREC)                                # v_new [CHUNK, BLOCK_V]
        q = tl.load(q_base + t[:, None] * sq_t + offs_k[None, :], mask=qk_mask, other=0.0).to(tl.float32)
        k = tl.load(k_base + t[:, None] * sk_t + offs_k[None, :], mask=qk_mask, other=0.0).to(tl.float32)
        q = _l2norm_rows(q, eps) * scale
        k = _l2norm_rows(k, eps)
        attn = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * tl.exp(tl.where(causal, gc[:, None] - gc[None, :],
                                                                                    0.0))
        attn = tl.where(causal, attn, 0.0)
        o = tl.dot(q * tl.exp(gc)[:, None], S, input_precision=DOT_PREC) + tl.dot(attn, vn, input_precision=DOT_PREC)
        tl.store(o_base + t[:, None] * so_t + offs_v[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=tmask[:, None] & vmask[None, :])
        glast = tl.sum(tl.where(offs_c == CHUNK - 1, gc, 0.0), 0)     # padded g are 0: the last real token's
        kd = k * tl.exp(glast - gc)[:, None]
        S = S * tl.exp(glast) + tl.dot(tl.trans(kd), vn, input_precision=DOT_PREC)
    tl.store(s_ptrs, S, mask=smask)


@triton.jit
def _recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, s_ptr, slot_ptr, GROUP, DK, DV, scale, eps,
                      sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, so_b, so_h, ss_s, ss_h, ss_k,
                      BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = h // GROUP
    slot = tl.load(slot_ptr + b).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = offs_k < DK
    vmask = offs_v < DV
    q = tl.load(q_ptr + b * sq_b + kh * sq_h + offs_k, mask=kmask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * sk_b + kh * sk_h + offs_k, mask=kmask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v, mask=vmask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + b * sg_b + h).to(tl.float32)
    beta = tl.load(b_ptr + b * sg_b + h).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, 0) + eps) * scale
    k = k / tl.sqrt(tl.sum(k * k, 0) + eps)
    s_ptrs = s_ptr + slot * ss_s + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :]
    smask = kmask[:, None] & vmask[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0).to(tl.float32) * tl.exp(g)              # [BLOCK_K, BLOCK_V]
    delta = (v - tl.sum(S * k[:, None], 0)) * beta
    S = S + k[:, None] * delta[None, :]
    o = tl.sum(S * q[:, None], 0)
    tl.store(o_ptr + b * so_b + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty), mask=vmask)
    tl.store(s_ptrs, S, mask=smask)


@triton.jit
def _gates_kernel(a_ptr, b_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, N, HV, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N * HV
    h = offs % HV
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x = a + tl.load(dt_ptr + h, mask=mask, other=0.0).to(tl.float32)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))       # softplus (torch's threshold 20)
    g = -tl.exp(tl.load(alog_ptr + h, mask=mask, other=0.0).to(tl.float32)) * sp
    tl.store(g_ptr + offs, g, mask=mask)
    tl.store(beta_ptr + offs, (1.0 / (1.0 + tl.exp(-bb))).to(beta_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, D, sx, sz, sy, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * sx + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * sz + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    n = (x / tl.sqrt(tl.sum(x * x, 0) / D + eps)).to(y_ptr.dtype.element_ty).to(tl.float32)
    n = (w * n).to(y_ptr.dtype.element_ty).to(tl.float32)         # transformers: weight x norm in the input dtype
    tl.store(y_ptr + row * sy + offs, (n * (z / (1.0 + tl.exp(-z)))).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sigmoid_gate_kernel(x_ptr, g_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty), mask=mask)


# ---- launchers -----------------------------------------------------------------------------------------------

def _prec(dt) -> str:
    return "ieee" if (dt == torch.float32 or INTERPRET) else "tf32"


def _check_delta(q, k, v, g, beta, state, slots, T=None):
    """(B, Hk, Hv, dk, dv) after checking the shapes (T given: q [B, T, Hk, dk]; None: [B, Hk, dk])."""
    lead = (None,) if T is None else (None, T)
    check_tensor("q", q, lead + (None, None), dtypes=FLOAT_DTYPES)
    B, Hk, dk = q.shape[0], q.shape[-2], q.shape[-1]
    lead = (B,) if T is None else (B, T)
    check_tensor("k", k, lead + (Hk, dk), dtype=q.dtype, device=q.device)
    check_tensor("v", v, lead + (None, None), dtype=q.dtype, device=q.device)
    Hv, dv = v.shape[-2], v.shape[-1]
    if Hv % Hk:
        raise ValueError(f"v's heads ({Hv}) must be a multiple of q/k's heads ({Hk}).")
    check_tensor("g", g, lead + (Hv,), dtype=torch.float32, device=q.device)
    check_tensor("beta", beta, lead + (Hv,), dtypes=FLOAT_DTYPES, device=q.device)
    check_tensor("state", state, (None, Hv, dk, dv), dtype=torch.float32, device=q.device)
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=q.device)
    return B, Hk, Hv, dk, dv


def delta_config(dk: int, dv: int, *, chunk: int = F.DELTA_CHUNK, dtype=torch.bfloat16) -> dict:
    """Block sizes of the chunked kernels: the whole key width (l2-normalised in the kernel), value blocks of
    up to 32 (the state slice [dk, 32] fp32 beside the chunk's [chunk, dk] tiles), 8 warps for the [chunk, chunk]
    tiles (16 in fp32, whose IEEE dots are FMA loops: the compile check), one stage: the scan's loop is not
    software-pipelined (three stages of its [chunk, dk] tiles passed sm_90's shared memory)."""
    return dict(block_k=max(16, next_pow2(dk)), block_v=max(16, min(32, next_pow2(dv))), chunk=chunk,
                num_warps=(16 if dtype == torch.float32 else 8) if chunk >= 64 else 4, num_stages=1)


def gated_delta_prefill(q, k, v, g, beta, state, slots, *, has_state: bool = False, chunk: int = F.DELTA_CHUNK,
                        out=None) -> torch.Tensor:
    """o [B, T, Hv, dv] of the chunked gated delta rule (q, k l2-normalised here, q x dk^-0.5); each sequence's
    state ``state[slots[b]]`` read first when ``has_state`` (zeros otherwise) and overwritten by its final state."""
    check_tensor("q", q, (None, None, None, None), dtypes=FLOAT_DTYPES)
    B, Hk, Hv, dk, dv = _check_delta(q, k, v, g, beta, state, slots, T=q.shape[1])
    T = q.shape[1]
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two of at least 16 (tl.dot's operands), got {chunk}.")
    out = torch.empty(B, T, Hv, dv, dtype=q.dtype, device=q.device) if out is None else out
    check_tensor("out", out, (B, T, Hv, dv), dtype=q.dtype)
    c = delta_config(dk, dv, chunk=chunk, dtype=q.dtype)
    if B == 0 or T == 0:
        return out
    n_chunks, prec = cdiv(T, chunk), _prec(q.dtype)
    w = torch.empty(B, Hv, n_chunks * chunk, dk, dtype=torch.float32, device=q.device)    # the chunks' w and u
    u = torch.empty(B, Hv, n_chunks * chunk, dv, dtype=torch.float32, device=q.device)
    strides = (k.stride(0), k.stride(1), k.stride(2))
    ws, us = (w.stride(0), w.stride(1), w.stride(2)), (u.stride(0), u.stride(1), u.stride(2))
    launch(_chunk_prep_kernel, (B, Hv, n_chunks), k, v, g, beta, w, u, T, Hv // Hk, dk, dv, L2_EPS, *strides,
           v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), *ws, *us,
           CHUNK=chunk, BLOCK_K=c["block_k"], BLOCK_V=c["block_v"], DOT_PREC=prec, num_warps=c["num_warps"],
           num_stages=c["num_stages"])
    launch(_chunk_kernel, (B, Hv, cdiv(dv, c["block_v"])), q, k, g, w, u, out, state, slots, T, Hv // Hk, dk, dv,
           dk ** -0.5, L2_EPS, q.stride(0), q.stride(1), q.stride(2), *strides, g.stride(0), g.stride(1), *ws, *us,
           out.stride(0), out.stride(1), out.stride(2), state.stride(0), state.stride(1), state.stride(2),
           CHUNK=chunk, BLOCK_K=c["block_k"], BLOCK_V=c["block_v"], HAS_STATE=bool(has_state), DOT_PREC=prec,
           num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


def gated_delta_decode(q, k, v, g, beta, state, slots, *, out=None) -> torch.Tensor:
    """o [B, Hv, dv]: one recurrent step per sequence (q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv]); the
    state slice is read once and written once."""
    B, Hk, Hv, dk, dv = _check_delta(q, k, v, g, beta, state, slots)
    out = torch.empty(B, Hv, dv, dtype=q.dtype, device=q.device) if out is None else out
    check_tensor("out", out, (B, Hv, dv), dtype=q.dtype)
    c = delta_config(dk, dv)
    if B:
        launch(_recurrent_kernel, (B, Hv, cdiv(dv, c["block_v"])), q, k, v, g, beta, out, state, slots, Hv // Hk,
               dk, dv, dk ** -0.5, L2_EPS, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
               v.stride(1), g.stride(0), out.stride(0), out.stride(1), state.stride(0), state.stride(1),
               state.stride(2), BLOCK_K=c["block_k"], BLOCK_V=c["block_v"], num_warps=4)
    return out


def delta_gates(a, b, a_log, dt_bias) -> tuple:
    """(g [N, Hv] fp32, beta [N, Hv] b's dtype) from a, b [N, Hv] and A_log, dt_bias [Hv]."""
    check_tensor("a", a, (None, None), dtypes=FLOAT_DTYPES)
    N, Hv = a.shape
    check_tensor("b", b, (N, Hv), dtype=a.dtype, device=a.device)
    check_tensor("a_log", a_log, (Hv,), dtypes=FLOAT_DTYPES, device=a.device)
    check_tensor("dt_bias", dt_bias, (Hv,), dtypes=FLOAT_DTYPES, device=a.device)
    a, b = a.contiguous(), b.contiguous()
    g = torch.empty(N, Hv, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(b)
    if N:
        launch(_gates_kernel, (cdiv(N * Hv, 256),), a, b, a_log, dt_bias, g, beta, N, Hv, BLOCK=256, num_warps=4)
    return g, beta


def gated_rmsnorm(x, z, w, eps: float = 1e-6, *, out=None) -> torch.Tensor:
    """y [N, D] = (w x rmsnorm(x)) x silu(z) (x, z [N, D], w [D])."""
    check_tensor("x", x, (None, None), dtypes=FLOAT_DTYPES)
    N, D = x.shape
    check_tensor("z", z, (N, D), dtype=x.dtype, device=x.device)
    check_tensor("weight", w, (D,), dtypes=FLOAT_DTYPES, device=x.device)
    out = torch.empty_like(x) if out is None else out
    check_tensor("out", out, (N, D), dtype=x.dtype)
    if N:
        launch(_gated_norm_kernel, (N,), x, z, w, out, D, x.stride(0), z.stride(0), out.stride(0), eps,
               BLOCK_D=next_pow2(D), num_warps=4 if D <= 2048 else 8)
    return out


def sigmoid_gate(x, g) -> torch.Tensor:
    """x * sigmoid(g) (the gated attention's output; same shapes, contiguous)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("gate", g, tuple(x.shape), dtype=x.dtype, device=x.device)
    x, g = x.contiguous(), g.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        launch(_sigmoid_gate_kernel, (cdiv(x.numel(), 1024),), x, g, out, x.numel(), BLOCK=1024, num_warps=4)
    return out


# ---- torch references: transformers 5.24's fallbacks (modeling_qwen3_next.py) --------------------------------

def l2norm(x: torch.Tensor, dim: int = -1, eps: float = L2_EPS):
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                                 output_final_state=False, use_qk_l2norm_in_kernel=False):
    """transformers' ``torch_chunk_gated_delta_rule`` (its solve_triangular path), unchanged in its maths."""
    initial_dtype = query.dtype
    batch_size, sequence_length, num_k_heads, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    if num_k_heads != num_v_heads:
        query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        key = key.repeat_interleave(num_v_heads // num_k_heads, dim=2)
    query, key, value, beta, decay = [x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                      for x in (query, key, value, beta, g)]
    if use_qk_l2norm_in_kernel:
        query, key = l2norm(query), l2norm(key)
    query = query * query.shape[-1] ** -0.5
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    query, key, value = (Fn.pad(x, (0, 0, 0, pad_size)) for x in (query, key, value))
    beta, decay = (Fn.pad(x, (0, pad_size)) for x in (beta, decay))
    num_chunks = (sequence_length + pad_size) // chunk_size
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = [x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1])
                                  for x in (query, key, k_beta, v_beta)]
    decay = decay.reshape(decay.shape[0], decay.shape[1], -1, chunk_size)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    cum = decay.cumsum(dim=3)
    pair = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ key.transpose(-1, -2)) * pair
    intra = (query @ key.transpose(-1, -2)) * pair
    new_values = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True)
    if initial_state is None:
        state = torch.zeros(batch_size, num_v_heads, k_head_dim, v_head_dim, dtype=new_values.dtype,
                            device=new_values.device)
    else:
        state = initial_state.to(new_values)
    out = torch.zeros_like(new_values)
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    for i in range(num_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        out[:, :, i] = query[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(batch_size, num_v_heads, -1, v_head_dim)[:, :, :sequence_length]
    out = out.transpose(1, 2).to(initial_dtype, memory_format=torch.contiguous_format)
    return out, (state if output_final_state else None)


def torch_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False):
    """transformers' ``torch_recurrent_gated_delta_rule``, unchanged in its maths."""
    initial_dtype = query.dtype
    batch_size, sequence_length, num_k_heads, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    if num_k_heads != num_v_heads:
        query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        key = key.repeat_interleave(num_v_heads // num_k_heads, dim=2)
    query, key, value, beta, decay = [x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                      for x in (query, key, value, beta, g)]
    if use_qk_l2norm_in_kernel:
        query, key = l2norm(query), l2norm(key)
    query = query / (query.shape[-1] ** 0.5)
    if initial_state is None:
        state = torch.zeros(batch_size, num_v_heads, k_head_dim, v_head_dim, dtype=value.dtype, device=value.device)
    else:
        state = initial_state.to(value)
    out = torch.zeros_like(value)
    for i in range(sequence_length):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * decay[:, :, i].exp()[..., None, None]
        delta = (v_t - (state * k_t.unsqueeze(-1)).sum(dim=-2)) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (state * q_t.unsqueeze(-1)).sum(dim=-2)
    out = out.transpose(1, 2).contiguous().to(initial_dtype)
    return out, (state if output_final_state else None)


def chunk_reference(q, k, v, g, beta, state, slots, *, has_state: bool = False, chunk: int = F.DELTA_CHUNK):
    """``gated_delta_prefill`` in torch: the slots' states gathered, transformers' chunked rule, scattered back."""
    init = state[slots] if has_state else None
    o, final = torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=init,
                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
    state[slots] = final
    return o


def recurrent_reference(q, k, v, g, beta, state, slots):
    """``gated_delta_decode`` in torch: transformers' recurrent rule on one token per sequence."""
    o, final = torch_recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                                initial_state=state[slots], output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    state[slots] = final
    return o[:, 0]


def gates_reference(a, b, a_log, dt_bias):
    """(g fp32, beta) as transformers computes them."""
    return -a_log.float().exp() * Fn.softplus(a.float() + dt_bias), b.sigmoid()


def gated_norm_reference(x, z, w, eps: float = 1e-6):
    """transformers' ``Qwen3NextRMSNormGated``."""
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = w * h.to(dt)
    return (h * Fn.silu(z.to(torch.float32))).to(dt)


def sigmoid_gate_reference(x, g):
    return x * torch.sigmoid(g)


# ---- costs: roofline.formulas.deltanet -------------------------------------------------------------------------

def _d(dtype) -> str:
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


def prefill_cost(batch, new_tokens, k_heads, v_heads, k_dim, v_dim, dtype="bf16", *, reads_state=False,
                 chunk=F.DELTA_CHUNK):
    return F.gated_delta_prefill(batch, new_tokens, k_heads, v_heads, k_dim, v_dim, chunk=chunk, act_dtype=_d(dtype),
                                 reads_state=reads_state)


def decode_cost(batch, k_heads, v_heads, k_dim, v_dim, dtype="bf16"):
    return F.gated_delta_decode(batch, k_heads, v_heads, k_dim, v_dim, act_dtype=_d(dtype))
