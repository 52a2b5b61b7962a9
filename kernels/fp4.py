"""FP4 weights (mxfp4, nvfp4): the layouts, quantize / dequantize in torch, the Triton helpers that dequantize a
tile in registers, the torch backend's path and the costs. ``kernels.linear_fp4`` (the linear) and ``kernels.moe``
(the fused experts, QUANT 3 / 4) run them; the experts' cost is ``kernels.moe.stored_cost``.

Layout (the checkpoints' own: gpt-oss's ``*_blocks`` / ``*_scales`` reshaped, ModelOpt's ``weight`` /
``weight_scale`` / ``weight_scale_2``), for a [K, N] (in x out) weight:

    qweight  uint8 [N, K/2]   byte (n, j) holds k = 2j in its LOW nibble and k = 2j+1 in its HIGH nibble (as
                              transformers' ``integrations/mxfp4.py`` unpacks gpt-oss: ``blk & 0x0F`` -> even
                              positions, ``blk >> 4`` -> odd ones; triton's ``dot_scaled``: "the first element in
                              lower bits"); gpt-oss's [.., N, K/32, 16] blocks are this reshaped
    nibble   e2m1: bit 3 the sign, bits 2..0 index (0, 0.5, 1, 1.5, 2, 3, 4, 6) (``E2M1_VALUES``, transformers'
                              ``FP4_VALUES`` order: codes 8..15 are the negatives)
    scales   [N, K/g]         mxfp4: g = 32, uint8 e8m0 (2^(b - 127), OCP MX v1.0); nvfp4: g = 16,
                              torch.float8_e4m3fn
    tensor_scale              nvfp4 only: one fp32 (ModelOpt's ``weight_scale_2``); experts: [E]
    dequant:  w[k, n] = e2m1(code[n, k]) * scale[n, k // g] (* tensor_scale)

The group g, the scale types and the tensor scale come from ``roofline.precision.formats`` (``FP4``).
Quantization: mxfp4 as OCP's reference (shared exponent floor(log2(amax)) - 2, e2m1's emax; values saturate at
6); nvfp4 as ModelOpt (tensor scale amax / (6 * 448), block scale amax_b / 6 / tensor scale rounded to e4m3).
Values round to the nearest e2m1, ties to the even code. Both are exact on representable values (a tensor whose
blocks hold e2m1 values times their scale).

In the kernels (``fp4_tile``): the byte of each row's pair is loaded, the row's nibble shifted out, decoded to
fp32 arithmetically (no table: exponent and mantissa bits placed into an fp32), the scale byte decoded likewise
(e8m0: the byte is the fp32 exponent; e4m3: its exponent rebiased, subnormals by hand) and multiplied: exact in
fp32, and exact again in bf16 (an e2m1 value has 2 significant bits, an e4m3 scale 4, e8m0 is a power of two:
at most 6 bits, inside bf16's 8 and its exponent range). NB fp16's narrower range can flush tiny scales
(below 2^-24 x ...): the references say so by differing. nvfp4's fp32 tensor scale multiplies the fp32
accumulator once, after the K loop. Under ``TRITON_INTERPRET=1`` this runs as is (uint8 loads, integer ops,
bitcasts to fp32; the dot in fp32): the kernels themselves are tested on the CPU.

``tl.dot_scaled`` (triton 3.9) takes an e2m1 rhs with e8m0 scales (g 32) or e4m3 scales (g 16), but with our
bf16 / fp16 activations (W4A16) it lowers on sm_100 to ``tcgen05.mma kind::f16`` after upcasting the weights:
the same arithmetic as this dequantizing path; ``kind::mxf4`` / ``kind::mxf4nvf4`` need the activations in e2m1
too (W4A4), which these kernels do not quantize. So sm_100 compiles the dequantizing path.

The torch backend: torch has no FP4 GEMM on the CPU (``torch._scaled_mm`` takes float8 operands; its FP4
variants need sm_100 and cuBLASLt), so ``torch_linear`` is a dequantize reference (x @ dequant(W) per call),
labelled so in ``torch_impl``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline.cost import Cost
from roofline import formulas as F
from roofline.errors import RooflineError
from roofline.precision.formats import weight_bytes, weight_format as precision_format

from ._common import FLOAT_DTYPES, check_tensor, dtype_name
from .linear import add_bias
from .quant_weight import QuantExperts, QuantWeight, remake

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX, E4M3_MAX = 6.0, 448.0
FP4 = {n: precision_format(n) for n in ("mxfp4", "nvfp4")}    # the registry's entries this module runs
SCALE_CODES = {"e8m0": 1, "e4m3": 2}                         # fp4_tile's SCALE constexpr per scale type
SCALE_STORAGE = {"e8m0": torch.uint8, "e4m3": torch.float8_e4m3fn}
_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)              # between consecutive positive e2m1 values


# ---------------------------------------------------------------- Triton: a tile dequantized in registers

@triton.jit
def fp4_tile(w_ptr, s_ptr, offs_k, offs_n, mask, stride_wk, stride_wn, stride_sk, stride_sn, GROUP: tl.constexpr,
             SCALE: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] fp32 tile of an FP4 weight stored [N, K/2] (low nibble: even k) with scales
    [N, K/GROUP] (module docstring); each row loads the byte it shares with its pair and shifts out its nibble.
    The nibble c: exponent bits e, mantissa bit m, sign bit 3 (e = 0: m * 0.5, else the fp32 with exponent
    e - 1 and mantissa m). The scale byte b: SCALE 1 e8m0 (b is the fp32 exponent: 2^(b - 127); b = 0 reads 0),
    2 e4m3 (bias 7 rebiased to fp32's; subnormals m / 512). One function: the compile check's reach test looks
    one call deep."""
    byte = tl.load(w_ptr + (offs_k[:, None] // 2).to(tl.int64) * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn,
                   mask=mask, other=0).to(tl.int32)
    c = (byte >> ((offs_k[:, None] % 2) * 4)) & 0xF
    b = tl.load(s_ptr + (offs_k[:, None] // GROUP).to(tl.int64) * stride_sk + offs_n[None, :].to(tl.int64) * stride_sn,
                mask=mask, other=0).to(tl.int32)
    e = (c >> 1) & 3
    m = c & 1
    v = tl.where(e == 0, m.to(tl.float32) * 0.5, (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True))
    v = tl.where((c & 8) != 0, -v, v)
    if SCALE == 1:
        s = (b << 23).to(tl.float32, bitcast=True)
    else:
        se = (b >> 3) & 15
        sm = b & 7
        s = tl.where(se == 0, sm.to(tl.float32) * 0.001953125,
                     (((se + 120) << 23) | (sm << 20)).to(tl.float32, bitcast=True))
        s = tl.where((b & 128) != 0, -s, s)
    return v * s


# ---------------------------------------------------------------- torch: the formats

def fp4_format(name: str):
    """The registry entry of FP4 format ``name``; another name is refused in one line."""
    if name not in FP4:
        raise RooflineError(f"{name!r} is not an FP4 weight format: choose one of {', '.join(FP4)}.")
    return FP4[name]


def is_fp4(w) -> bool:
    return getattr(w, "dtype", None) in FP4


def scale_code(name: str) -> int:
    """The kernels' SCALE constexpr of format ``name`` (1: e8m0, 2: e4m3)."""
    return SCALE_CODES[fp4_format(name).scales.dtype]


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """uint8 codes of the e2m1 values nearest ``v`` (|v| saturates at 6; a tie goes to the even code)."""
    a = v.abs().clamp(max=E2M1_MAX).contiguous()
    mids = torch.tensor(_MIDS, dtype=a.dtype, device=a.device)
    idx = torch.bucketize(a, mids)                                     # a == mids[i] -> i (the lower code)
    tie = (idx < len(_MIDS)) & (a == mids[idx.clamp(max=len(_MIDS) - 1)]) & (idx % 2 == 1)
    idx = idx + tie.to(idx.dtype)
    return (idx | torch.where(torch.signbit(v) & (idx > 0), 8, 0)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """codes (any int dtype, 0..15) -> values (transformers' lookup table)."""
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)[codes.long()]


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes -> uint8 [N, K/2], k = 2j low nibble of byte j."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [.., K/2] -> int64 codes [.., K] (the inverse of ``pack``)."""
    lo, hi = (qweight & 0xF).long(), (qweight >> 4).long()
    return torch.stack([lo, hi], dim=-1).reshape(*qweight.shape[:-1], -1)


def scale_values(qw, dtype=torch.float64) -> torch.Tensor:
    """[N, K/g] scales as numbers: e8m0 2^(b - 127), e4m3 as stored."""
    s = qw.scales
    return torch.exp2(s.to(dtype) - 127) if fp4_format(qw.dtype).scales.dtype == "e8m0" else s.to(dtype)


def quantize(w: torch.Tensor, fmt: str = "mxfp4", *, name: str = "w") -> QuantWeight:
    """``w`` [K, N] float -> an FP4 ``QuantWeight`` (module docstring); act dtype = ``w``'s."""
    f = fp4_format(fmt)
    g = f.group_size
    K, N = w.shape
    if K % g:
        raise RooflineError(f"{fmt} needs {name}'s in-features K = {K} to be a multiple of its block of {g}.")
    wg = w.float().t().reshape(N, K // g, g)                                          # [N, K/g, g]
    amax = wg.abs().amax(-1)
    ts = None
    if f.scales.dtype == "e8m0":
        e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - 2, torch.full_like(amax, -127))
        e = e.clamp(-127, 127)
        sv = torch.exp2(e)
        scales = (e + 127).to(torch.uint8)
    else:
        tmax = float(amax.max()) if amax.numel() else 0.0
        t = tmax / (E2M1_MAX * E4M3_MAX) if tmax > 0 else 1.0
        ts = torch.tensor(t, dtype=torch.float32, device=w.device)
        scales = (amax / E2M1_MAX / float(ts)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        sv = scales.float() * ts
    codes = encode_e2m1(wg / torch.where(sv > 0, sv, torch.ones_like(sv))[..., None])
    return QuantWeight(fmt, pack(codes.reshape(N, K)), scales, None, K, N, g, tensor_scale=ts, act=w.dtype)


def dequantize(qw: QuantWeight, dtype=torch.float32) -> torch.Tensor:
    """[K, N] from the codes and the stored scales, computed in fp64."""
    g = qw.group_size
    w = decode_e2m1(unpack(qw.qweight)) * scale_values(qw).repeat_interleave(g, dim=-1)   # [N, K]
    if qw.tensor_scale is not None:
        w = w * qw.tensor_scale.double()
    return w.t().to(dtype)


def quantize_experts(w: torch.Tensor, fmt: str = "mxfp4", *, name: str = "experts") -> QuantExperts:
    """E float weights [E, K, N] quantized expert by expert (``quantize``), stacked: qweight [E, N, K/2], scales
    [E, N, K/g], nvfp4's tensor scales [E]."""
    if w.dim() != 3:
        raise ValueError(f"{name} must be [E, K, N] expert weights, got shape {list(w.shape)}.")
    qs = [quantize(w[e], fmt, name=name) for e in range(w.shape[0])]
    ts = torch.stack([q.tensor_scale for q in qs]) if qs[0].tensor_scale is not None else None
    q0 = qs[0]
    return QuantExperts(fmt, torch.stack([q.qweight for q in qs]), torch.stack([q.scales for q in qs]), None,
                        q0.in_features, q0.out_features, q0.group_size, tensor_scale=ts, act=w.dtype)


def check_fp4_weight(name: str, w, lead: tuple, K: int, N: int, act_dtype, device) -> None:
    """``w`` (a ``QuantWeight`` with ``lead`` = (), or ``QuantExperts`` with (E,)) holds an FP4 [K, N] weight as
    ``quantize`` stores it; a ValueError naming what is wrong."""
    f = fp4_format(w.dtype)
    g = f.group_size
    if K % g:
        raise ValueError(f"{name}'s in-features K = {K} must be a multiple of {w.dtype}'s block of {g}.")
    if w.act_dtype not in FLOAT_DTYPES or w.act_dtype != act_dtype:
        raise ValueError(f"{name}'s activation dtype must be {act_dtype}, got {w.act_dtype}.")
    check_tensor(f"{name}.qweight", w.qweight, (*lead, N, K // 2), dtype=torch.uint8, device=device)
    check_tensor(f"{name}.scales", w.scales, (*lead, N, K // g), dtype=SCALE_STORAGE[f.scales.dtype], device=device)
    if f.scales.tensor:
        check_tensor(f"{name}.tensor_scale", w.tensor_scale, lead, dtype=torch.float32, device=device)


def scale_bytes_view(w) -> torch.Tensor:
    """The scales as the kernels load them: uint8 bytes (e4m3 reinterpreted)."""
    return w.scales if w.scales.dtype == torch.uint8 else w.scales.view(torch.uint8)


# ---------------------------------------------------------------- the torch backend and the references

def prepare_torch(qw: QuantWeight) -> None:
    qw.torch_impl = ("dequantize reference: x @ dequant(W) per call (torch has no W4A16 FP4 GEMM; "
                     "torch._scaled_mm's FP4 needs sm_100)")
    qw.torch_args = ()


def torch_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The torch peer: x @ the weight dequantized to x's dtype (+ bias)."""
    if not qw.torch_impl:
        prepare_torch(qw)
    return add_bias(x @ dequantize(qw, x.dtype), bias)


def reference(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequant(qw) (+ bias) in fp64; x's dtype out (fp64 in, fp64 out)."""
    y = x.double() @ dequantize(qw, torch.float64)
    y = y if bias is None else y + bias.double()
    return y if x.dtype == torch.float64 else y.to(x.dtype)


def linear_cost(tokens: int, in_features: int, out_features: int, fmt: str, dtype="bf16", *,
                bias: bool = False) -> Cost:
    """2*T*K*N FLOPs (+ T*N with a bias); bytes: the weight as stored (``roofline.precision.weight_bytes``: K*N/2
    + its scales + nvfp4's tensor scale) + x T*K + y T*N (+ the bias N) in the activation dtype."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    c = F.linear(tokens, in_features, out_features, weight_dtype=d, act_dtype=d, bias=bias)
    wb = F.linear(0, in_features, out_features, weight_dtype=d, act_dtype=d).bytes               # K*N act bytes
    return Cost(c.flops, c.bytes - wb + weight_bytes(fp4_format(fmt), in_features, out_features, d))


# ---------------------------------------------------------------- tensor-parallel shards

def slice_rows(q, axis: str, start: int, stop: int):
    """``kernels.quant.slice_quant`` for FP4 (a ``QuantWeight`` or, with a leading E, ``QuantExperts``): qweight
    [.., N, K/2] and scales [.., N, K/g] by rows ("out") or by whole blocks of g input features ("in": else a
    ValueError; ``kernels.quant.check_tp_scales`` says so in one line first); nvfp4's tensor scale(s) kept."""
    if axis == "out":
        return remake(q, qweight=q.qweight[..., start:stop, :], scales=q.scales[..., start:stop, :],
                      out_features=stop - start)
    g = q.group_size
    if start % g or stop % g:
        raise ValueError(f"a {q.dtype} slice of input features {start}:{stop} cuts a block of {g}: shard at whole "
                         "blocks.")
    return remake(q, qweight=q.qweight[..., start // 2: stop // 2], scales=q.scales[..., start // g: stop // g],
                  in_features=stop - start)


def pad_out(q: QuantWeight, n: int) -> QuantWeight:
    """``q`` with zero output channels up to ``n``: code 0 (+0.0) and scale byte 0, so they dequantize to 0."""
    extra = n - q.out_features
    rows = lambda t: torch.cat([t, t.new_zeros(extra, t.shape[1])])  # noqa: E731
    return remake(q, qweight=rows(q.qweight), scales=rows(q.scales), out_features=n)
