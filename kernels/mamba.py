"""Mamba-2 (Nemotron-H, Falcon-H1, Granite-4.0-H): the SSD chunked scan (prefill) returning each sequence's final
SSM state, the recurrent decode step on that state, and the gated RMSNorm in groups (norm_before_gate false). The
conv1d over x, B, C is ``kernels.conv1d``.

Shapes (one layer): x [B, T, H, P] (H heads of P channels), dt [B, T, H] (in_proj's raw dt: dt_bias is added and
softplus taken here), B and C [B, T, G, N] (G groups of d_state N, each shared by H / G consecutive heads, as
transformers' repeat_interleave), A_log, dt_bias, D [H] (A = -exp(A_log)). Every tensor's last dimension is
contiguous; batch / token / head strides are passed, so in_proj's and the conv's splits pass as views. A
sequence's SSM state is ``state[slots[b]]`` of state [S, H, P, N] fp32 (``formulas.MAMBA_STATE_DTYPE``): read
when the sequence has one (``has_state``; decode always), written once per call.

Prefill, in chunks of the config's ``chunk`` (a power of two; the last partial chunk padded as transformers pads
it: dt x x and dt x A zero past the end, so the decay there is 1 and the final state is the last token's), four
kernels as mamba_ssm's ``mamba_chunk_scan_combined`` (every load upcast to fp32, fp32 maths, one cast at each
store; tl.dot in IEEE fp32 for fp32 inputs and under the interpreter, tf32 otherwise):

* ``_ssd_cumsum_kernel``, grid (B, H, chunks): dt' = clamp(softplus(dt + dt_bias), dt_limit) (torch's
  softplus threshold 20), dA = dt' A and its cumulative sum within the chunk -> fp32 scratch [B, H, chunks, chunk];
* ``_ssd_chunk_state_kernel``, grid (B chunks, H, cdiv(P, BLOCK_P)): each chunk's own state
  sum_l (x_l dt'_l exp(cs_last - cs_l)) B_l^T -> fp32 scratch [B, chunks, H, P, N];
* ``_ssd_state_pass_kernel``, grid (B, H, cdiv(P N, BLOCK)): the state passing as a sequential scan over the
  chunks (the formula's convention): s <- s exp(cs_last) + the chunk's state, writing each chunk's starting state
  over its own (the scratch then holds the states the chunks start from) and the final one to ``state[slot]``
  (read first when ``has_state``, else zeros);
* ``_ssd_chunk_scan_kernel``, grid (B chunks, H, cdiv(chunk, BLOCK_M) cdiv(P, BLOCK_P)): the output
  y_l = exp(cs_l) C_l S_start + sum_{s <= l} (C_l . B_s) exp(cs_l - cs_s) dt'_s x_s + D x_l, the scores C B^T
  recomputed per P block, key blocks up to the row block's end.

The scratch (dt', the cumsum, the chunk states: 2 x 4 B per token and head, 2 x 4 P N B per chunk and head) is HBM
traffic ``formulas.ssd_prefill`` does not count (mamba_ssm's kernels keep the same intermediates).

Decode (``_ssd_step_kernel``, grid (B, H, cdiv(P, BLOCK_P))): one token per sequence (x [B, H, P], dt [B, H],
B and C [B, G, N]); dt' = softplus(dt + dt_bias) (transformers' cached step clamps nothing), dA = exp(dt' A), the
state's [BLOCK_P, N] slice read once, s <- s dA + dt' B x, y = s C + D x, the slice written once.

Gated norm (``_gated_group_norm_kernel``, grid (rows, groups)): h = y silu(z), each group of I / G channels
normalised by its own RMS, rounded to the output dtype, times the weight (transformers' ``NemotronHRMSNormGated``).

The torch references (``ssd_reference``, ``step_reference``, ``gated_norm_reference``) are transformers 5.24's
torch path (modeling_nemotron_h.py: ``segment_sum``, ``mamba2_chunk_scan``, ``mamba2_selective_state_update``,
``NemotronHRMSNormGated``; modeling_mamba2.py's ``torch_forward`` is the same algorithm) with the slot states
gathered and scattered around them: the torch backend runs them. ``*_cost`` are ``roofline.formulas.mamba``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as Fn
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name, next_pow2
from ._launch import launch

NO_LIMIT = (0.0, float("inf"))   # transformers' time_step_limit default (Nemotron-H's: (time_step_min, inf))


@triton.jit
def _softplus(x):
    """torch's softplus (beta 1, threshold 20) in fp32."""
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _ssd_cumsum_kernel(dt_ptr, bias_ptr, alog_ptr, dto_ptr, cs_ptr, T, H, sd_b, sd_t, lo, hi,
                       CHUNK: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.program_id(2)
    offs = tl.arange(0, CHUNK)
    t = c * CHUNK + offs
    valid = t < T
    dt = tl.load(dt_ptr + b.to(tl.int64) * sd_b + t.to(tl.int64) * sd_t + h, mask=valid, other=0.0).to(tl.float32)
    dt = _softplus(dt + tl.load(bias_ptr + h).to(tl.float32))
    dt = tl.minimum(tl.maximum(dt, lo), hi)
    dt = tl.where(valid, dt, 0.0)                                    # past the end: x dt and A dt are zero
    a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    cs = tl.cumsum(dt * a, 0)
    base = ((b.to(tl.int64) * H + h) * tl.num_programs(2) + c) * CHUNK
    tl.store(dto_ptr + base + offs, dt)
    tl.store(cs_ptr + base + offs, cs)


@triton.jit
def _ssd_chunk_state_kernel(x_ptr, b_ptr, dt_ptr, cs_ptr, st_ptr, T, H, P, N, NC, GROUP,
                            sx_b, sx_t, sx_h, sb_b, sb_t, sb_g,
                            CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
                            BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    bc = tl.program_id(0)
    h = tl.program_id(1)
    b = bc // NC
    c = bc % NC
    g = h // GROUP
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    pmask = offs_p < P
    nmask = offs_n < N
    row = ((b.to(tl.int64) * H + h) * NC + c) * CHUNK                # this chunk's dt' / cumsum
    cs_last = tl.load(cs_ptr + row + CHUNK - 1)
    x_base = x_ptr + b.to(tl.int64) * sx_b + h * sx_h
    b_base = b_ptr + b.to(tl.int64) * sb_b + g * sb_g
    acc = tl.zeros((BLOCK_P, BLOCK_N), tl.float32)
    for k in range(0, CHUNK, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        t = c * CHUNK + offs_k
        tmask = t < T
        w = tl.load(dt_ptr + row + offs_k) * tl.exp(cs_last - tl.load(cs_ptr + row + offs_k))   # [BLOCK_K]
        xt = tl.load(x_base + t[None, :].to(tl.int64) * sx_t + offs_p[:, None],
                     mask=tmask[None, :] & pmask[:, None], other=0.0).to(tl.float32)            # [BLOCK_P, BLOCK_K]
        bb = tl.load(b_base + t[:, None].to(tl.int64) * sb_t + offs_n[None, :],
                     mask=tmask[:, None] & nmask[None, :], other=0.0).to(tl.float32)            # [BLOCK_K, BLOCK_N]
        acc += tl.dot(xt * w[None, :], bb, input_precision=DOT_PREC)
    st = st_ptr + (((b.to(tl.int64) * NC + c) * H + h) * P + offs_p[:, None]) * N + offs_n[None, :]
    tl.store(st, acc, mask=pmask[:, None] & nmask[None, :])


@triton.jit
def _ssd_state_pass_kernel(st_ptr, cs_ptr, state_ptr, slot_ptr, H, PN, NC, ss_s, ss_h,
                           HAS_STATE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PN
    slot = tl.load(slot_ptr + b).to(tl.int64)
    sp = state_ptr + slot * ss_s + h * ss_h + offs
    if HAS_STATE:
        s = tl.load(sp, mask=mask, other=0.0).to(tl.float32)
    else:
        s = tl.zeros((BLOCK,), tl.float32)
    for c in range(NC):
        p = st_ptr + ((b.to(tl.int64) * NC + c) * H + h) * PN + offs
        own = tl.load(p, mask=mask, other=0.0)
        tl.store(p, s, mask=mask)                                    # the state chunk c starts from
        decay = tl.exp(tl.load(cs_ptr + ((b.to(tl.int64) * H + h) * NC + c) * CHUNK + CHUNK - 1))
        s = s * decay + own
    tl.store(sp, s, mask=mask)


@triton.jit
def _ssd_chunk_scan_kernel(x_ptr, b_ptr, c_ptr, dt_ptr, cs_ptr, st_ptr, d_ptr, y_ptr, T, H, P, N, NC, GROUP,
                           sx_b, sx_t, sx_h, sb_b, sb_t, sb_g, sc_b, sc_t, sc_g, sy_b, sy_t, sy_h,
                           CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                           BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    bc = tl.program_id(0)
    h = tl.program_id(1)
    b = bc // NC
    c = bc % NC
    g = h // GROUP
    n_pb = tl.cdiv(P, BLOCK_P)
    m = tl.program_id(2) // n_pb
    offs_p = (tl.program_id(2) % n_pb) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    pmask = offs_p < P
    nmask = offs_n < N
    tm = c * CHUNK + offs_m
    mmask = tm < T
    row = ((b.to(tl.int64) * H + h) * NC + c) * CHUNK
    cs_m = tl.load(cs_ptr + row + offs_m)
    x_base = x_ptr + b.to(tl.int64) * sx_b + h * sx_h
    b_base = b_ptr + b.to(tl.int64) * sb_b + g * sb_g
    cm = tl.load(c_ptr + b.to(tl.int64) * sc_b + g * sc_g + tm[:, None].to(tl.int64) * sc_t + offs_n[None, :],
                 mask=mmask[:, None] & nmask[None, :], other=0.0).to(tl.float32)              # [BLOCK_M, BLOCK_N]
    s0 = tl.load(st_ptr + (((b.to(tl.int64) * NC + c) * H + h) * P + offs_p[None, :]) * N + offs_n[:, None],
                 mask=nmask[:, None] & pmask[None, :], other=0.0)                              # [BLOCK_N, BLOCK_P]
    acc = tl.dot(cm, s0, input_precision=DOT_PREC) * tl.exp(cs_m)[:, None]                    # the carried state
    for k in range(0, (m + 1) * BLOCK_M, BLOCK_K):                   # source positions up to the row block's end
        offs_k = k + tl.arange(0, BLOCK_K)
        tk = c * CHUNK + offs_k
        kmask = tk < T
        bk = tl.load(b_base + tk[None, :].to(tl.int64) * sb_t + offs_n[:, None],
                     mask=kmask[None, :] & nmask[:, None], other=0.0).to(tl.float32)          # [BLOCK_N, BLOCK_K]
        cb = tl.dot(cm, bk, input_precision=DOT_PREC)                                          # [BLOCK_M, BLOCK_K]
        diff = cs_m[:, None] - tl.load(cs_ptr + row + offs_k)[None, :]
        causal = offs_k[None, :] <= offs_m[:, None]
        w = cb * tl.exp(tl.where(causal, diff, float("-inf"))) * tl.load(dt_ptr + row + offs_k)[None, :]
        xk = tl.load(x_base + tk[:, None].to(tl.int64) * sx_t + offs_p[None, :],
                     mask=kmask[:, None] & pmask[None, :], other=0.0).to(tl.float32)          # [BLOCK_K, BLOCK_P]
        acc += tl.dot(w, xk, input_precision=DOT_PREC)
    xm = tl.load(x_base + tm[:, None].to(tl.int64) * sx_t + offs_p[None, :],
                 mask=mmask[:, None] & pmask[None, :], other=0.0).to(tl.float32)
    acc += tl.load(d_ptr + h).to(tl.float32) * xm                                              # the D skip
    tl.store(y_ptr + b.to(tl.int64) * sy_b + h * sy_h + tm[:, None].to(tl.int64) * sy_t + offs_p[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & pmask[None, :])


@triton.jit
def _ssd_step_kernel(x_ptr, dt_ptr, b_ptr, c_ptr, alog_ptr, bias_ptr, d_ptr, y_ptr, state_ptr, slot_ptr,
                     P, N, GROUP, sx_b, sx_h, sd_b, sb_b, sb_g, sc_b, sc_g, sy_b, sy_h, ss_s, ss_h, ss_p,
                     BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    pmask = offs_p < P
    nmask = offs_n < N
    mask = pmask[:, None] & nmask[None, :]
    slot = tl.load(slot_ptr + b).to(tl.int64)
    dt = _softplus(tl.load(dt_ptr + b.to(tl.int64) * sd_b + h).to(tl.float32) + tl.load(bias_ptr + h).to(tl.float32))
    dA = tl.exp(dt * -tl.exp(tl.load(alog_ptr + h).to(tl.float32)))
    x = tl.load(x_ptr + b.to(tl.int64) * sx_b + h * sx_h + offs_p, mask=pmask, other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + b.to(tl.int64) * sb_b + g * sb_g + offs_n, mask=nmask, other=0.0).to(tl.float32)
    cc = tl.load(c_ptr + b.to(tl.int64) * sc_b + g * sc_g + offs_n, mask=nmask, other=0.0).to(tl.float32)
    sp = state_ptr + slot * ss_s + h * ss_h + offs_p[:, None] * ss_p + offs_n[None, :]
    s = tl.load(sp, mask=mask, other=0.0).to(tl.float32)
    s = s * dA + (dt * bb)[None, :] * x[:, None]
    tl.store(sp, s, mask=mask)
    y = tl.sum(s * cc[None, :], 1) + tl.load(d_ptr + h).to(tl.float32) * x
    tl.store(y_ptr + b.to(tl.int64) * sy_b + h * sy_h + offs_p, y.to(y_ptr.dtype.element_ty), mask=pmask)


@triton.jit
def _gated_group_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, GS, sx, sz, sy, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * GS + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < GS
    x = tl.load(x_ptr + row * sx + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * sz + offs, mask=mask, other=0.0).to(tl.float32)
    hh = x * (z / (1.0 + tl.exp(-z)))                                # y x silu(z), then the group's RMS
    n = (hh / tl.sqrt(tl.sum(hh * hh, 0) / GS + eps)).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sy + offs, (w * n).to(y_ptr.dtype.element_ty), mask=mask)


# ---- launchers -----------------------------------------------------------------------------------------------

def _prec(dt) -> str:
    return "ieee" if (dt == torch.float32 or INTERPRET) else "tf32"


def ssd_config(chunk: int, head_dim: int, state: int, dtype=torch.bfloat16) -> dict:
    """Tiles of the chunked scan: output rows and source positions in blocks of up to 64 (fp32: 32) of the
    chunk, the head's channels in blocks of up to 64 (fp32: 32), the whole state width (N) in one tile. The chunk
    states' kernel takes 8 warps for 64-position tiles (4 took 224 registers on sm_80 at d_state 128; 8 take 128),
    the output's 4 (8 spilled on sm_90; 4 take 223 on sm_80, 241 on sm_90, no spills: the compile check)."""
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk_size must be a power of two of at least 16 (tl.dot's tiles), got {chunk}.")
    fp32 = dtype == torch.float32
    top = 32 if fp32 else 64
    return dict(chunk=chunk, block_m=min(top, chunk), block_k=min(top, chunk),
                block_p=max(16, min(top, next_pow2(head_dim))), block_n=max(16, next_pow2(state)),
                state_warps=4 if fp32 else 8, num_warps=4)


def step_config(head_dim: int, state: int) -> dict:
    """The decode step's tile: [BLOCK_P, N] of one head's state (BLOCK_P x N <= 4096 elements)."""
    bn = next_pow2(state)
    return dict(block_p=max(1, min(next_pow2(head_dim), 4096 // bn)), block_n=bn, num_warps=4)


def _check_sizes(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, lead):
    """(H, P, G, N) after checking every tensor against x [*lead, H, P]."""
    check_tensor("x", x, (None,) * (len(lead) + 2), dtypes=FLOAT_DTYPES)
    H, P = x.shape[-2:]
    check_tensor("dt", dt, (*x.shape[:-1],), dtypes=FLOAT_DTYPES, device=x.device)
    check_tensor("B", Bm, (*x.shape[:-2], None, None), dtype=x.dtype, device=x.device)
    G, N = Bm.shape[-2:]
    if H % G:
        raise ValueError(f"the heads ({H}) must be a multiple of B and C's groups ({G}).")
    check_tensor("C", Cm, tuple(Bm.shape), dtype=x.dtype, device=x.device)
    for name, v in (("A_log", a_log), ("dt_bias", dt_bias), ("D", D)):
        check_tensor(name, v, (H,), dtypes=FLOAT_DTYPES, device=x.device)
    check_tensor("state", state, (None, H, P, N), dtype=torch.float32, device=x.device)
    if not state.is_contiguous():
        raise ValueError("state must be contiguous ([S, heads, head_dim, d_state]).")
    check_tensor("slots", slots, (x.shape[0],), dtypes=(torch.int32, torch.int64), device=x.device)
    return H, P, G, N


def ssd_prefill(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, *, chunk: int, has_state: bool = False,
                dt_limit: tuple = NO_LIMIT, out=None) -> torch.Tensor:
    """y [B, T, H, P]: the SSD chunked scan over each sequence's T new tokens (module docstring), starting from
    ``state[slots[b]]`` when ``has_state`` (else zeros); the final state is written there."""
    H, P, G, N = _check_sizes(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, (None, None))
    Bsz, T = x.shape[:2]
    out = torch.empty(Bsz, T, H, P, dtype=x.dtype, device=x.device) if out is None else out
    check_tensor("out", out, (Bsz, T, H, P), dtype=x.dtype)
    c = ssd_config(chunk, P, N, x.dtype)
    if not (Bsz and T):
        return out
    NC = cdiv(T, chunk)
    f32 = dict(dtype=torch.float32, device=x.device)
    dto, cs = torch.empty(Bsz, H, NC, chunk, **f32), torch.empty(Bsz, H, NC, chunk, **f32)
    st = torch.empty(Bsz, NC, H, P, N, **f32)
    lo, hi = (float(v) for v in dt_limit)
    launch(_ssd_cumsum_kernel, (Bsz, H, NC), dt, dt_bias, a_log, dto, cs, T, H, dt.stride(0), dt.stride(1), lo,
           min(hi, 3.0e38), CHUNK=chunk, num_warps=4)
    prec = _prec(x.dtype)
    xs, bs, ccs = (x.stride(0), x.stride(1), x.stride(2)), (Bm.stride(0), Bm.stride(1), Bm.stride(2)), \
        (Cm.stride(0), Cm.stride(1), Cm.stride(2))
    launch(_ssd_chunk_state_kernel, (Bsz * NC, H, cdiv(P, c["block_p"])), x, Bm, dto, cs, st, T, H, P, N, NC, H // G,
           *xs, *bs, CHUNK=chunk, BLOCK_K=c["block_k"], BLOCK_P=c["block_p"], BLOCK_N=c["block_n"], DOT_PREC=prec,
           num_warps=c["state_warps"])
    blk = min(1024, next_pow2(P * N))
    launch(_ssd_state_pass_kernel, (Bsz, H, cdiv(P * N, blk)), st, cs, state, slots, H, P * N, NC,
           state.stride(0), state.stride(1), HAS_STATE=bool(has_state), CHUNK=chunk, BLOCK=blk, num_warps=4)
    launch(_ssd_chunk_scan_kernel, (Bsz * NC, H, cdiv(chunk, c["block_m"]) * cdiv(P, c["block_p"])),
           x, Bm, Cm, dto, cs, st, D, out, T, H, P, N, NC, H // G, *xs, *bs, *ccs,
           out.stride(0), out.stride(1), out.stride(2), CHUNK=chunk, BLOCK_M=c["block_m"], BLOCK_K=c["block_k"],
           BLOCK_P=c["block_p"], BLOCK_N=c["block_n"], DOT_PREC=prec, num_warps=c["num_warps"])
    return out


def ssd_decode(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, *, out=None) -> torch.Tensor:
    """y [B, H, P]: one recurrent step per sequence (x [B, H, P], dt [B, H], B and C [B, G, N]) on
    ``state[slots[b]]``, read once and written once."""
    H, P, G, N = _check_sizes(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, (None,))
    Bsz = x.shape[0]
    out = torch.empty(Bsz, H, P, dtype=x.dtype, device=x.device) if out is None else out
    check_tensor("out", out, (Bsz, H, P), dtype=x.dtype)
    c = step_config(P, N)
    if Bsz:
        launch(_ssd_step_kernel, (Bsz, H, cdiv(P, c["block_p"])), x, dt, Bm, Cm, a_log, dt_bias, D, out, state,
               slots, P, N, H // G, x.stride(0), x.stride(1), dt.stride(0), Bm.stride(0), Bm.stride(1), Cm.stride(0),
               Cm.stride(1), out.stride(0), out.stride(1), state.stride(0), state.stride(1), state.stride(2),
               BLOCK_P=c["block_p"], BLOCK_N=c["block_n"], num_warps=c["num_warps"])
    return out


def gated_group_rmsnorm(x, z, w, groups: int, eps: float = 1e-6, *, out=None) -> torch.Tensor:
    """y [R, I] = w x grouped-rmsnorm(x silu(z)) over ``groups`` groups of I / groups channels (x, z [R, I], w [I];
    norm_before_gate false, transformers' ``NemotronHRMSNormGated``)."""
    check_tensor("x", x, (None, None), dtypes=FLOAT_DTYPES)
    R, I = x.shape
    check_tensor("z", z, (R, I), dtype=x.dtype, device=x.device)
    check_tensor("weight", w, (I,), dtypes=FLOAT_DTYPES, device=x.device)
    if groups < 1 or I % groups:
        raise ValueError(f"the gated norm's groups ({groups}) must divide its width ({I}).")
    out = torch.empty(R, I, dtype=x.dtype, device=x.device) if out is None else out
    check_tensor("out", out, (R, I), dtype=x.dtype)
    gs = I // groups
    if R:
        launch(_gated_group_norm_kernel, (R, groups), x, z, w, out, gs, x.stride(0), z.stride(0), out.stride(0), eps,
               BLOCK=next_pow2(gs), num_warps=4 if gs <= 2048 else 8)
    return out


# ---- torch references: transformers 5.24's torch path (modeling_nemotron_h.py) ---------------------------------

def _pad(t, pad_size):
    pad_shape = (0, 0, 0, 0, 0, pad_size, 0, 0) if len(t.shape) == 4 else (0, 0, 0, pad_size, 0, 0)
    return Fn.pad(t, pad_shape, mode="constant", value=0)


def _chunks(t, pad_size, chunk_size):
    t = _pad(t, pad_size)
    if len(t.shape) == 3:
        return t.reshape(t.shape[0], -1, chunk_size, t.shape[2])
    return t.reshape(t.shape[0], -1, chunk_size, t.shape[2], t.shape[3])


def segment_sum(x):
    """transformers' ``segment_sum``: [..., L] -> [..., L, L], out[i, j] = sum_{j < k <= i} x_k (-inf above)."""
    L = x.size(-1)
    x = x[..., None].expand(*x.size(), L)
    x = x.masked_fill(~torch.tril(torch.ones(L, L, device=x.device, dtype=torch.bool), diagonal=-1), 0)
    s = torch.cumsum(x, dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(L, L, device=x.device, dtype=torch.bool), diagonal=0), -torch.inf)


def torch_chunk_scan(x, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
                     dt_limit=NO_LIMIT, return_final_states=False):
    """transformers 5.24's ``mamba2_chunk_scan`` (its torch path), step by step."""
    batch_size, seq_len, num_heads, head_dim = x.shape
    num_groups = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = Fn.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    x = x.float()
    B = B.float().repeat_interleave(num_heads // num_groups, dim=2, output_size=num_heads)
    C = C.float().repeat_interleave(num_heads // num_groups, dim=2, output_size=num_heads)
    pad_size = (chunk_size - seq_len % chunk_size) % chunk_size
    D_residual = D[..., None] * _pad(x, pad_size) if D is not None else None
    x = x * dt[..., None].float()
    A = A.to(x.dtype) * dt.float()
    x, A, B, C = [_chunks(t, pad_size, chunk_size) for t in (x, A, B, C)]
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(segment_sum(A))
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.permute(0, 2, 3, 4, 1)
    Y_diag = torch.einsum("bclsh,bcshp->bclhp", M, x)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, x)
    previous = (initial_states[:, None].to(dtype=states.dtype, device=states.device) if initial_states is not None
                else torch.zeros_like(states[:, :1]))
    states = torch.cat([previous, states], dim=1)
    decay_chunk = torch.exp(segment_sum(Fn.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    C_times_states = torch.einsum("bclhn,bchpn->bclhp", C, states)
    Y_off = C_times_states * torch.exp(A_cumsum).permute(0, 2, 3, 1)[..., None]
    y = (Y_diag + Y_off).contiguous().reshape(batch_size, -1, num_heads, head_dim)
    if D_residual is not None:
        y = y + D_residual
    if pad_size > 0:
        y = y[:, :seq_len]
    return (y, final_state) if return_final_states else y


def torch_state_update(state, x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False):
    """transformers 5.24's ``mamba2_selective_state_update`` (its torch path; per-channel dt, A, D, dt_bias as the
    mixer expands them), ``state`` [B, H, P, N] updated in place."""
    batch_size, num_heads, head_dim = x.shape
    num_groups, state_size = B.shape[1], B.shape[-1]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = Fn.softplus(dt)
    dt = dt[..., None]
    dA = torch.exp(dt.float() * A.float())
    rep = num_heads // num_groups
    B = B.reshape(batch_size, num_groups, 1, state_size).expand(batch_size, num_groups, rep, state_size)
    B = B.reshape(batch_size, num_heads, 1, state_size)
    s = state * dA + dt * B * x[..., None]
    state.copy_(s.to(state.dtype))
    C = C.reshape(batch_size, num_groups, 1, state_size).expand(batch_size, num_groups, rep, state_size)
    C = C.reshape(batch_size * num_heads, state_size, 1)
    y = torch.bmm(s.to(C.dtype).view(batch_size * num_heads, head_dim, state_size), C)
    y = y.view(batch_size, num_heads, head_dim)
    if D is not None:
        y = (y + x * D).to(y.dtype)
    return y.to(x.dtype)


def ssd_reference(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots, *, chunk: int, has_state: bool = False,
                  dt_limit: tuple = NO_LIMIT) -> torch.Tensor:
    """``ssd_prefill`` in torch: the slots' states gathered, transformers' chunked scan (A = -exp(A_log), softplus
    of dt + dt_bias, clamped to ``dt_limit``), the final states scattered back."""
    y, final = torch_chunk_scan(x, dt, -torch.exp(a_log.float()), Bm, Cm, chunk, D=D, dt_bias=dt_bias,
                                initial_states=state[slots] if has_state else None, dt_softplus=True,
                                dt_limit=dt_limit, return_final_states=True)
    state[slots] = final.to(state.dtype)
    return y.to(x.dtype)


def step_reference(x, dt, Bm, Cm, a_log, dt_bias, D, state, slots) -> torch.Tensor:
    """``ssd_decode`` in torch: transformers' cached step (its per-channel expansion of dt, A, D, dt_bias)."""
    P, N = x.shape[-1], Bm.shape[-1]
    A = -torch.exp(a_log.float())
    s = state[slots]
    y = torch_state_update(s, x, dt[..., None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), Bm, Cm,
                           D[:, None].expand(-1, P), dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True)
    state[slots] = s
    return y


def gated_norm_reference(x, z, w, groups: int, eps: float = 1e-6) -> torch.Tensor:
    """transformers' ``NemotronHRMSNormGated`` (group_size = I / groups), in x's dtype."""
    dt = x.dtype
    h = x.to(torch.float32) * Fn.silu(z.to(torch.float32))
    *lead, I = h.shape
    hg = h.view(*lead, groups, I // groups)
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    return (w * hg.view(*lead, I).to(dt)).to(dt)


# ---- costs: roofline.formulas.mamba ----------------------------------------------------------------------------

def _d(dtype) -> str:
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


def prefill_cost(batch, new_tokens, heads, head_dim, state, groups, dtype="bf16", *, chunk, reads_state=False):
    return F.ssd_prefill(batch, new_tokens, heads, head_dim, state, groups, chunk=chunk, act_dtype=_d(dtype),
                         reads_state=reads_state)


def decode_cost(batch, heads, head_dim, state, groups, dtype="bf16"):
    return F.ssd_decode(batch, heads, head_dim, state, groups, act_dtype=_d(dtype))


def norm_cost(rows, width, dtype="bf16"):
    return F.gated_rmsnorm(rows, width, act_dtype=_d(dtype))
