"""Weight-only int4 linear with group-wise scales: y[M, N] = x[M, K] @ dequant(W), two weights per byte.

Packing layout (``pack`` / ``unpack``; the reference and the kernel read exactly this):

    qweight  uint8 [N, K/2]   byte (n, j) holds k = 2j in its LOW nibble and k = 2j+1 in its HIGH nibble;
                              each nibble u in 0..15 stands for u - 8 (so -8..7)
    scales   [K/g, N]         one scale per group of g consecutive input rows (k // g) per output channel
    zeros    [K/g, N] | None  with ``zero_point``: an offset per group (tinygemm's "zero", a float)
    dequant:  w[k, n] = (u[n, k] - 8) * scales[k // g, n] + (zeros[k // g, n] if zero points else 0)

Scales and zero points are in the activation dtype. g = ``group_size`` is 128 by default, 32 or 64
allowed (``roofline.workload.INT4_GROUPS``), and must divide K. Quantization (``quantize``), per group:
symmetric: s = absmax / 7, u = clamp(round(w / s), -8, 7) + 8; with a zero point: s = (max - min) / 15,
u = clamp(round((w - min) / s), 0, 15), zero = min + 8 s (so (u - 8) s + zero = u s + min). Either
way |w - dequant(w)| <= s / 2.

The kernel is the bf16 linear's (``kernels.linear``: grid, grouped tile order, skinny / prefill
tiles and split-K from ``linear_config``) with BLOCK_K at most g, so a K tile lies in one group:
it loads the packed bytes of its [BLOCK_K, BLOCK_N] tile (half a byte per weight from DRAM; each
byte is read for both of its rows, from L1), shifts out the nibble of each row (k odd: the high
one), converts u - 8 to the activation dtype (exact) and takes one ``tl.dot`` per tile, whose fp32
result is scaled by the group's scales before it joins the accumulator; a zero point adds
zero[n] x sum_k x[m, k] over the tile (with zero points at most 3 stages: 4 spilled on sm_80). Under
the interpreter every load is upcast to fp32.

The torch backend runs the ecosystem's int4 GEMM (``prepare_torch``: CPU
``aten._weight_int4pack_mm_for_cpu``, torch >= 2.5; CUDA ``aten._weight_int4pack_mm``, bf16) on its
own packing of the same values; a shape the op refuses runs a dequantize reference, labelled so; a
torch with no int4 op is a one-line error.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F
from roofline.errors import RooflineError

from ._common import FLOAT_DTYPES, INTERPRET, check_tensor, dtype_name
from ._launch import launch
from .linear import grouped_tile, store_tile, add_bias, check_bias, gemm_io, linear_config, split_k_buffers
from . import quant_weight
from .quant_weight import QuantWeight, check_group, op_missing, register_format, remake


@triton.jit
def _linear_int4_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, p_ptr, lock_ptr, M, N, K, K_PER_SPLIT, SPLIT, bias_ptr,
                        stride_xm, stride_xk, stride_wn, stride_wk, stride_sg, stride_ym, stride_yn,
                        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ZERO_POINT: tl.constexpr,
                        UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, BIAS: tl.constexpr):
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
        byte = tl.load(w_ptr + (offs_k[:, None] // 2) * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn,
                       mask=kmask[:, None], other=0).to(tl.int32)                         # [BLOCK_K, BLOCK_N]
        u = (byte >> ((offs_k[:, None] % 2) * 4)) & 0xF                                   # this row's nibble
        g = k0 // GROUP                                                                   # the tile's one group
        s = tl.load(s_ptr + g * stride_sg + offs_n).to(tl.float32)                        # [BLOCK_N]
        if UPCAST:
            a = a.to(tl.float32)
            b = (u - 8).to(tl.float32)
        else:
            b = (u - 8).to(a.dtype)                                                       # exact: -8..7
        acc += tl.dot(a, b, input_precision=DOT_PREC) * s[None, :]
        if ZERO_POINT:
            z = tl.load(z_ptr + g * stride_sg + offs_n).to(tl.float32)
            acc += tl.sum(a.to(tl.float32), 1)[:, None] * z[None, :]
    store_tile(acc, y_ptr, p_ptr, lock_ptr, bias_ptr, pid, pid_k, pid_m, pid_n, M, N, SPLIT, stride_ym, stride_yn,
                BLOCK_M, BLOCK_N, SPLIT_K, BIAS)


def linear_int4_config(M: int, N: int, K: int, group_size: int, dtype=torch.bfloat16, device="cpu", *,
                       zero_point: bool = False, **overrides) -> dict:
    """The bf16 linear's rule (``linear_config``), with BLOCK_K at most the group size (a tile in one group);
    with zero points at most 3 stages (the row sums' registers: 4 stages spilled 8 B per thread on sm_80)."""
    c = linear_config(M, N, K, dtype, device, **overrides)
    if c["block_k"] > group_size:
        c = linear_config(M, N, K, dtype, device, **{**overrides, "block_k": group_size})
    if group_size % c["block_k"]:
        raise ValueError(f"block_k ({c['block_k']}) must divide the int4 group size ({group_size}).")
    if zero_point:
        c["num_stages"] = min(c["num_stages"], 3)
    return c


def run_config(qw: QuantWeight, M: int, dtype, device) -> dict:
    """The tiles ``linear_int4`` runs ``qw`` with for M rows (``linear_int4_config``)."""
    K, N = qw.shape
    return linear_int4_config(M, N, K, qw.group_size, dtype, device, zero_point=qw.zeros is not None)


def linear_int4(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                **config) -> torch.Tensor:
    """y[..., N] = x[..., K] @ dequant(qw) (+ bias[N], in the epilogue) with the Triton kernel. ``config``
    overrides block sizes / splits."""
    # x: [..., K]   qw.qweight: uint8 [N, K/2]   qw.scales (qw.zeros): [K/g, N]   y: [..., N]
    if not isinstance(qw, QuantWeight) or qw.dtype != "int4":
        raise ValueError(f"qw must be an int4 QuantWeight (kernels.quant.quantize_weight(w, 'int4')), got "
                         f"{getattr(qw, 'dtype', type(qw).__name__)}.")
    K, N = qw.shape
    G = qw.group_size
    check_tensor("qweight", qw.qweight, (N, K // 2), dtype=torch.uint8, contiguous_last=False)
    check_tensor("x", x, dtypes=FLOAT_DTYPES, device=qw.device)
    check_tensor("scales", qw.scales, (K // G, N), dtype=x.dtype, device=qw.device)
    if qw.zeros is not None:
        check_tensor("zeros", qw.zeros, (K // G, N), dtype=x.dtype, device=qw.device)
        if qw.zeros.stride() != qw.scales.stride():
            raise ValueError("zeros and scales must have the same strides.")
    check_bias(bias, N, x)
    x2, out, y2 = gemm_io(x, K, N, out, "the int4 weight")
    M = x2.shape[0]
    if M == 0:
        return out
    c = linear_int4_config(M, N, K, G, x.dtype, x.device, zero_point=qw.zeros is not None, **config)
    prec = "ieee" if (x.dtype == torch.float32 or INTERPRET) else "tf32"
    tiles, split, part, locks = split_k_buffers(M, N, c, y2)
    w, s = qw.qweight, qw.scales
    z = qw.zeros if qw.zeros is not None else s
    launch(_linear_int4_kernel, (tiles, split), x2, w, s, z, y2, part, locks, M, N, K, c["k_per_split"], split,
           s if bias is None else bias, x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), s.stride(0), y2.stride(0),
           y2.stride(1), GROUP=G, BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], BLOCK_K=c["block_k"],
           GROUP_M=c["group_m"], SPLIT_K=split > 1, ZERO_POINT=qw.zeros is not None, UPCAST=INTERPRET,
           DOT_PREC=prec, BIAS=bias is not None, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


# ---------------------------------------------------------------- the layout: pack, unpack, quantize

def pack(u: torch.Tensor) -> torch.Tensor:
    """u int [N, K] of 0..15 -> uint8 [N, K/2]: k = 2j in the low nibble of byte j, k = 2j+1 in the high one."""
    u = u.to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def unpack(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> int32 [N, K] of 0..15 (the inverse of ``pack``)."""
    lo, hi = (qweight & 0xF).to(torch.int32), (qweight >> 4).to(torch.int32)
    return torch.stack([lo, hi], dim=-1).reshape(qweight.shape[0], -1)


def quantize(w: torch.Tensor, *, group_size: int = 128, zero_point: bool = False, name: str = "w") -> QuantWeight:
    """Group-wise int4 of ``w`` [K, N] (see the module docstring); scales (and zeros) in ``w``'s dtype."""
    g = check_group(group_size)
    K, N = w.shape
    if K % g:
        raise RooflineError(f"int4 group size {g} must divide {name}'s in-features K = {K}: give a group size of "
                            f"{' or '.join(str(x) for x in (32, 64, 128) if K % x == 0) or 'none of 32/64/128'}"
                            f"{'' if any(K % x == 0 for x in (32, 64, 128)) else ' (use int8 weights)'}.")
    wg = w.float().t().reshape(N, K // g, g)                                           # [N, K/g, g]
    if zero_point:
        lo, hi = wg.amin(-1), wg.amax(-1)
        s = torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(hi))
        u = torch.round((wg - lo[..., None]) / s[..., None]).clamp(0, 15)
        zeros = (lo + 8 * s).t().contiguous().to(w.dtype)                              # [K/g, N]
    else:
        amax = wg.abs().amax(-1)
        s = torch.where(amax > 0, amax / 7, torch.ones_like(amax))
        u = torch.round(wg / s[..., None]).clamp(-8, 7) + 8
        zeros = None
    qweight = pack(u.reshape(N, K).to(torch.int32))
    return QuantWeight("int4", qweight, s.t().contiguous().to(w.dtype), zeros, K, N, group_size=g)


def dequantize(qw: QuantWeight, dtype=torch.float32) -> torch.Tensor:
    """[K, N] from the packed values and the stored (dtype-rounded) scales and zeros, computed in fp64."""
    g = qw.group_size
    u = unpack(qw.qweight).double() - 8                                               # [N, K]
    s = qw.scales.double().t().repeat_interleave(g, dim=1)                            # [N, K]
    w = u * s
    if qw.zeros is not None:
        w = w + qw.zeros.double().t().repeat_interleave(g, dim=1)
    return w.t().to(dtype)


def reference(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The dequantize reference: x @ dequant(qw) (+ bias) in fp64 (fp64 in, fp64 out; otherwise x's dtype out)."""
    y = x.double() @ dequantize(qw, torch.float64)
    y = y if bias is None else y + bias.double()
    return y if x.dtype == torch.float64 else y.to(x.dtype)


# ---------------------------------------------------------------- the torch backend

def _scales_and_zeros(qw: QuantWeight) -> torch.Tensor:
    """tinygemm's [K/g, N, 2]: (scale, zero), w = (u - 8) x scale + zero (zero 0 when symmetric)."""
    z = qw.zeros if qw.zeros is not None else torch.zeros_like(qw.scales)
    return torch.stack([qw.scales, z], dim=-1).contiguous()


def prepare_torch(qw: QuantWeight) -> None:
    """The ecosystem's int4 GEMM on its own packing (tried once on a tiny input), else the dequantize reference.

    CPU: ``_convert_weight_to_int4pack_for_cpu`` + ``_weight_int4pack_mm_for_cpu`` (torch >= 2.5), or torch
    2.4's ``_convert_weight_to_int4pack`` (int32 [N, K]) + ``_weight_int4pack_mm``. CUDA: the uint8 packing
    (torch >= 2.5: even k in the high nibble) or 2.4's int32 one, + ``_weight_int4pack_mm`` (bf16, sm_80+).
    No such op at all: ``op_missing`` (a one-line error naming what runs instead).
    """
    aten = quant_weight.aten()
    dev, g = qw.device, qw.group_size
    u = unpack(qw.qweight)                                                            # int32 [N, K]
    sz = _scales_and_zeros(qw)
    probe = torch.zeros(1, qw.in_features, dtype=qw.act_dtype, device=dev)
    tries = []
    if dev.type == "cpu":
        if hasattr(aten, "_weight_int4pack_mm_for_cpu") and hasattr(aten, "_convert_weight_to_int4pack_for_cpu"):
            tries.append(("aten._weight_int4pack_mm_for_cpu", aten._weight_int4pack_mm_for_cpu,
                          lambda: aten._convert_weight_to_int4pack_for_cpu(u, 1)))
        elif hasattr(aten, "_weight_int4pack_mm") and hasattr(aten, "_convert_weight_to_int4pack"):
            tries.append(("aten._weight_int4pack_mm", aten._weight_int4pack_mm,
                          lambda: aten._convert_weight_to_int4pack(u, 1)))
        missing = ("int4 weights", "_weight_int4pack_mm_for_cpu", "2.5")
    else:
        if hasattr(aten, "_weight_int4pack_mm") and hasattr(aten, "_convert_weight_to_int4pack"):
            hi_first = ((u[:, 0::2] << 4) | u[:, 1::2]).to(torch.uint8)
            for inner in (8, 4, 2):
                tries.append(("aten._weight_int4pack_mm", aten._weight_int4pack_mm,
                              lambda i=inner: aten._convert_weight_to_int4pack(hi_first, i)))
                tries.append(("aten._weight_int4pack_mm", aten._weight_int4pack_mm,
                              lambda i=inner: aten._convert_weight_to_int4pack(u, i)))
        missing = ("int4 weights", "_weight_int4pack_mm", "2.4")
    if not tries:
        raise op_missing(*missing)
    why = ""
    for label, op, packer in tries:
        try:
            packed = packer()
            got = op(probe, packed, g, sz)
            if got.shape != (1, qw.out_features):
                raise RuntimeError(f"output shape {tuple(got.shape)}")
            qw.torch_impl, qw.torch_args = label, (op, packed, g, sz)
            return
        except (RuntimeError, NotImplementedError) as e:
            why = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
    qw.torch_impl = (f"dequantize reference: x @ dequant(W) per call ({tries[0][0]} refuses "
                     f"K={qw.in_features} N={qw.out_features} g={g} {dtype_name(qw.act_dtype)}: {why})")
    qw.torch_args = ()


def torch_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The torch peer; a bias is added after the GEMM (``add_bias``: the int4 op has no bias epilogue)."""
    if qw.torch_args:
        op, packed, g, sz = qw.torch_args
        y = op(x.reshape(-1, qw.in_features).contiguous(), packed, g, sz).view(*x.shape[:-1], -1)
    else:
        y = x @ dequantize(qw, x.dtype)
    return add_bias(y, bias)


def cost(tokens: int, in_features: int, out_features: int, dtype="bf16", group_size: int = 128,
         zero_point: bool = False, *, bias: bool = False):
    """The roofline formula's Cost: K*N/2 weight bytes + (K/g) x N scales (x 2 with zero points)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.linear(tokens, in_features, out_features, weight_dtype="int4", act_dtype=d, group_size=group_size,
                    zero_point=zero_point, bias=bias)


# ---------------------------------------------------------------- tensor-parallel shards

def slice_rows(q, axis: str, start: int, stop: int):
    """``kernels.quant.slice_quant`` for int4 (a ``QuantWeight`` or, with a leading E, ``QuantExperts``): the
    [.., K/g, N] scales (and zeros) follow both axes, so an "in" slice must keep whole groups (a ValueError here;
    ``kernels.quant.check_tp_groups`` says so in one line before anything runs)."""
    z = q.zeros
    if axis == "out":
        return remake(q, qweight=q.qweight[..., start:stop, :], scales=q.scales[..., start:stop],
                      zeros=None if z is None else z[..., start:stop], out_features=stop - start)
    g = q.group_size
    if start % g or stop % g:
        raise ValueError(f"an int4 slice of input rows {start}:{stop} cuts a group of {g}: shard at whole groups.")
    gs = slice(start // g, stop // g)
    return remake(q, qweight=q.qweight[..., start // 2: stop // 2], scales=q.scales[..., gs, :],
                  zeros=None if z is None else z[..., gs, :], in_features=stop - start)


def pad_out(q: QuantWeight, n: int) -> QuantWeight:
    """``q`` with zero output channels up to ``n``: zero values (u = 0), zero scales and zeros, so 0."""
    extra = n - q.out_features
    cols = lambda t: None if t is None else torch.cat([t, t.new_zeros(t.shape[0], extra)], dim=1)  # noqa: E731
    return remake(q, qweight=torch.cat([q.qweight, q.qweight.new_zeros(extra, q.qweight.shape[1])]),
                  scales=cols(q.scales), zeros=cols(q.zeros), out_features=n)


register_format("int4", quantize=quantize, dequantize=dequantize, prepare_torch=prepare_torch,
                torch_linear=torch_linear, triton_linear=linear_int4, triton_config=run_config, slice=slice_rows,
                pad_out=pad_out)
