"""Weight-only int8 linear: y[M, N] = x[M, K] @ (q[K, N] * s[N]), weights read once as int8.

Quantization (``quantize``): symmetric, one scale per output channel, s[n] = max_k |w[k, n]| / 127,
q = round(w / s) in [-127, 127] (round half to even; -128 is never used, so the range is symmetric).
Storage: ``qweight`` int8 [N, K] (K contiguous: the layout ``torch.ops.aten._weight_int8pack_mm``
takes, so both backends read the same tensor) and ``scales`` [N] in the activation dtype.

The kernel is the bf16 linear's (``kernels.linear``: the same grid, grouped tile order, skinny /
prefill tiles from ``linear_config`` and split-K in one launch), with the int8 tile dequantized in
the inner loop: each [BLOCK_K, BLOCK_N] tile is loaded as int8 (1 byte per weight from DRAM) and
converted to the activation dtype in registers (exact: |q| <= 127 fits bf16's 8-bit mantissa),
then fed to ``tl.dot``. The per-channel scale is constant along K, so it is applied once to the
fp32 accumulator (sum_k x[m,k] q[k,n] s[n] = s[n] sum_k x[m,k] q[k,n]), before a split's partial
is stored. Under the interpreter every load is upcast to fp32 (it has no bf16 arithmetic).

The torch backend runs ``aten._weight_int8pack_mm`` (``prepare_torch``); where this torch or device
lacks it, a dequantize reference (x @ (q * s)), labelled so in the record's config.

Check it:  python -c "from kernels.check import run_checks; [print(r) for r in run_checks(parts=('quant',))]"
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, INTERPRET, check_tensor, dtype_name
from ._launch import launch
from .linear import grouped_tile, store_tile, add_bias, check_bias, gemm_io, linear_config, split_k_buffers
from . import quant_weight
from .quant_weight import QuantWeight, register_format, remake

QMAX = 127


@triton.jit
def _linear_int8_kernel(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, lock_ptr, M, N, K, K_PER_SPLIT, SPLIT, bias_ptr,
                        stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
                        BIAS: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)   # grouped order (L2 reuse)

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
        q = tl.load(w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn,
                    mask=kmask[:, None], other=0)                                          # int8 [BLOCK_K, BLOCK_N]
        if UPCAST:
            a = a.to(tl.float32)
            b = q.to(tl.float32)
        else:
            b = q.to(a.dtype)                          # dequantized in registers: exact for |q| <= 127
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    acc = acc * tl.load(s_ptr + offs_n).to(tl.float32)[None, :]     # the per-channel scale, once per tile
    store_tile(acc, y_ptr, p_ptr, lock_ptr, bias_ptr, pid, pid_k, pid_m, pid_n, M, N, SPLIT, stride_ym, stride_yn,
                BLOCK_M, BLOCK_N, SPLIT_K, BIAS)


def linear_int8_config(M: int, N: int, K: int, dtype=torch.bfloat16, device="cpu", **overrides) -> dict:
    """The bf16 linear's rule (``kernels.linear.linear_config``: skinny split-K for M <= 64, tiles for prefill)."""
    return linear_config(M, N, K, dtype, device, **overrides)


def run_config(qw: QuantWeight, M: int, dtype, device) -> dict:
    """The tiles ``linear_int8`` runs ``qw`` with for M rows (``linear_int8_config``)."""
    K, N = qw.shape
    return linear_int8_config(M, N, K, dtype, device)


def linear_int8(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                **config) -> torch.Tensor:
    """y[..., N] = x[..., K] @ dequant(qw) (+ bias[N], in the epilogue) with the Triton kernel. ``config``
    overrides block sizes / splits."""
    # x: [..., K]   qw.qweight: int8 [N, K]   qw.scales: [N]   y: [..., N]
    if not isinstance(qw, QuantWeight) or qw.dtype != "int8":
        raise ValueError(f"qw must be an int8 QuantWeight (kernels.quant.quantize_weight(w, 'int8')), got "
                         f"{getattr(qw, 'dtype', type(qw).__name__)}.")
    K, N = qw.shape
    check_tensor("qweight", qw.qweight, (N, K), dtype=torch.int8, contiguous_last=False)
    check_tensor("x", x, dtypes=FLOAT_DTYPES, device=qw.device)
    check_tensor("scales", qw.scales, (N,), dtype=x.dtype, device=qw.device)
    check_bias(bias, N, x)
    x2, out, y2 = gemm_io(x, K, N, out, "the int8 weight")
    M = x2.shape[0]
    if M == 0:
        return out
    c = linear_int8_config(M, N, K, x.dtype, x.device, **config)
    prec = "ieee" if (x.dtype == torch.float32 or INTERPRET) else "tf32"
    tiles, split, part, locks = split_k_buffers(M, N, c, y2)
    w = qw.qweight
    launch(_linear_int8_kernel, (tiles, split), x2, w, qw.scales, y2, part, locks, M, N, K, c["k_per_split"], split,
           qw.scales if bias is None else bias,
           x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), y2.stride(0), y2.stride(1),
           BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], BLOCK_K=c["block_k"], GROUP_M=c["group_m"],
           SPLIT_K=split > 1, UPCAST=INTERPRET, DOT_PREC=prec, BIAS=bias is not None, num_warps=c["num_warps"],
           num_stages=c["num_stages"])
    return out


