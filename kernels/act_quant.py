"""Dynamic fp8 e4m3 activation quantization: x [M, K] (bf16 / fp16 / fp32) -> values e4m3 [M, K] + fp32 scales.

Two layouts (the activation formats of ``roofline.precision.formats``): per token ("fp8": one scale per row,
scales [M]; the W8A8 GEMM of per-tensor and per-channel weights) and 1 x 128 groups ("fp8-group": one scale per
128 consecutive input features of a row, scales [M, cdiv(K, 128)]; DeepSeek-V3's ``act_quant`` for its 128 x 128
weight blocks). Per group g of a row, in fp32: amax = max |x|, scale = amax / 448, value = x * (448 / amax)
clamped to +-448 and rounded to e4m3 (to nearest, ties to even); an all-zero group stores 0 with scale 0 (the
8-bit KV cache's convention, ``kernels.quant.quantize_kv_rows``). So |x - value * scale| <= 2^-4 |x| (normal
e4m3: 3 mantissa bits) + 2^-10 scale (half the subnormal step), plus the fp32 arithmetic of 448 / amax.

The kernel: grid (cdiv(M, BLOCK_M), groups); a program takes BLOCK_M rows of one group and walks it in BLOCK_K
columns twice (the amax, then the values): one step for 128-groups, cdiv(K, BLOCK_K) for a whole row. The
rounding to e4m3 is done in fp32 first (``e4m3_round``: integer rounding of the mantissa, ties to even; the
subnormals by adding 1.5 x 2^14), so the cast stores a value e4m3 represents exactly. That is what the Triton
interpreter needs: its fp32 -> e4m3 cast drops the carry of a mantissa that rounds up into the next binade
(31.7 -> 16, not 32: 105 of 8,192 random values wrong); on a GPU the cast of an exact value is exact, so both
run the same arithmetic and the interpreter tests the kernel itself.

``reference`` is the torch peer (the same fp32 arithmetic; torch's own cast rounds correctly): bit-exact with the
kernel. ``cost`` reads the byte counts from the registry (``roofline.precision``): the input read in its dtype,
the e4m3 values and fp32 scales written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline.cost import Cost
from roofline.precision import act_format, weight_bytes
from roofline.precision.formats import FLOAT_BYTES

from ._common import FLOAT_DTYPES, cdiv, check_tensor, dtype_name, next_pow2
from ._launch import launch

E4M3_MAX = 448.0
GROUP = 128                      # DeepSeek's activation group (its weight block's K side)
FP8 = torch.float8_e4m3fn


@triton.jit
def e4m3_round(y):
    """fp32 y (|y| <= 448) rounded to the nearest e4m3 value (ties to even), still fp32 (module docstring)."""
    u = y.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFFF + ((u >> 20) & 1)) & 0xFFF00000          # 23 -> 3 mantissa bits; a carry bumps the exponent
    r = u.to(tl.float32, bitcast=True)
    sub = (y + 24576.0) - 24576.0                              # |y| < 2^-6: multiples of 2^-9 (the subnormals)
    sub = tl.where(sub == 0.0, y * 0.0, sub)                   # keep -0's sign, as the cast does
    return tl.where(tl.abs(y) < 0.015625, sub, r)


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, G, stride_xm, stride_qm, stride_sm, stride_sg,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    g = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    k_lo = g * G
    k_hi = tl.minimum(k_lo + G, K)
    amax = tl.zeros((BLOCK_M,), tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        m = rmask[:, None] & (cols < k_hi)[None, :]
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=m, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), 1))
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full((BLOCK_M,), 448.0, tl.float32), tl.where(amax > 0, amax, 1.0)),
                   0.0)                                         # IEEE division (Triton's / is approximate)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        m = rmask[:, None] & (cols < k_hi)[None, :]
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=m, other=0.0)
        y = tl.minimum(tl.maximum(x.to(tl.float32) * inv[:, None], -448.0), 448.0)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_qm + cols[None, :], e4m3_round(y).to(tl.float8e4nv),
                 mask=m)
    tl.store(s_ptr + rows.to(tl.int64) * stride_sm + g * stride_sg,
             tl.math.div_rn(amax, tl.full((BLOCK_M,), 448.0, tl.float32)), mask=rmask)


def group_of(fmt) -> int:
    """Input features one scale covers for activation format ``fmt`` (a name or a ``Format``): 0 = the whole row."""
    f = act_format(fmt) if isinstance(fmt, str) else fmt
    if f.element != "e4m3" or f.scales.none:
        raise ValueError(f"act_quant writes fp8 e4m3 activations with dynamic scales, not {f.describe()}.")
    return f.scales.k


def act_quant_config(M: int, K: int, group: int) -> dict:
    """BLOCK_K = the group (128) or 512 columns a step along a whole row; BLOCK_M rows so a tile holds about 4K
    elements (16 rows of 128, 8 of 512)."""
    bk = min(next_pow2(group), 512) if group else min(512, max(16, next_pow2(K)))
    bm = max(1, min(16, 4096 // bk, next_pow2(M)))
    return dict(block_m=bm, block_k=bk, num_warps=4)


def scales_shape(M: int, K: int, group: int) -> tuple:
    return (M, cdiv(K, group)) if group else (M,)


def act_quant(x: torch.Tensor, fmt="fp8", *, out=None, **config) -> tuple:
    """(values e4m3 [..., K], fp32 scales [...] per token or [..., cdiv(K, 128)] per 1 x 128 group) of ``x``
    [..., K] with the Triton kernel; ``fmt`` an fp8 activation format ("fp8" per token, "fp8-group")."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    group = group_of(fmt)
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    q, s = out if out is not None else (torch.empty(x.shape, dtype=FP8, device=x.device),
                                        torch.empty(scales_shape(M, K, group), dtype=torch.float32, device=x.device))
    check_tensor("q", q, tuple(x.shape), dtype=FP8, device=x.device)
    check_tensor("scales", s, scales_shape(M, K, group), dtype=torch.float32, device=x.device)
    if M == 0 or K == 0:
        return q, s.view(*x.shape[:-1], *s.shape[1:])
    c = dict(act_quant_config(M, K, group), **config)
    q2 = q.view(-1, K)
    s2 = s.view(M, -1)
    launch(_act_quant_kernel, (cdiv(M, c["block_m"]), s2.shape[1]), x2, q2, s2, M, K, group or K,
           x2.stride(0), q2.stride(0), s2.stride(0), s2.stride(1),
           BLOCK_M=c["block_m"], BLOCK_K=c["block_k"], num_warps=c["num_warps"])
    return q, s.view(*x.shape[:-1], *s.shape[1:])


def grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] as [rows, groups, g] (g = ``group``, or K for one per row), the last group padded with zeros."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    g = group or max(K, 1)
    n = cdiv(K, g)
    return torch.nn.functional.pad(x2, (0, n * g - K)).view(x2.shape[0], n, g)


def reference(x: torch.Tensor, fmt="fp8") -> tuple:
    """The torch peer: the kernel's fp32 arithmetic, torch's cast (bit-exact with the kernel)."""
    group = group_of(fmt)
    K = x.shape[-1]
    xp = grouped(x.float(), group)
    M, n, g = xp.shape
    amax = xp.abs().amax(-1)                                                   # [M, groups]
    inv = torch.where(amax > 0, torch.full_like(amax, E4M3_MAX).div(torch.where(amax > 0, amax, torch.ones_like(amax))),
                      torch.zeros_like(amax))            # tensor / tensor: 448 / t would be t.reciprocal() * 448
    q = (xp * inv[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8).view(M, n * g)[:, :K]
    s = amax.div(torch.full_like(amax, E4M3_MAX))
    s = s if group else s[:, 0]
    return q.reshape(x.shape).contiguous(), s.view(*x.shape[:-1], *s.shape[1:])


def dequantize(q: torch.Tensor, s: torch.Tensor, group: int, dtype=torch.float64) -> torch.Tensor:
    """values [..., K] x their scales (per token [...] or per group [..., cdiv(K, g)]) -> ``dtype``."""
    K = q.shape[-1]
    sc = s.to(dtype)[..., None] if not group else s.to(dtype).repeat_interleave(group, -1)[..., :K]
    return q.to(dtype) * sc


def cost(tokens: int, features: int, dtype="bf16", fmt="fp8") -> Cost:
    """Bytes: the input read in its dtype, the e4m3 values and their fp32 scales written (``weight_bytes`` of the
    activation format over a [K, tokens] tensor: a scale per token or per token per group); FLOPs: an abs-max,
    a multiply and a rounding per element, not counted (memory-bound, like the norms' elementwise work)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    f = act_format(fmt)
    written = weight_bytes(f, features, tokens, d)
    return Cost(flops=0.0, bytes=tokens * features * FLOAT_BYTES[d] + written)
