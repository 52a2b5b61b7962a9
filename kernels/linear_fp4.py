"""Weight-only FP4 linear (mxfp4, nvfp4; W4A16): y[M, N] = x[M, K] @ dequant(W), two e2m1 weights per byte.

The layout, the formats and their dequantization are ``kernels.fp4``'s: qweight uint8 [N, K/2] (low nibble even
k), scales [N, K/g] (mxfp4: e8m0 per 32; nvfp4: e4m3 per 16, plus an fp32 tensor scale). The kernel is the bf16
linear's (``kernels.linear``: grid, grouped tile order, skinny / prefill tiles and split-K from
``linear_config``): each [BLOCK_K, BLOCK_N] tile is loaded as stored (half a byte per weight and a scale byte
per g weights from DRAM), dequantized in registers (``fp4.fp4_tile``: fp32, exact, then the activation dtype,
exact again) and fed to ``tl.dot`` with fp32 accumulation; nvfp4's tensor scale multiplies the accumulator once,
after the K loop (before split-K's partials and the bias). BLOCK_K needs no relation to g (every element carries
its own block's scale). Under the interpreter every load is upcast to fp32 (the kernel runs there: tested on the
CPU). sm_100: the same dequantizing path (``kernels.fp4``'s docstring says why not ``tl.dot_scaled``).
Cost: ``fp4.linear_cost`` (the registry's ``weight_bytes``). This module registers the FP4 formats
(``register_format``: ``kernels.fp4``'s functions, this linear on the triton backend).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, INTERPRET, check_tensor
from ._launch import launch
from . import fp4
from .fp4 import check_fp4_weight, fp4_tile, is_fp4, scale_bytes_view, scale_code
from .linear import check_bias, gemm_io, grouped_tile, linear_config, split_k_buffers, store_tile
from .quant_weight import QuantWeight, register_format


@triton.jit
def _linear_fp4_kernel(x_ptr, w_ptr, s_ptr, ts_ptr, y_ptr, p_ptr, lock_ptr, M, N, K, K_PER_SPLIT, SPLIT, bias_ptr,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sk, stride_ym, stride_yn,
                       GROUP: tl.constexpr, SCALE: tl.constexpr, TENSOR_SCALE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, BIAS: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M     # wrapped rows/cols: computed, never stored
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < k_hi
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk,
                    mask=kmask[None, :], other=0.0)                                        # [BLOCK_M, BLOCK_K]
        b = fp4_tile(w_ptr, s_ptr, offs_k, offs_n, kmask[:, None], stride_wk, stride_wn, stride_sk, stride_sn,
                     GROUP, SCALE)                                                         # fp32 [BLOCK_K, BLOCK_N]
        if UPCAST:
            a = a.to(tl.float32)
        else:
            b = b.to(a.dtype)                                                              # exact (fp4.py)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    if TENSOR_SCALE:
        acc = acc * tl.load(ts_ptr)
    store_tile(acc, y_ptr, p_ptr, lock_ptr, bias_ptr, pid, pid_k, pid_m, pid_n, M, N, SPLIT, stride_ym, stride_yn,
               BLOCK_M, BLOCK_N, SPLIT_K, BIAS)


def linear_fp4_config(M: int, N: int, K: int, dtype=torch.bfloat16, device="cpu", **overrides) -> dict:
    """The bf16 linear's rule (``kernels.linear.linear_config``): BLOCK_K is free of the FP4 block."""
    return linear_config(M, N, K, dtype, device, **overrides)


def run_config(qw: QuantWeight, M: int, dtype, device) -> dict:
    """The tiles ``linear_fp4`` runs ``qw`` with for M rows (``linear_fp4_config``)."""
    K, N = qw.shape
    return linear_fp4_config(M, N, K, dtype, device)


def linear_fp4(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
               **config) -> torch.Tensor:
    """y[..., N] = x[..., K] @ dequant(qw) (+ bias[N], in the epilogue) with the Triton kernel; ``config``
    overrides ``linear_config``'s block sizes / splits."""
    # x: [..., K]   qw.qweight: uint8 [N, K/2]   qw.scales: [N, K/g] (e8m0 uint8 | e4m3)   y: [..., N]
    if not isinstance(qw, QuantWeight) or not is_fp4(qw):
        raise ValueError(f"qw must be an FP4 QuantWeight (kernels.fp4.quantize(w, 'mxfp4' or 'nvfp4')), got "
                         f"{getattr(qw, 'dtype', type(qw).__name__)}.")
    K, N = qw.shape
    check_tensor("x", x, dtypes=FLOAT_DTYPES, device=qw.device)
    check_fp4_weight("qw", qw, (), K, N, x.dtype, qw.device)
    check_bias(bias, N, x)
    x2, out, y2 = gemm_io(x, K, N, out, f"the {qw.dtype} weight")
    M = x2.shape[0]
    if M == 0:
        return out
    c = linear_fp4_config(M, N, K, x.dtype, x.device, **config)
    prec = "ieee" if (x.dtype == torch.float32 or INTERPRET) else "tf32"
    tiles, split, part, locks = split_k_buffers(M, N, c, y2)
    w, s = qw.qweight, scale_bytes_view(qw)
    ts = qw.tensor_scale if qw.tensor_scale is not None else s
    launch(_linear_fp4_kernel, (tiles, split), x2, w, s, ts, y2, part, locks, M, N, K, c["k_per_split"], split,
           s if bias is None else bias, x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), s.stride(0),
           s.stride(1), y2.stride(0), y2.stride(1), GROUP=qw.group_size, SCALE=scale_code(qw.dtype),
           TENSOR_SCALE=qw.tensor_scale is not None, BLOCK_M=c["block_m"], BLOCK_N=c["block_n"],
           BLOCK_K=c["block_k"], GROUP_M=c["group_m"], SPLIT_K=split > 1, UPCAST=INTERPRET, DOT_PREC=prec,
           BIAS=bias is not None, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


for _name in fp4.FP4:
    register_format(_name, quantize=lambda w, _n=_name, **kw: fp4.quantize(w, _n, **kw), dequantize=fp4.dequantize,
                    prepare_torch=fp4.prepare_torch, torch_linear=fp4.torch_linear, triton_linear=linear_fp4,
                    triton_config=run_config,
                    slice=fp4.slice_rows, pad_out=fp4.pad_out)
