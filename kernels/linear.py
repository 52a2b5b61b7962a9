"""Linear layer / GEMM: y[M, N] = x[M, K] @ w[K, N], for any M.

One Triton kernel, its tile chosen by ``linear_config`` from the shape and the SM count:

* M > 64 (prefill): 128x128x64 tiles (fp32 inputs: 64x64x32), grouped tile order so
  neighbouring programs share weight tiles in L2 (the Triton matmul tutorial's scheme).
  A short prompt against a narrow weight (M = 128, N = 1024: 8 tiles on 132 SMs) takes
  smaller tiles, then splits K until every SM has a program.
* M <= 64 (decode, skinny): BLOCK_M = max(16, next_pow2(M)) and split-K, so that even at
  M = 1 there are about two programs per SM streaming disjoint slices of the weight.

Split-K stays one launch: each program stores its fp32 partial [SPLIT, M, N], then takes a
ticket from a per-tile counter (an acq_rel atomic); the program that arrives last adds the
partials, writes y and resets the counter to 0 for the next call. Every split runs at least
``num_stages`` K-iterations, so the software pipeline reaches its steady state. The counters
live in one small int32 buffer per device, so two split-K calls must not run concurrently on
different streams.

Loads are upcast to fp32 for the math only under the interpreter (it has no bf16
arithmetic); on a GPU bf16/fp16 operands go to the tensor cores natively and accumulate
in fp32. fp32 inputs use IEEE dots (not TF32), so "fp32" means fp32; their tiles are the
ones ``roofline check --compile`` finds spill-free on sm_80 and sm_90 (BLOCK_K = 32).

Check it:  python -c "from kernels.check import run_checks; print(run_checks()[0])"
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name, next_pow2, num_sms
from ._launch import launch

SKINNY_M = 64
PROGRAMS_PER_SM = 2       # skinny: about two programs per SM stream disjoint weight slices
MAX_SPLIT = 32
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), largest first: the first whose tiles alone reach the
# programs wanted is taken, else the last, split along K. BLOCK_M None = max(16, next_pow2(M)).
PREFILL_TILES = {"fp32": [(64, 64, 32, 4, 3)],
                 "16bit": [(128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (64, 64, 64, 4, 3)]}
SKINNY_TILES = {"fp32": [(None, 64, 32, 4, 4), (None, 32, 32, 4, 4)],
                "16bit": [(None, 64, 128, 4, 4), (None, 32, 128, 4, 4)]}
# 16-bit prefill with N or K not a multiple of 16: no 16-byte vector loads (an address per element), so the
# 128x128 tile does not fit in registers: at M=1000 N=1100 K=700 (`roofline check --full`) 128x128x64 with
# split-K took 255 registers and spilled 0.7-1 KB per thread on sm_80 and sm_90 (`roofline check --compile`).
# (fp32 at 64x64x32 with 4 warps: 0.5-5.7 KB in the int8 / int4 kernels.) Every model preset's N and K are
# multiples of 16 and keep PREFILL_TILES.
UNALIGNED_TILES = {"fp32": [(64, 64, 32, 8, 3)], "16bit": [(128, 64, 64, 8, 3), (64, 64, 64, 4, 3)]}


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` in grouped order: GROUP_M row-tiles walk the same column
    tiles together, so neighbouring programs share weight tiles in L2 (the Triton matmul tutorial's
    scheme). Shared by every linear kernel (bf16/fp16/fp32, int8, int4)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size


@triton.jit
def store_tile(acc, y_ptr, p_ptr, lock_ptr, bias_ptr, pid, pid_k, pid_m, pid_n, M, N, SPLIT, stride_ym, stride_yn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, BIAS: tl.constexpr):
    """Write a tile's fp32 ``acc`` (+ the bias b[N], with BIAS) to y; with SPLIT_K, the one-launch split-K
    protocol (module docstring): store the partial, take a ticket, and the last program of the tile adds
    the partials, then the bias (once), and resets its counter. The one copy of this protocol: every
    linear kernel ends with it."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    y = y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :] * stride_yn
    if SPLIT_K:
        # partials [SPLIT, M, N] fp32, contiguous; the last program of this tile to finish adds them up
        mn = rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(p_ptr + pid_k.to(tl.int64) * M * N + mn, acc, mask=mask)
        tl.debug_barrier()                                   # every thread's partial is issued ...
        ticket = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel")  # ... before it is released
        if ticket == SPLIT - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, SPLIT):                        # .cg: from L2, never a stale L1 line
                total += tl.load(p_ptr + s * M * N + mn, mask=mask, other=0.0, cache_modifier=".cg")
            if BIAS:
                total += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + pid, 0)                # ready for the next call
    else:
        if BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_kernel(x_ptr, w_ptr, y_ptr, p_ptr, lock_ptr, M, N, K, K_PER_SPLIT, SPLIT, bias_ptr,
                   stride_xm, stride_xk, stride_wk, stride_wn, stride_ym, stride_yn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
                   BIAS: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

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
        b = tl.load(w_ptr + offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn,
                    mask=kmask[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    store_tile(acc, y_ptr, p_ptr, lock_ptr, bias_ptr, pid, pid_k, pid_m, pid_n, M, N, SPLIT, stride_ym, stride_yn,
                BLOCK_M, BLOCK_N, SPLIT_K, BIAS)


def _check_block(name: str, value) -> None:
    if value is not None and (int(value) < 16 or int(value) & (int(value) - 1)):
        raise ValueError(f"{name} must be a power of two of at least 16 (tl.dot needs operands of 16 or more "
                         f"on a GPU), got {value}.")


def _split_for(tiles: int, k_iters: int, stages: int, want: int) -> int:
    """K splits that bring ``tiles`` to ``want`` programs, each split at least ``stages`` iterations long."""
    if tiles >= want:
        return 1
    need = min(cdiv(want, tiles), max(1, k_iters // stages), MAX_SPLIT)
    return cdiv(k_iters, max(1, k_iters // need))


def linear_config(M: int, N: int, K: int, dtype=torch.bfloat16, device="cpu", *,
                  block_m=None, block_n=None, block_k=None, split_k=None) -> dict:
    """Tile, warps, stages and K splits for [M, K] x [K, N] on ``device``; explicit arguments override.

    Programs wanted: one per SM for M > 64 (a full wave), two per SM for the skinny path.
    The tile is the largest candidate whose tiles reach that alone; otherwise the smallest,
    split along K (at most 32 splits of at least ``num_stages`` iterations); 16-bit prefill shapes
    with N or K not a multiple of 16 choose from ``UNALIGNED_TILES`` (no spills). ``note`` says
    why a grid still has fewer programs than SMs (too little work to split).
    """
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_block(name, v)
    sms = num_sms(device)
    kind = "fp32" if dtype == torch.float32 else "16bit"
    skinny = M <= SKINNY_M
    aligned = N % 16 == 0 and K % 16 == 0
    cands = (SKINNY_TILES if skinny else PREFILL_TILES if aligned else UNALIGNED_TILES)[kind]
    want = PROGRAMS_PER_SM * sms if skinny else sms
    if block_m or block_n or block_k:
        cands = cands[:1]
    for bm, bn, bk, warps, stages in cands:
        bm = block_m or bm or max(16, next_pow2(M))
        bn, bk = block_n or bn, block_k or bk
        if skinny and bm == 64 and kind == "fp32" and not block_m:
            warps, stages = 8, 3                     # 4 warps spill on sm_80 at 64 x 64 x 32
        tiles, k_iters = cdiv(M, bm) * cdiv(N, bn), cdiv(K, bk)
        split = _split_for(tiles, k_iters, stages, want) if split_k is None else max(1, min(int(split_k), k_iters))
        if tiles * split >= (sms if skinny else want) or split_k is not None:
            break
    k_per_split = cdiv(k_iters, split) * bk
    split = cdiv(K, k_per_split)
    programs = tiles * split
    note = "" if programs >= sms else (f"{programs} programs for {sms} SMs: {tiles} tiles of {bm}x{bn}, and K = {K} "
                                       f"gives at most {split} splits of {stages}+ iterations")
    return dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, split_k=split, k_per_split=k_per_split,
                num_warps=warps, num_stages=stages, programs=programs, note=note)


_LOCKS: dict = {}   # device -> list of int32 counter buffers (older ones kept alive for captured graphs)


def gemm_io(x: torch.Tensor, K: int, N: int, out: torch.Tensor | None, weight: str):
    """(x as rows [M, K], the output [..., N], its rows [M, N]) for a linear launcher: the output is
    allocated in x's dtype unless given, and checked; ``weight`` names the weight in the message."""
    if x.dim() == 0 or x.shape[-1] != K:
        raise ValueError(f"x must have shape [..., {K}] to match {weight} [{K}, {N}], got {list(x.shape)}.")
    x2 = x.reshape(-1, K)
    if out is None:
        out = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    check_tensor("out", out, tuple(x.shape[:-1]) + (N,), dtype=x.dtype)
    return x2, out, out.view(-1, N)


def split_k_buffers(M: int, N: int, c: dict, y2: torch.Tensor):
    """(tiles, splits, fp32 partials [SPLIT, M, N], the per-tile counters) for a linear launch of config ``c``;
    without split-K the output stands in for both buffers (the kernel never touches them)."""
    tiles = cdiv(M, c["block_m"]) * cdiv(N, c["block_n"])
    split = c["split_k"]
    if split == 1:
        return tiles, split, y2, y2
    return tiles, split, torch.empty(split, M, N, dtype=torch.float32, device=y2.device), _tile_locks(y2.device, tiles)


def _tile_locks(device, n: int) -> torch.Tensor:
    bufs = _LOCKS.setdefault(str(device), [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
    return bufs[-1]


def check_bias(bias, N: int, x: torch.Tensor):
    """``bias`` [N] in x's dtype on x's device (contiguous), or None; a ValueError naming what is wrong."""
    if bias is not None:
        check_tensor("bias", bias, (N,), dtype=x.dtype, device=x.device)
    return bias


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
           **config) -> torch.Tensor:
    """y[..., N] = x[..., K] @ w[K, N] (+ bias[N], added in the epilogue: by the tile that finishes under
    split-K) with the Triton kernel. ``config`` overrides block sizes."""
    # x: [..., K]   w: [K, N]   bias: [N]   y: [..., N]
    # Any strides: the kernel takes both of w's (a tied lm_head is embed.t(), contiguous along K, not N).
    check_tensor("w", w, (None, None), dtypes=FLOAT_DTYPES, contiguous_last=False)
    K, N = w.shape
    check_tensor("x", x, dtype=w.dtype, device=w.device)
    check_bias(bias, N, x)
    x2, out, y2 = gemm_io(x, K, N, out, "w")
    M = x2.shape[0]
    if M == 0:
        return out
    c = linear_config(M, N, K, w.dtype, w.device, **config)
    upcast = INTERPRET
    prec = "ieee" if (w.dtype == torch.float32 or upcast) else "tf32"
    tiles, split, part, locks = split_k_buffers(M, N, c, y2)
    launch(_linear_kernel, (tiles, split), x2, w, y2, part, locks, M, N, K, c["k_per_split"], split,
           w if bias is None else bias, x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), y2.stride(0),
           y2.stride(1),
           BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], BLOCK_K=c["block_k"], GROUP_M=c["group_m"],
           SPLIT_K=split > 1, UPCAST=upcast, DOT_PREC=prec, BIAS=bias is not None, num_warps=c["num_warps"],
           num_stages=c["num_stages"])
    return out


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: x @ w (+ bias) in the inputs' dtype (cuBLAS on a GPU; the bias fused by addmm)."""
    if bias is None:
        return torch.matmul(x, w)
    return torch.addmm(bias, x.reshape(-1, w.shape[0]), w).view(*x.shape[:-1], w.shape[1])


def add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y + bias in place (a quantized GEMM's torch peer has no bias epilogue: one more pass over y)."""
    return y if bias is None else y.add_(bias)


def cost(tokens: int, in_features: int, out_features: int, dtype="bf16", *, bias: bool = False):
    """The roofline formula's Cost (roofline.formulas.linear)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.linear(tokens, in_features, out_features, weight_dtype=d, act_dtype=d, bias=bias)
