"""Linear layer / GEMM: y[M, N] = x[M, K] @ w[K, N], for any M.

Two launch shapes of one Triton kernel:

* M > 64 (prefill): 128x128x64 tiles (fp32 accumulators), grouped tile order so
  neighbouring programs share weight tiles in L2 (the Triton matmul tutorial's scheme).
* M <= 64 (decode, skinny): BLOCK_M = max(16, next_pow2(M)) and split-K, so that even at
  M = 1 there are about two programs per SM streaming disjoint slices of the weight;
  partial sums go to an fp32 buffer [SPLIT, M, N] and a second kernel adds and casts them.

Loads are upcast to fp32 for the math only under the interpreter (it has no bf16
arithmetic); on a GPU bf16/fp16 operands go to the tensor cores natively and accumulate
in fp32. fp32 inputs use IEEE dots (not TF32), so "fp32" means fp32.

Check it:  python -c "from kernels.check import run_checks; print(run_checks()[0])"
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name, next_pow2, num_sms

SKINNY_M = 64


@triton.jit
def _linear_kernel(x_ptr, w_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                   stride_xm, stride_xk, stride_wk, stride_wn, stride_ys, stride_ym, stride_yn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_M row-tiles walk the same column tiles together (L2 reuse).
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    # Rows/cols past the edge wrap (modulo) instead of masking: they compute garbage that is
    # never stored, and the hot loop keeps unmasked M/N loads (the tutorial's trick).
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < k_hi
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk,
                    mask=kmask[None, :], other=0.0)
        b = tl.load(w_ptr + offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :] * stride_wn,
                    mask=kmask[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y = y_ptr + pid_k * stride_ys + rows[:, None].to(tl.int64) * stride_ym + cols[None, :] * stride_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _splitk_reduce_kernel(p_ptr, y_ptr, MN, SPLIT, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def linear_config(M: int, N: int, K: int, dtype=torch.bfloat16, device="cpu", *,
                  block_m=None, block_n=None, block_k=None, split_k=None) -> dict:
    """Block sizes and split count for [M, K] x [K, N]; explicit arguments override."""
    fp32 = dtype == torch.float32
    if M <= SKINNY_M:
        bm, bn, bk, warps, stages = max(16, next_pow2(M)), 64, (64 if fp32 else 128), 4, 4
    else:
        bm, bn, bk, warps, stages = (64, 64, 32, 4, 3) if fp32 else (128, 128, 64, 8, 3)
    bm, bn, bk = block_m or bm, block_n or bn, block_k or bk
    k_iters = cdiv(K, bk)
    if split_k is None:
        tiles = cdiv(M, bm) * cdiv(N, bn)
        split_k = 1 if M > SKINNY_M else max(1, min(2 * num_sms(device) // tiles, k_iters, 32))
    split_k = max(1, min(int(split_k), k_iters))
    k_per_split = cdiv(k_iters, split_k) * bk
    split_k = cdiv(K, k_per_split)
    return dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, split_k=split_k, k_per_split=k_per_split,
                num_warps=warps, num_stages=stages)


def linear(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None, **config) -> torch.Tensor:
    """y[..., N] = x[..., K] @ w[K, N] with the Triton kernel. ``config`` overrides block sizes."""
    # x: [..., K]   w: [K, N]   y: [..., N]
    check_tensor("w", w, (None, None), dtypes=FLOAT_DTYPES)
    K, N = w.shape
    check_tensor("x", x, dtype=w.dtype, device=w.device)
    if x.dim() == 0 or x.shape[-1] != K:
        raise ValueError(f"x must have shape [..., {K}] to match w [{K}, {N}], got {list(x.shape)}.")
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], N, dtype=w.dtype, device=w.device)
    check_tensor("out", out, tuple(x.shape[:-1]) + (N,), dtype=w.dtype)
    y2 = out.view(-1, N)
    if M == 0:
        return out
    c = linear_config(M, N, K, w.dtype, w.device, **config)
    upcast = INTERPRET
    prec = "ieee" if (w.dtype == torch.float32 or upcast) else "tf32"
    grid = (cdiv(M, c["block_m"]) * cdiv(N, c["block_n"]), c["split_k"])
    meta = dict(BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], BLOCK_K=c["block_k"], GROUP_M=c["group_m"],
                UPCAST=upcast, DOT_PREC=prec, num_warps=c["num_warps"], num_stages=c["num_stages"])
    if c["split_k"] == 1:
        _linear_kernel[grid](x2, w, y2, M, N, K, c["k_per_split"], x2.stride(0), x2.stride(1),
                             w.stride(0), w.stride(1), 0, y2.stride(0), y2.stride(1), **meta)
    else:
        part = torch.empty(c["split_k"], M, N, dtype=torch.float32, device=w.device)
        _linear_kernel[grid](x2, w, part, M, N, K, c["k_per_split"], x2.stride(0), x2.stride(1),
                             w.stride(0), w.stride(1), part.stride(0), part.stride(1), part.stride(2), **meta)
        tmp = y2 if y2.is_contiguous() else torch.empty(M, N, dtype=w.dtype, device=w.device)
        _splitk_reduce_kernel[(cdiv(M * N, 1024),)](part, tmp, M * N, c["split_k"], BLOCK=1024)
        if tmp is not y2:
            y2.copy_(tmp)
    return out


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain torch: x @ w in the inputs' dtype (cuBLAS on a GPU)."""
    return torch.matmul(x, w)


def cost(tokens: int, in_features: int, out_features: int, dtype="bf16"):
    """The roofline formula's Cost (roofline.formulas.linear)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.linear(tokens, in_features, out_features, weight_dtype=d, act_dtype=d)
