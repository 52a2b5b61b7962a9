"""KV-cache append: write new tokens' K and V into a preallocated cache.

Cache layout (one per layer): k_cache, v_cache [n_slots, Hkv, max_len, D]; token t goes to
slot ``slot[t]`` at position ``pos[t]``. One program per token moves its [Hkv, D] K and V.
Offsets are int64 (a cache easily exceeds 2^31 elements).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, check_tensor, dtype_name, next_pow2
from ._launch import launch


@triton.jit
def _kv_append_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr, HKV, D,
                      stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch, stride_cn,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    m = (offs_h[:, None] < HKV) & (offs_d[None, :] < D)
    dst = slot * stride_cs + pos * stride_cn + offs_h[:, None].to(tl.int64) * stride_ch + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=m, other=0.0)
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=m)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=m, other=0.0)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=m)


def kv_append(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot: torch.Tensor, pos: torch.Tensor) -> None:
    """Write k, v [T, Hkv, D] to caches [S, Hkv, L, D] at (slot[t], pos[t]). Positions are the caller's to bound."""
    # k, v: [T, Hkv, D]   k_cache, v_cache: [S, Hkv, L, D]   slot, pos: [T] int
    check_tensor("k_cache", k_cache, (None, None, None, None), dtypes=FLOAT_DTYPES)
    S, HKV, L, D = k_cache.shape
    check_tensor("v_cache", v_cache, (S, HKV, L, D), dtype=k_cache.dtype, device=k_cache.device)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same strides.")
    check_tensor("k", k, (None, HKV, D), dtypes=FLOAT_DTYPES, device=k_cache.device)
    T = k.shape[0]
    check_tensor("v", v, (T, HKV, D), dtype=k.dtype, device=k_cache.device)
    check_tensor("slot", slot, (T,), dtypes=(torch.int32, torch.int64), device=k_cache.device)
    check_tensor("pos", pos, (T,), dtypes=(torch.int32, torch.int64), device=k_cache.device)
    if T:
        launch(_kv_append_kernel, (T,), k, v, k_cache, v_cache, slot, pos, HKV, D, k.stride(0), k.stride(1),
                                v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                BLOCK_H=next_pow2(HKV), BLOCK_D=next_pow2(D))


def reference(k, v, k_cache, v_cache, slot, pos) -> None:
    k_cache[slot, :, pos] = k.to(k_cache.dtype)
    v_cache[slot, :, pos] = v.to(v_cache.dtype)


def cost(tokens: int, n_kv_heads: int, head_dim: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.kv_append(tokens, n_kv_heads, head_dim, act_dtype=d, kv_dtype=d)