# ---------------------------------------------------------------- quantize, dequantize, references

def quantize(w: torch.Tensor) -> QuantWeight:
    """Symmetric per-output-channel int8 of ``w`` [K, N]: s = absmax over K / 127, q = round(w / s)."""
    K, N = w.shape
    wf = w.float()
    amax = wf.abs().amax(0)                                          # [N]
    s = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))    # an all-zero column: q = 0, any scale
    q = torch.round(wf / s).clamp(-QMAX, QMAX).to(torch.int8)        # [K, N]
    return QuantWeight("int8", q.t().contiguous(), s.to(w.dtype), None, K, N)


def dequantize(qw: QuantWeight, dtype=torch.float32) -> torch.Tensor:
    """[K, N]: q * s, computed in fp64 from the stored (dtype-rounded) scales."""
    return (qw.qweight.t().double() * qw.scales.double()[None, :]).to(dtype)


def reference(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The dequantize reference: x @ (q * s) (+ bias) in fp64 (fp64 in, fp64 out; otherwise x's dtype out)."""
    y = x.double() @ dequantize(qw, torch.float64)
    y = y if bias is None else y + bias.double()
    return y if x.dtype == torch.float64 else y.to(x.dtype)


def prepare_torch(qw: QuantWeight) -> None:
    """``aten._weight_int8pack_mm`` when this torch has it and it runs this device / dtype; else the dequantize
    reference (both labelled in ``qw.torch_impl``)."""
    op = getattr(quant_weight.aten(), "_weight_int8pack_mm", None)
    if op is not None:
        try:
            op(torch.zeros(1, qw.in_features, dtype=qw.act_dtype, device=qw.device), qw.qweight, qw.scales)
            qw.torch_impl, qw.torch_args = "aten._weight_int8pack_mm", (qw.qweight, qw.scales)
            return
        except (RuntimeError, NotImplementedError):
            pass
    qw.torch_impl = ("dequantize reference: x @ (q * s) per call (aten._weight_int8pack_mm is missing for "
                     f"{qw.device.type} {dtype_name(qw.act_dtype)} in torch {torch.__version__})")
    qw.torch_args = ()


def torch_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The torch peer; a bias is added after the GEMM (``add_bias``: the int8 op has no bias epilogue)."""
    if qw.torch_args:
        q, s = qw.torch_args
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, qw.in_features), q, s).view(*x.shape[:-1], -1)
    else:
        y = x @ (qw.qweight.t().to(x.dtype) * qw.scales[None, :])
    return add_bias(y, bias)


def cost(tokens: int, in_features: int, out_features: int, dtype="bf16", *, bias: bool = False):
    """The roofline formula's Cost: int8 weights + one scale per output channel (activation dtype)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.linear(tokens, in_features, out_features, weight_dtype="int8", act_dtype=d, bias=bias)


# ---------------------------------------------------------------- tensor-parallel shards

def slice_rows(q, axis: str, start: int, stop: int):
    """``kernels.quant.slice_quant`` for int8 (a ``QuantWeight`` or, with a leading E, ``QuantExperts``): an "out"
    slice takes rows of qweight [.., N, K] and of the per-output-channel scales [.., N]; an "in" slice columns of
    qweight, the scales whole (each channel's scale covers all of K: a row-parallel layer's scales are replicated,
    as in vLLM)."""
    if axis == "out":
        return remake(q, qweight=q.qweight[..., start:stop, :], scales=q.scales[..., start:stop],
                      out_features=stop - start)
    return remake(q, qweight=q.qweight[..., start:stop], in_features=stop - start)


def pad_out(q: QuantWeight, n: int) -> QuantWeight:
    """``q`` with zero output channels up to ``n``: zero values, zero scales."""
    extra = n - q.out_features
    return remake(q, qweight=torch.cat([q.qweight, q.qweight.new_zeros(extra, q.qweight.shape[1])]),
                  scales=torch.cat([q.scales, q.scales.new_zeros(extra)]), out_features=n)


register_format("int8", quantize=quantize, dequantize=dequantize, prepare_torch=prepare_torch,
                torch_linear=torch_linear, triton_linear=linear_int8, triton_config=run_config, slice=slice_rows,
                pad_out=pad_out)
