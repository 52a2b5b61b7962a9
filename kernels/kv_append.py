"""KV-cache append: write new tokens' K and V into a preallocated cache, quantizing for an 8-bit cache.

Cache layout (one per layer): k_cache, v_cache [n_slots, Hkv, max_len, D]; token t goes to
slot ``slot[t]`` at position ``pos[t]``. One program per token moves its [Hkv, D] K and V.
Offsets are int64 (a cache easily exceeds 2^31 elements).

8-bit cache (``scales=(k_scale, v_scale)``, each fp32 [n_slots, Hkv, max_len]; caches int8 or fp8
e4m3, ``kernels.quant``): each row (one token, one KV head) is quantized on its own, in fp32:
scale = absmax(row) / QMAX (127 int8, 448 fp8), value = row x (QMAX / absmax); int8 rounds half away
from zero (x + 0.5 sign(x), truncated), fp8 to nearest even (``act_quant.e4m3_round`` in fp32, then the cast of an
exact value: the Triton interpreter's own fp32 -> e4m3 cast drops a mantissa carry into the next binade). So
|row - value x scale| <= scale / 2 (int8), and a token's stored values never depend on other
tokens: a chunked prefill writes the same cache as an unchunked one. An all-zero row stores 0, scale 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, check_tensor, dtype_name, next_pow2, put
from ._launch import launch
from .act_quant import e4m3_round
from .quant import KV_QMAX, KV_TORCH, dequantize_kv, kv_dtype_of, quantize_kv_rows

QUANT_CODE = {"": 0, "int8": 1, "fp8": 2}


@triton.jit
def _quantize_rows(x, QUANT: tl.constexpr, QMAX: tl.constexpr):
    """x [BLOCK_H, BLOCK_D] fp32 -> (values for the cache, scale per row); QUANT 1 int8, 2 fp8."""
    amax = tl.max(tl.abs(x), 1)
    inv = tl.where(amax > 0, QMAX / tl.where(amax > 0, amax, 1.0), 0.0)
    y = x * inv[:, None]
    if QUANT == 1:
        q = (y + tl.where(y >= 0, 0.5, -0.5)).to(tl.int8)           # round half away from zero (|y| <= 127)
    else:                                                           # rounded in fp32 first (act_quant.e4m3_round):
        q = e4m3_round(tl.minimum(tl.maximum(y, -QMAX), QMAX)).to(tl.float8e4nv)   # the cast of an exact value
    return q, amax / QMAX


@triton.jit
def _kv_append_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr, pos_ptr, HKV, D,
                      stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch, stride_cn,
                      stride_ss, stride_sh,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    hmask = offs_h < HKV
    m = hmask[:, None] & (offs_d[None, :] < D)
    dst = slot * stride_cs + pos * stride_cn + offs_h[:, None].to(tl.int64) * stride_ch + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=m, other=0.0)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=m, other=0.0)
    if QUANT:
        sdst = slot * stride_ss + offs_h.to(tl.int64) * stride_sh + pos
        kq, ks = _quantize_rows(k.to(tl.float32), QUANT, QMAX)
        tl.store(kc_ptr + dst, kq, mask=m)
        tl.store(ks_ptr + sdst, ks, mask=hmask)
        vq, vs = _quantize_rows(v.to(tl.float32), QUANT, QMAX)
        tl.store(vc_ptr + dst, vq, mask=m)
        tl.store(vs_ptr + sdst, vs, mask=hmask)
    else:
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=m)


CACHE_DTYPES = FLOAT_DTYPES + tuple(KV_TORCH.values())


def check_scales(k_cache: torch.Tensor, scales, name: str = "k_cache") -> str:
    """"int8" / "fp8" for an 8-bit cache with its scales, "" for a float cache without; ValueError otherwise."""
    kind = kv_dtype_of(k_cache)
    if not kind:
        if scales is not None:
            raise ValueError(f"scales go with an 8-bit cache (int8 or fp8), but {name} is {k_cache.dtype}.")
        return ""
    if scales is None or len(scales) != 2:
        raise ValueError(f"an {kind} {name} needs scales=(k_scale, v_scale), each fp32 [slots, Hkv, max_len].")
    S, HKV, L, _ = k_cache.shape
    for n, s in zip(("k_scale", "v_scale"), scales):
        check_tensor(n, s, (S, HKV, L), dtype=torch.float32, device=k_cache.device)
    if scales[0].stride() != scales[1].stride():
        raise ValueError("k_scale and v_scale must have the same strides.")
    return kind


def kv_append(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot: torch.Tensor, pos: torch.Tensor, scales=None) -> None:
    """Write k, v [T, Hkv, D] to caches [S, Hkv, L, D] at (slot[t], pos[t]); an 8-bit cache also takes
    ``scales=(k_scale, v_scale)`` [S, Hkv, L] fp32, written with it. Positions are the caller's to bound."""
    # k, v: [T, Hkv, D]   k_cache, v_cache: [S, Hkv, L, D]   slot, pos: [T] int   scales: 2 x [S, Hkv, L]
    check_tensor("k_cache", k_cache, (None, None, None, None), dtypes=CACHE_DTYPES)
    S, HKV, L, D = k_cache.shape
    check_tensor("v_cache", v_cache, (S, HKV, L, D), dtype=k_cache.dtype, device=k_cache.device)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same strides.")
    kind = check_scales(k_cache, scales)
    check_tensor("k", k, (None, HKV, D), dtypes=FLOAT_DTYPES, device=k_cache.device)
    T = k.shape[0]
    check_tensor("v", v, (T, HKV, D), dtype=k.dtype, device=k_cache.device)
    check_tensor("slot", slot, (T,), dtypes=(torch.int32, torch.int64), device=k_cache.device)
    check_tensor("pos", pos, (T,), dtypes=(torch.int32, torch.int64), device=k_cache.device)
    ks, vs = scales if kind else (k_cache, v_cache)
    if T:
        launch(_kv_append_kernel, (T,), k, v, k_cache, v_cache, ks, vs, slot, pos, HKV, D, k.stride(0), k.stride(1),
               v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               ks.stride(0), ks.stride(1),
               BLOCK_H=next_pow2(HKV), BLOCK_D=next_pow2(D), QUANT=QUANT_CODE[kind], QMAX=KV_QMAX.get(kind, 1.0))


def reference(k, v, k_cache, v_cache, slot, pos, scales=None) -> None:
    """Plain torch: the rows written (an 8-bit cache: quantized by ``kernels.quant.quantize_kv_rows``, the
    kernel's arithmetic)."""
    kind = kv_dtype_of(k_cache)
    if not kind:
        k_cache[slot, :, pos] = k.to(k_cache.dtype)
        v_cache[slot, :, pos] = v.to(v_cache.dtype)
        return
    for x, cache, sc in ((k, k_cache, scales[0]), (v, v_cache, scales[1])):
        q, s = quantize_kv_rows(x, kind)
        put(cache, (slot, slice(None), pos), q)
        sc[slot, :, pos] = s


def dequantized(cache: torch.Tensor, scale: torch.Tensor | None, dtype=torch.float64) -> torch.Tensor:
    """A cache's values as ``dtype`` (an 8-bit cache times its scales): what the attention references read."""
    if scale is None:
        return cache.to(dtype)
    if dtype == torch.float64:
        return cache.double() * scale.double()[..., None]
    return dequantize_kv(cache, scale, dtype)


def cost(tokens: int, n_kv_heads: int, head_dim: int, dtype="bf16", kv_dtype=None):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.kv_append(tokens, n_kv_heads, head_dim, act_dtype=d, kv_dtype=kv_dtype or d)
