"""Rotary position embedding, Hugging Face half-rotation layout, applied to q and k in place.

For each head vector x = [x1, x2] (halves of D): out = [x1*cos - x2*sin, x2*cos + x1*sin],
with cos/sin of position * inv_freq, inv_freq[i] = theta^(-2i/D) (HF's ``rotate_half``).
Each token carries its own position, so a chunk, a cached prefix or a batch of sequences at
different lengths all work. cos/sin come from fp32 tables [max_pos, D/2] (``rope_tables``),
gathered by position: the 4*D bytes per token of formulas.rope.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, check_tensor, dtype_name, next_pow2
from ._launch import launch


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr, HQ, HKV, HALF,
                 stride_qt, stride_qh, stride_kt, stride_kh,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_h = tl.arange(0, BLOCK_H)
    dmask = offs_d < HALF
    cos = tl.load(cos_ptr + pos * HALF + offs_d, mask=dmask, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * HALF + offs_d, mask=dmask, other=0.0)[None, :]
    # q: all Hq heads of this token at once
    m = (offs_h[:, None] < HQ) & dmask[None, :]
    p1 = q_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :]
    x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos - x2 * sin).to(q_ptr.dtype.element_ty), mask=m)
    tl.store(p1 + HALF, (x2 * cos + x1 * sin).to(q_ptr.dtype.element_ty), mask=m)
    m = (offs_h[:, None] < HKV) & dmask[None, :]
    p1 = k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos - x2 * sin).to(k_ptr.dtype.element_ty), mask=m)
    tl.store(p1 + HALF, (x2 * cos + x1 * sin).to(k_ptr.dtype.element_ty), mask=m)


def rope_tables(max_pos: int, head_dim: int, theta: float = 10000.0, device="cpu", yarn: tuple = ()):
    """cos, sin: [max_pos, head_dim // 2] fp32 (angles computed in fp64, then rounded); shapes only on meta.

    ``yarn`` = (factor, beta_fast, beta_slow, original_max_positions, attention_factor, truncate): YaRN's
    frequencies (Peng et al. 2023, as transformers' ``_compute_yarn_parameters``): each dimension's inverse
    frequency blends the interpolated theta^(-2i/D)/factor and the original by a linear ramp between the
    dimensions that rotate beta_fast and beta_slow times over the original context; cos and sin are
    multiplied by the attention factor (GPT-OSS, DeepSeek-V3)."""
    if torch.device(device).type == "meta":
        return (torch.empty(max_pos, head_dim // 2, dtype=torch.float32, device=device),) * 2
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    scale = 1.0
    if yarn:
        factor, fast, slow, orig, scale, truncate = yarn
        dim = head_dim

        def corr(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = corr(fast), corr(slow)
        if truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        keep = 1 - ramp                                   # 1: extrapolate (original), 0: interpolate
        inv = (inv / factor) * (1 - keep) + inv * keep
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return (ang.cos() * scale).float().to(device), (ang.sin() * scale).float().to(device)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor):
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by positions pos [T]; returns (q, k)."""
    # q: [T, Hq, D]   k: [T, Hkv, D]   cos, sin: [P, D/2] fp32   pos: [T] int
    check_tensor("q", q, (None, None, None), dtypes=FLOAT_DTYPES)
    T, HQ, D = q.shape
    if D % 2:
        raise ValueError(f"q's head_dim must be even for RoPE, got {D}.")
    check_tensor("k", k, (T, None, D), dtype=q.dtype, device=q.device)
    check_tensor("cos", cos, (None, D // 2), dtype=torch.float32, device=q.device)
    check_tensor("sin", sin, tuple(cos.shape), dtype=torch.float32, device=q.device)
    check_tensor("pos", pos, (T,), dtypes=(torch.int32, torch.int64), device=q.device)
    if q.stride(2) != 1 or k.stride(2) != 1 or not cos.is_contiguous() or not sin.is_contiguous():
        raise ValueError("q, k, cos and sin must be contiguous in the head dimension.")
    HKV = k.shape[1]
    if T:
        launch(_rope_kernel, (T,), q, k, cos, sin, pos, HQ, HKV, D // 2, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                           BLOCK_H=next_pow2(max(HQ, HKV)), BLOCK_D=next_pow2(D // 2), num_warps=4)
    return q, k


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb for x [T, H, D]; returns a new tensor in x's dtype."""
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = torch.cat((cos[pos], cos[pos]), -1)[:, None, :].to(ct)
    s = torch.cat((sin[pos], sin[pos]), -1)[:, None, :].to(ct)
    xf = x.to(ct)
    return (xf * c + _rotate_half(xf) * s).to(x.dtype)


def cost(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.rope(tokens, n_heads, n_kv_heads, head_dim, act_dtype=d)
