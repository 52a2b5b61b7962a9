"""Fused mixture-of-experts expert GEMM: every token through its k experts, in two launches over all experts.

    y = moe_experts(x, w_gate, w_up, w_down, weights, ids)      # x [T, H], w_* [E, H, I] / [E, I, H]

As serving engines do it (vLLM's fused_moe is the model; this is our own code):

1. ``moe_align``: the T*k (token, expert) rows ("entries", entry = t*k + j) are sorted by expert and each
   expert's run is padded to a multiple of BLOCK_M, so every block of BLOCK_M rows belongs to one expert
   (``block_expert``). Pure tensor ops, no host sync: the buffers have their largest size (T*k + min(E, T*k)
   * (BLOCK_M - 1) rows) and the kernels read the padded count from a tensor and skip blocks past it, so a
   decode step can be captured in a CUDA graph.
2. ``_moe_gate_up_kernel``: one launch over (blocks x I tiles): gathers the block's token rows of x, two
   accumulators x W_gate[e] and x W_up[e] (+ biases), the activation in fp32, h [T*k, I] stored at the
   entry's row. "silu": silu(g) * u (SwiGLU); "swiglu_oai" (GPT-OSS): g = min(g, limit),
   u = clamp(u, -limit, limit), h = (u + 1) * g * sigmoid(alpha * g); "relu2" (Nemotron-H, ``UNGATED``: w_gate
   None): one accumulator x W_up[e], h = relu(u)^2 (the kernel's GATED false reads no gate).
3. ``_moe_down_kernel``: one launch over (blocks x H tiles): h W_down[e] (+ bias), times the entry's routing
   weight, stored at the entry's row of the partials [T*k, H].
4. The k partial outputs of each token are summed (``torch.sum`` over [T, k, H], fp32 accumulation).

Configurations (``moe_config``): "skinny" (decode: few rows per expert, BLOCK_M = 16, long K tiles) and
"tiled" (prefill: BLOCK_M = 64). Every load is upcast under the interpreter (it has no bf16 arithmetic); on a
GPU bf16/fp16 go to the tensor cores and accumulate in fp32. fp32 uses IEEE dots.

``reference`` loops over experts in fp32 (fp64 with ``compute_dtype``); ``torch_moe`` (the torch backend's
peer) is the same loop in the input dtype. ``cost``: ``roofline.formulas.moe_experts``.

Quantized experts (``w_gate``, ``w_up``, ``w_down`` as ``kernels.quant_weight.QuantExperts``: every expert quantized as
the dense linears are, ``kernels.linear_int8`` / ``kernels.linear_int4``): the same two launches with
``QUANT`` 1 (int8 [E, N, K], a scale per output channel) or 2 (int4, two per byte [E, N, K/2], a scale (and
zero point) per group of ``GROUP`` input rows). Each weight tile is loaded as stored (1 or 1/2 byte per weight
from DRAM) and converted to the activation dtype in registers (exact: |q| <= 127, u - 8 in -8..7), then
``tl.dot`` with fp32 accumulation. int8: the per-channel scale is constant along K, so it multiplies the fp32
accumulators once, after the K loop (before the bias and the activation). int4: BLOCK_K divides the group, so a
K tile lies in one group; each tile's dot is scaled by its group's scales before it joins the accumulator (a
zero point adds zero[n] x the tile's row sums of x). Under the interpreter every load is upcast to fp32.
``torch_moe`` runs each expert's ``QuantWeight`` through the torch backend's quantized GEMM
(``kernels.quant.torch_linear``: aten's int8 / int4 ops, or a dequantize reference, said in ``torch_impl``);
``reference`` multiplies by the dequantized weights in fp32 (fp64). The cost is ``moe_experts``'s with the
weight dtype: 1 or 1/2 byte per weight plus the scales (``formulas.moe_expert_weight_bytes``).

FP4 experts (``kernels.fp4.quantize_experts``: mxfp4 / nvfp4, [E, N, K/2] e2m1 bytes, [E, N, K/g] scales, nvfp4's
fp32 tensor scales [E]): QUANT 3 (mxfp4, e8m0) / 4 (nvfp4, e4m3). Each tile is dequantized in registers
(``fp4.fp4_tile``: exact in fp32, then in the activation dtype) and goes to ``tl.dot`` as a float tile; nvfp4's
tensor scale multiplies each accumulator once, after the K loop (before the bias and the activation). BLOCK_K is
free of the block size. The torch backend and the reference dequantize per expert (``kernels.fp4``); the cost is
``stored_cost`` (the precision registry's ``weight_bytes``).

fp8 experts (``kernels.quant.quantize_experts(w, "fp8" | "fp8-tensor" | "fp8-block")``: e4m3 [E, N, K] with fp32
scales [E, N] per channel, [E, 1] per tensor or [E, cdiv(N, 128), cdiv(K, 128)] per 128 x 128 block), weight-only
(W8A16: the activations stay in their dtype; no ``acts["experts"]`` in the format's registration, so costs follow):
QUANT 5 (scales constant along K: per channel, or per tensor with scale stride 0 along N) multiplies the
accumulators once after the K loop, as int8; QUANT 6 (blocks) takes BLOCK_K dividing 128 (``moe_config``'s
``scale_k``), so a K tile lies in one block row, and scales each tile's dot by its block's scale per column
(n // 128), as int4's groups. Each tile is loaded as bytes and decoded to fp32 with integer ops (``_fp8_tile``:
exact, then exact again in bf16 / fp16), not with an fp8 conversion, so it runs on every target (sm_80 too) and
under the interpreter. The torch peer (``torch_moe``) runs the same arithmetic, x @ the expert dequantized to x's
dtype (``linear_fp8.torch_expert``, said in ``QuantExperts.torch_impl``), not the W8A8 linear. Cost:
``stored_cost``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from roofline import formulas as F
from roofline.errors import RooflineError

from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name
from ._launch import launch
from roofline.cost import Cost
from roofline.precision import weight_bytes, weight_format as precision_format
from roofline.precision.formats import FLOAT_BYTES

from . import linear_fp8 as LF8
from .fp4 import check_fp4_weight, fp4_tile, is_fp4, scale_bytes_view, scale_code
from .quant import torch_linear
from .quant_weight import QuantExperts, check_group, weight_format

ACTIVATIONS = ("silu", "swiglu_oai", "relu2")
UNGATED = ("relu2",)      # up -> act -> down, no gate weight (Nemotron-H): w_gate is None
SKINNY_ROWS = 16          # at most this many rows per expert on average: the skinny (decode) configuration
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) per configuration and dtype kind
# Two accumulators (gate and up) per tile: the 16-bit skinny tile streams K in 64s and the tiled one takes 8 warps
# (16 x 64 x 128 with 4 warps and 64 x 64 x 64 with 4 warps spilled on sm_80 and sm_90 at shapes that are not
# multiples of the tile: roofline check --compile); fp32 IEEE dots: 4 warps spill on sm_80.
CONFIGS = {("skinny", "16bit"): (16, 64, 64, 4, 3), ("skinny", "fp32"): (16, 64, 32, 4, 3),
           ("tiled", "16bit"): (64, 64, 64, 8, 3), ("tiled", "fp32"): (32, 64, 32, 8, 3)}


class MoeAlign(NamedTuple):
    sorted_ids: torch.Tensor     # [P] int32: entries (t*k + j) grouped by expert, padding = T*k
    block_expert: torch.Tensor   # [P / BLOCK_M] int32: each block's expert (E past the padded count)
    n_padded: torch.Tensor       # [1] int32: rows in use (the sum of each expert's padded count)
    counts: torch.Tensor         # [E] int64: entries per expert (the grouped GEMM's load, imbalance shows here)


def moe_align(ids: torch.Tensor, n_experts: int, block_m: int) -> MoeAlign:
    """Sort the T*k entries of ``ids`` [T, k] by expert, each expert's run padded to a multiple of ``block_m``
    (an expert with no tokens gets no block). Stable: within an expert, entries keep their order."""
    E, BM = int(n_experts), int(block_m)
    flat = ids.reshape(-1).to(torch.int64)
    tk, dev = flat.numel(), ids.device
    rows = tk + min(E, tk) * (BM - 1)
    rows = cdiv(rows, BM) * BM
    counts = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + BM - 1) // BM * BM
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    dest = pad_start[e_sorted] + torch.arange(tk, device=dev) - cnt_start[e_sorted]
    sorted_ids = torch.full((rows,), tk, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    starts = torch.arange(0, rows, BM, device=dev)
    block_expert = torch.searchsorted(pad_end, starts, right=True).to(torch.int32)   # E past the last expert
    return MoeAlign(sorted_ids, block_expert, pad_end[-1:].to(torch.int32), counts)


@triton.jit
def _act(g, u, alpha, limit, ACT: tl.constexpr):
    """The expert activation on fp32 gate/up tiles: silu(g) * u, GPT-OSS's clamped SwiGLU, or relu(u)^2 (no gate:
    g is not read)."""
    if ACT == 0:
        h = g / (1.0 + tl.exp(-g)) * u
    elif ACT == 2:
        r = tl.maximum(u, 0.0)
        h = r * r
    else:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        h = (u + 1.0) * (g / (1.0 + tl.exp(-alpha * g)))
    return h


# the kernels' QUANT constexpr (0: float weights); fp8 by its scales' layout (registry): 5 constant along K (per
# channel, per tensor), 6 in 128 x 128 blocks
QUANT_CODES = {"int8": 1, "int4": 2, "mxfp4": 3, "nvfp4": 4,
               **{n: 6 if LF8.fp8_format(n).scales.k else 5 for n in LF8.FORMATS}}
FP4_QUANT = 3                          # QUANT 3, 4: FP4 (kernels.fp4), its SCALE constexpr = QUANT - 2
FP8_QUANT = 5                          # QUANT >= 5: fp8 e4m3 (``_fp8_tile``)
# int4 experts, tiled: BLOCK_K 32 (the int32 nibble tiles of gate and up beside the two accumulators and each tile's
# scaled dot: 64 x 64 x 64 with 8 warps took 255 registers and spilled 152 B on sm_80; 32 takes 172, no spills)
INT4_TILED_BLOCK_K = 32
# fp8 experts, tiled: BLOCK_K 32 too (the decoded e4m3 tiles: 64 x 64 x 64 with 8 warps spilled 588 B per thread on
# sm_80 per channel, 5,976 B with 128 x 128 blocks; sm_90 did not)
FP8_TILED_BLOCK_K = 32


@triton.jit
def _w_tile(w_ptr, offs_k, offs_n, mask, stride_wk, stride_wn, QUANT: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] tile of one expert's weight as stored: float or int8 values (QUANT 0, 1), or int4
    values u - 8 as int32 (QUANT 2: each row loads the byte it shares with its pair (rows 2j, 2j+1) and shifts
    out its own nibble, low for even k: ``kernels.linear_int4``'s packing)."""
    if QUANT == 2:
        byte = tl.load(w_ptr + (offs_k[:, None] // 2).to(tl.int64) * stride_wk + offs_n[None, :] * stride_wn,
                       mask=mask, other=0).to(tl.int32)
        w = ((byte >> ((offs_k[:, None] % 2) * 4)) & 0xF) - 8
    else:
        w = tl.load(w_ptr + offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :] * stride_wn, mask=mask,
                    other=0)
    return w


@triton.jit
def _fp8_tile(w_ptr, offs_k, offs_n, mask, stride_wk, stride_wn):
    """A [BLOCK_K, BLOCK_N] fp32 tile of an fp8 e4m3 weight stored [N, K] (read as its bytes), decoded
    arithmetically (no fp8 conversion: any target, and the interpreter): sign bit 7, exponent bits 6..3 (bias 7),
    mantissa bits 2..0; exponent 0 is subnormal, m * 2^-9; else the fp32 with exponent e - 7 and mantissa m. Exact
    (e4m3 has 4 significant bits). 0x7f / 0xff (NaN) never occur: ``kernels.linear_fp8.quantize`` saturates at
    448."""
    b = tl.load(w_ptr + offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :] * stride_wn, mask=mask,
                other=0).to(tl.int32)
    e = (b >> 3) & 15
    m = b & 7
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True))
    return tl.where((b & 128) != 0, -v, v)


@triton.jit
def _moe_gate_up_kernel(x_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, h_ptr, sorted_ptr, bexp_ptr, npad_ptr,
                        N, K, TK, TOPK, NUM_BLOCKS, stride_xt, stride_we, stride_wk, stride_wn, stride_be, stride_ht,
                        alpha, limit, sg_ptr, su_ptr, zg_ptr, zu_ptr, stride_se, stride_sg, stride_sn, tg_ptr, tu_ptr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr,
                        BIAS: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, QUANT: tl.constexpr,
                        GROUP: tl.constexpr, ZERO_POINT: tl.constexpr, GATED: tl.constexpr):
    # x [T, K]   w_gate, w_up [E, K, N] (quantized: stored [E, N, K] / [E, N, K/2])   h [T*k, N]   (K = H, N = I)
    # scales: int8 [E, N], int4 (and zero points) [E, K/g, N]; FP4 [E, N, K/g] bytes + nvfp4 tensor scales [E]
    # GATED false (relu2: up -> act -> down): no gate weight is read, no gate accumulator kept
    pid = tl.program_id(0)
    pid_m = pid % NUM_BLOCKS                      # neighbouring programs: blocks of one expert, same weight tile
    pid_n = pid // NUM_BLOCKS
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    e = tl.load(bexp_ptr + pid_m).to(tl.int64)
    entry = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = entry < TK
    token = (entry // TOPK).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    wg = wg_ptr + e * stride_we
    wu = wu_ptr + e * stride_we
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        a = tl.load(x_ptr + token[:, None] * stride_xt + offs_k[None, :], mask=valid[:, None] & kmask[None, :],
                    other=0.0)
        w_mask = kmask[:, None] & nmask[None, :]
        if QUANT >= 5:                                   # fp8 e4m3: decoded to fp32 in registers
            if GATED:
                bg = _fp8_tile(wg, offs_k, offs_n, w_mask, stride_wk, stride_wn)
            bu = _fp8_tile(wu, offs_k, offs_n, w_mask, stride_wk, stride_wn)
        elif QUANT >= 3:                                 # FP4: dequantized to fp32 in registers (kernels.fp4)
            if GATED:
                bg = fp4_tile(wg, sg_ptr + e * stride_se, offs_k, offs_n, w_mask, stride_wk, stride_wn, stride_sg,
                              stride_sn, GROUP, QUANT - 2)
            bu = fp4_tile(wu, su_ptr + e * stride_se, offs_k, offs_n, w_mask, stride_wk, stride_wn, stride_sg,
                          stride_sn, GROUP, QUANT - 2)
        elif QUANT == 2:
            if GATED:
                bg = _w_tile(wg, offs_k, offs_n, w_mask, stride_wk, stride_wn, QUANT)
            bu = _w_tile(wu, offs_k, offs_n, w_mask, stride_wk, stride_wn, QUANT)
        else:   # one offset for both tiles (two _w_tile calls cost the float variant a 4 B spill on sm_80)
            w_off = offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :] * stride_wn
            if GATED:
                bg = tl.load(wg + w_off, mask=w_mask, other=0)
            bu = tl.load(wu + w_off, mask=w_mask, other=0)
        if UPCAST:
            a = a.to(tl.float32)
            if GATED:
                bg = bg.to(tl.float32)
            bu = bu.to(tl.float32)
        elif QUANT != 0:
            if GATED:                                    # dequantized in registers: exact (|q| <= 127, -8..7, FP4, e4m3)
                bg = bg.to(a.dtype)
            bu = bu.to(a.dtype)
        if QUANT == 6:                                   # fp8 128 x 128 blocks: the tile's one block row of K
            so = e * stride_se + (k0 // GROUP) * stride_sg + (offs_n // GROUP) * stride_sn
            if GATED:
                s_g = tl.load(sg_ptr + so, mask=nmask, other=0.0)
                acc_g += tl.dot(a, bg, input_precision=DOT_PREC) * s_g[None, :]
            s_u = tl.load(su_ptr + so, mask=nmask, other=0.0)
            acc_u += tl.dot(a, bu, input_precision=DOT_PREC) * s_u[None, :]
        elif QUANT == 2:                                 # int4: the tile's one group, its scales per column
            so = e * stride_se + (k0 // GROUP) * stride_sg + offs_n
            if GATED:
                s_g = tl.load(sg_ptr + so, mask=nmask, other=0.0).to(tl.float32)
                acc_g += tl.dot(a, bg, input_precision=DOT_PREC) * s_g[None, :]
            s_u = tl.load(su_ptr + so, mask=nmask, other=0.0).to(tl.float32)
            acc_u += tl.dot(a, bu, input_precision=DOT_PREC) * s_u[None, :]
            if ZERO_POINT:                               # + zero[n] x sum_k x[m, k] over the tile
                rs = tl.sum(a.to(tl.float32), 1)[:, None]
                if GATED:
                    acc_g += rs * tl.load(zg_ptr + so, mask=nmask, other=0.0).to(tl.float32)[None, :]
                acc_u += rs * tl.load(zu_ptr + so, mask=nmask, other=0.0).to(tl.float32)[None, :]
        else:
            if GATED:
                acc_g = tl.dot(a, bg, acc_g, input_precision=DOT_PREC)
            acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PREC)
    if QUANT == 4:                                       # nvfp4: the experts' fp32 tensor scales, once
        if GATED:
            acc_g = acc_g * tl.load(tg_ptr + e)
        acc_u = acc_u * tl.load(tu_ptr + e)
    if QUANT == 1:                                       # int8: the per-channel scales, once on the accumulators
        if GATED:
            acc_g = acc_g * tl.load(sg_ptr + e * stride_se + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        acc_u = acc_u * tl.load(su_ptr + e * stride_se + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    if QUANT == 5:                                       # fp8 per channel (per tensor: stride_sn 0), once
        if GATED:
            acc_g = acc_g * tl.load(sg_ptr + e * stride_se + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
        acc_u = acc_u * tl.load(su_ptr + e * stride_se + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
    if BIAS:
        if GATED:
            acc_g += tl.load(bg_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bu_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    h = _act(acc_g, acc_u, alpha, limit, ACT)
    rows = entry.to(tl.int64)
    tl.store(h_ptr + rows[:, None] * stride_ht + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & nmask[None, :])


@triton.jit
def _moe_down_kernel(h_ptr, wd_ptr, bd_ptr, rw_ptr, p_ptr, sorted_ptr, bexp_ptr, npad_ptr,
                     N, K, TK, NUM_BLOCKS, stride_ht, stride_we, stride_wk, stride_wn, stride_be, stride_pt,
                     sd_ptr, zd_ptr, stride_se, stride_sg, stride_sn, td_ptr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BIAS: tl.constexpr,
                     UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr,
                     ZERO_POINT: tl.constexpr):
    # h [T*k, K]   w_down [E, K, N] (quantized: stored [E, N, K] / [E, N, K/2])   routing weights [T*k] fp32
    # partials [T*k, N]   (K = I, N = H); scales: int8 [E, N], int4 (and zero points) [E, K/g, N]
    pid = tl.program_id(0)
    pid_m = pid % NUM_BLOCKS
    pid_n = pid // NUM_BLOCKS
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    e = tl.load(bexp_ptr + pid_m).to(tl.int64)
    entry = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = entry < TK
    rows = entry.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    wd = wd_ptr + e * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        a = tl.load(h_ptr + rows[:, None] * stride_ht + offs_k[None, :], mask=valid[:, None] & kmask[None, :],
                    other=0.0)
        if QUANT >= 5:
            b = _fp8_tile(wd, offs_k, offs_n, kmask[:, None] & nmask[None, :], stride_wk, stride_wn)
        elif QUANT >= 3:
            b = fp4_tile(wd, sd_ptr + e * stride_se, offs_k, offs_n, kmask[:, None] & nmask[None, :], stride_wk,
                         stride_wn, stride_sg, stride_sn, GROUP, QUANT - 2)
        else:
            b = _w_tile(wd, offs_k, offs_n, kmask[:, None] & nmask[None, :], stride_wk, stride_wn, QUANT)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        elif QUANT != 0:
            b = b.to(a.dtype)                            # dequantized in registers: exact
        if QUANT == 6:                                   # fp8 128 x 128 blocks: the tile's one block row of K
            so = e * stride_se + (k0 // GROUP) * stride_sg + (offs_n // GROUP) * stride_sn
            acc += tl.dot(a, b, input_precision=DOT_PREC) * tl.load(sd_ptr + so, mask=nmask, other=0.0)[None, :]
        elif QUANT == 2:                                 # int4: the tile's one group
            so = e * stride_se + (k0 // GROUP) * stride_sg + offs_n
            acc += tl.dot(a, b, input_precision=DOT_PREC) * tl.load(sd_ptr + so, mask=nmask,
                                                                    other=0.0).to(tl.float32)[None, :]
            if ZERO_POINT:
                acc += tl.sum(a.to(tl.float32), 1)[:, None] * tl.load(zd_ptr + so, mask=nmask,
                                                                       other=0.0).to(tl.float32)[None, :]
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    if QUANT == 4:                                       # nvfp4: the expert's fp32 tensor scale, once
        acc = acc * tl.load(td_ptr + e)
    if QUANT == 1:                                       # int8: the per-channel scales, once
        acc = acc * tl.load(sd_ptr + e * stride_se + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    if QUANT == 5:                                       # fp8 per channel (per tensor: stride_sn 0), once
        acc = acc * tl.load(sd_ptr + e * stride_se + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
    if BIAS:
        acc += tl.load(bd_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    acc = acc * tl.load(rw_ptr + rows, mask=valid, other=0.0)[:, None]
    tl.store(p_ptr + rows[:, None] * stride_pt + offs_n[None, :], acc.to(p_ptr.dtype.element_ty),
             mask=valid[:, None] & nmask[None, :])


def moe_config(T: int, E: int, k: int, H: int, I: int, dtype=torch.bfloat16, device="cpu", *,  # noqa: E741
               block_m=None, block_n=None, block_k=None, num_warps=None, num_stages=None, group_size=0,
               scale_k=None) -> dict:
    """Blocks, warps and stages for T tokens over E experts (k each), H -> I -> H; explicit arguments override.

    "skinny" when the T*k rows average at most ``SKINNY_ROWS`` per expert (decode: a 16-row block holds an
    expert's tokens, long K tiles stream its weights), else "tiled" (64-row blocks reuse each weight tile over
    more tokens). ``device`` is for symmetry with ``linear_config`` (the choice does not depend on the SM count).
    int4 experts (``group_size`` g): BLOCK_K at most g and dividing it (a K tile lies in one group), and at most
    ``INT4_TILED_BLOCK_K`` when tiled. fp8 experts (``scale_k``: 0 per channel / tensor, 128 for 128 x 128 blocks,
    None: not fp8): at most ``FP8_TILED_BLOCK_K`` when tiled, and dividing a block (a K tile in one block row)."""
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if v is not None and (int(v) < 16 or int(v) & (int(v) - 1)):
            raise ValueError(f"{name} must be a power of two of at least 16 (tl.dot needs 16 or more), got {v}.")
    kind = "skinny" if T * k <= SKINNY_ROWS * E else "tiled"
    bm, bn, bk, warps, stages = CONFIGS[(kind, "fp32" if dtype == torch.float32 else "16bit")]
    bk = block_k or bk
    if group_size and block_k is None:
        bk = min(bk, int(group_size), INT4_TILED_BLOCK_K if kind == "tiled" else bk)
    if group_size:
        if int(group_size) % bk:
            raise ValueError(f"block_k ({bk}) must divide the int4 group size ({group_size}): give a power of two "
                             f"of at least 16 and at most {group_size}.")
    if scale_k is not None and block_k is None and kind == "tiled":
        bk = min(bk, FP8_TILED_BLOCK_K)
    if scale_k and int(scale_k) % bk:
        raise ValueError(f"block_k ({bk}) must divide the fp8 weight blocks' {scale_k} input features: give a power "
                         f"of two of at least 16 and at most {scale_k}.")
    return dict(kind=kind, block_m=block_m or bm, block_n=block_n or bn, block_k=bk,
                num_warps=num_warps or warps, num_stages=num_stages or stages)


def _check_inputs(x, w_gate, w_up, w_down, weights, ids, activation, b_gate, b_up, b_down):
    if activation not in ACTIVATIONS:
        raise RooflineError(f"unknown MoE activation {activation!r}: choose one of {', '.join(ACTIVATIONS)}.")
    if (w_gate is None) != (activation in UNGATED):
        want = "no gate weight: pass w_gate None" if activation in UNGATED else "a gate weight: pass w_gate [E, H, I]"
        raise ValueError(f"the {activation} experts take {want}.")
    if w_gate is None:                           # ungated: the up weight stands in for the gate's checks
        w_gate, b_gate = w_up, b_up
    if isinstance(w_gate, QuantExperts) or isinstance(w_down, QuantExperts):
        E, H, I, dt, dev = _check_quant(w_gate, w_up, w_down)  # noqa: E741
    else:
        check_tensor("w_gate", w_gate, (None, None, None), dtypes=FLOAT_DTYPES)
        E, H, I = w_gate.shape  # noqa: E741
        dt, dev = w_gate.dtype, w_gate.device
        check_tensor("w_up", w_up, (E, H, I), dtype=dt, device=dev)
        check_tensor("w_down", w_down, (E, I, H), dtype=dt, device=dev)
    if dt is None:                               # fp8 experts: fp32 scales, any float activations
        check_tensor("x", x, (None, H), dtypes=FLOAT_DTYPES, device=dev)
        dt = x.dtype
    check_tensor("x", x, (None, H), dtype=dt, device=dev)
    T = x.shape[0]
    check_tensor("ids", ids, (T, None), device=dev)
    k = ids.shape[1]
    check_tensor("weights", weights, (T, k), device=dev)
    if ids.dtype not in (torch.int32, torch.int64) or not weights.dtype.is_floating_point:
        raise ValueError(f"ids must be int32/int64 and weights float (route's output), got {ids.dtype} and "
                         f"{weights.dtype}.")
    biases = (b_gate, b_up, b_down)
    if any(b is not None for b in biases) and any(b is None for b in biases):
        raise ValueError("expert biases come together: pass b_gate [E, I], b_up [E, I] and b_down [E, H], or none.")
    if b_gate is not None:
        for name, b, n in (("b_gate", b_gate, I), ("b_up", b_up, I), ("b_down", b_down, H)):
            check_tensor(name, b, (E, n), dtype=dt, device=dev)
            if not b.is_contiguous():
                raise ValueError(f"{name} must be contiguous.")
    if T and ids.device.type != "meta" and (int(ids.min()) < 0 or int(ids.max()) >= E):   # meta: variants
        raise ValueError(f"ids must name experts 0..{E - 1}, got values {int(ids.min())}..{int(ids.max())}.")
    return T, E, H, I, k


def _check_quant(w_gate, w_up, w_down) -> tuple:
    """(E, H, I, activation dtype, device) of quantized experts: three ``QuantExperts`` quantized alike (dtype,
    group, zero points), gate/up [E, H, I] and down [E, I, H], laid out as ``kernels.quant.quantize_experts``
    stores them (last dimensions contiguous)."""
    ws = (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down))
    for name, w in ws:
        if not isinstance(w, QuantExperts):
            raise ValueError(f"{name} is a {type(w).__name__} but another expert weight is quantized: quantize all "
                             "three with kernels.quant.quantize_experts, or none.")
    kinds = sorted({(w.dtype, w.group_size, w.zeros is not None) for _, w in ws})
    if len(kinds) > 1:
        raise ValueError(f"w_gate, w_up and w_down must be quantized alike (dtype, group size, zero points), got "
                         f"{kinds}: quantize them with the same arguments.")
    E, H, I = w_gate.shape  # noqa: E741
    dt, dev = w_gate.act_dtype, w_gate.device
    if is_fp4(w_gate):
        for name, w, (K, N) in (("w_gate", w_gate, (H, I)), ("w_up", w_up, (H, I)), ("w_down", w_down, (I, H))):
            if tuple(w.shape) != (E, K, N):
                raise ValueError(f"{name} must hold [E, K, N] = [{E}, {K}, {N}] weights, got {list(w.shape)}.")
            check_fp4_weight(name, w, (E,), K, N, dt, dev)
        if w_up.qweight.stride() != w_gate.qweight.stride() or w_up.scales.stride() != w_gate.scales.stride():
            raise ValueError("w_gate and w_up must have the same strides (one stride set is passed to the kernel).")
        return E, H, I, dt, dev
    if w_gate.dtype in LF8.FORMATS:
        return (*_check_fp8(w_gate, w_up, w_down), dev)
    int8 = w_gate.dtype == "int8"
    for name, w, (K, N) in (("w_gate", w_gate, (H, I)), ("w_up", w_up, (H, I)), ("w_down", w_down, (I, H))):
        if tuple(w.shape) != (E, K, N):
            raise ValueError(f"{name} must hold [E, K, N] = [{E}, {K}, {N}] weights, got {list(w.shape)}.")
        g = 0 if int8 else check_group(w.group_size)
        if g and K % g:
            raise ValueError(f"{name}'s int4 group size {g} must divide its in-features K = {K}.")
        check_tensor(f"{name}.qweight", w.qweight, (E, N, K if int8 else K // 2),
                     dtype=torch.int8 if int8 else torch.uint8, device=dev)
        sshape = (E, N) if int8 else (E, K // g, N)
        check_tensor(f"{name}.scales", w.scales, sshape, dtypes=FLOAT_DTYPES, device=dev)
        if w.scales.dtype != dt:
            raise ValueError(f"the experts' scales must share one dtype (the activation dtype), got {dt} and "
                             f"{w.scales.dtype}.")
        if w.zeros is not None:
            check_tensor(f"{name}.zeros", w.zeros, sshape, dtype=dt, device=dev)
            if w.zeros.stride() != w.scales.stride():
                raise ValueError(f"{name}'s zeros and scales must have the same strides.")
    if w_up.qweight.stride() != w_gate.qweight.stride() or w_up.scales.stride() != w_gate.scales.stride():
        raise ValueError("w_gate and w_up must have the same strides (one stride set is passed to the kernel).")
    return E, H, I, dt, dev


def _check_fp8(w_gate, w_up, w_down) -> tuple:
    """(E, H, I, None) of fp8 experts (``LF8.quantize`` stacked: e4m3 [E, N, K], fp32 scales [E, N] / [E, 1] /
    [E, cdiv(N, 128), cdiv(K, 128)]); None: the activation dtype is x's (the scales are fp32)."""
    f = LF8.fp8_format(w_gate)
    E, H, I = w_gate.shape  # noqa: E741
    dev = w_gate.device
    if f.scales.k and f.scales.k != f.scales.n:
        raise ValueError(f"the fused MoE takes square fp8 scale blocks, not {f.describe()}.")
    for name, w, (K, N) in (("w_gate", w_gate, (H, I)), ("w_up", w_up, (H, I)), ("w_down", w_down, (I, H))):
        if tuple(w.shape) != (E, K, N):
            raise ValueError(f"{name} must hold [E, K, N] = [{E}, {K}, {N}] weights, got {list(w.shape)}.")
        check_tensor(f"{name}.qweight", w.qweight, (E, N, K), dtype=LF8.FP8, device=dev)
        check_tensor(f"{name}.scales", w.scales, (E, *LF8.scales_shape(f, K, N)), dtype=torch.float32, device=dev)
    if w_up.qweight.stride() != w_gate.qweight.stride() or w_up.scales.stride() != w_gate.scales.stride():
        raise ValueError("w_gate and w_up must have the same strides (one stride set is passed to the kernel).")
    return E, H, I, None


def _weight_args(w) -> tuple:
    """What a MoE kernel takes for one weight: (tensor, (stride_e, stride_k, stride_n), scales, zeros,
    (scale stride_e, scale stride_g, scale stride_n), QUANT, GROUP, ZERO_POINT, tensor scales); a float weight
    passes itself for the scales. FP4: scales [E, N, K/g] as bytes, nvfp4's tensor scales [E] (else the scales)."""
    if not isinstance(w, QuantExperts):
        return w, (w.stride(0), w.stride(1), w.stride(2)), w, w, (0, 0, 0), 0, 0, False, w
    q = w.qweight                                                         # [E, N, K(/2)]: k along the last dim
    if is_fp4(w):
        s = scale_bytes_view(w)
        ts = w.tensor_scale if w.tensor_scale is not None else s
        return (q, (q.stride(0), q.stride(2), q.stride(1)), s, s, (s.stride(0), s.stride(2), s.stride(1)),
                FP4_QUANT - 1 + scale_code(w.dtype), w.group_size, False, ts)
    s = w.scales
    if w.dtype in LF8.FORMATS:                  # bytes [E, N, K]; scales [E, N] | [E, 1] (stride 0) | [E, N/128, K/128]
        b, sc = q.view(torch.uint8), LF8.fp8_format(w).scales
        sst = (s.stride(0), s.stride(2), s.stride(1)) if sc.k else (s.stride(0), 0, s.stride(1) if sc.n else 0)
        return b, (b.stride(0), b.stride(2), b.stride(1)), s, s, sst, QUANT_CODES[w.dtype], sc.k, False, s
    z = w.zeros if w.zeros is not None else s
    return (q, (q.stride(0), q.stride(2), q.stride(1)), s, z, (s.stride(0), s.stride(1) if w.dtype == "int4" else 0, 0),
            QUANT_CODES[w.dtype], w.group_size if w.dtype == "int4" else 0, w.zeros is not None, s)


def moe_experts(x, w_gate, w_up, w_down, weights, ids, *, activation="silu", b_gate=None, b_up=None, b_down=None,
                alpha=1.702, limit=7.0, out=None, **config) -> torch.Tensor:
    """y [T, H] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) with the two Triton launches (module docstring).
    ``config`` overrides ``moe_config`` (block_m, block_n, block_k, num_warps, num_stages). The expert weights are
    float tensors or three ``kernels.quant_weight.QuantExperts`` (int8 / int4 with the activation dtype in their
    scales, mxfp4 / nvfp4, fp8 per channel / per tensor / 128 x 128 blocks: ``QUANT_CODES``)."""
    # x: [T, H]   w_gate, w_up: [E, H, I]   w_down: [E, I, H]   weights, ids: [T, k]   y: [T, H]
    T, E, H, I, k = _check_inputs(x, w_gate, w_up, w_down, weights, ids, activation, b_gate, b_up, b_down)
    gated = w_gate is not None
    if not gated:                                # relu2: the kernel reads no gate (GATED false); up fills its slots
        w_gate, b_gate = w_up, b_up
    if out is None:
        out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    check_tensor("out", out, (T, H), dtype=x.dtype, device=x.device)
    quant = isinstance(w_gate, QuantExperts)
    if not quant and w_up.stride() != w_gate.stride():
        raise ValueError("w_gate and w_up must have the same strides (one stride set is passed to the kernel).")
    if T == 0:
        return out
    g4 = w_gate.group_size if quant and w_gate.dtype == "int4" else 0
    sk = w_gate.group_size if quant and w_gate.dtype in LF8.FORMATS else None   # fp8: 128 (blocks) or 0
    c = moe_config(T, E, k, H, I, x.dtype, x.device, group_size=g4, scale_k=sk, **config)
    BM = c["block_m"]
    al = moe_align(ids, E, BM)
    blocks = al.block_expert.numel()
    tk = T * k
    h = torch.empty(tk, I, dtype=x.dtype, device=x.device)
    part = torch.empty(tk, H, dtype=x.dtype, device=x.device)
    rw = weights.reshape(tk).to(torch.float32).contiguous()
    upcast = INTERPRET
    prec = "ieee" if (x.dtype == torch.float32 or upcast) else "tf32"
    bias = b_gate is not None
    opts = dict(BLOCK_M=BM, BLOCK_N=c["block_n"], BLOCK_K=c["block_k"], num_warps=c["num_warps"],
                num_stages=c["num_stages"])
    x = x if x.stride(-1) == 1 else x.contiguous()
    wg, gst, sg, zg, sst, qc, grp, zp, tg = _weight_args(w_gate)
    wu, _, su, zu, _, _, _, _, tu = _weight_args(w_up)
    wd, dst, sd, zd, dsst, _, _, _, td = _weight_args(w_down)
    qopts = dict(QUANT=qc, GROUP=grp, ZERO_POINT=zp)
    launch(_moe_gate_up_kernel, (blocks * cdiv(I, c["block_n"]),), x, wg, wu,
           b_gate if bias else wg, b_up if bias else wu, h, al.sorted_ids, al.block_expert, al.n_padded,
           I, H, tk, k, blocks, x.stride(0), *gst,
           b_gate.stride(0) if bias else 0, h.stride(0), float(alpha), float(limit), sg, su, zg, zu, *sst, tg, tu,
           ACT=ACTIVATIONS.index(activation), BIAS=bias, UPCAST=upcast, DOT_PREC=prec, GATED=gated, **qopts, **opts)
    launch(_moe_down_kernel, (blocks * cdiv(H, c["block_n"]),), h, wd, b_down if bias else wd, rw, part,
           al.sorted_ids, al.block_expert, al.n_padded, H, I, tk, blocks, h.stride(0), *dst,
           b_down.stride(0) if bias else 0, part.stride(0), sd, zd, *dsst, td,
           BIAS=bias, UPCAST=upcast, DOT_PREC=prec, **qopts, **opts)
    torch.sum(part.view(T, k, H), dim=1, out=out)
    return out


def _float_mm(xs, w, e, ct):
    return xs @ w[e].to(ct)


def _dequant_mm(xs, w, e, ct):
    """A quantized expert in the reference: x @ its dequantized weight (computed in fp64, then ``ct``)."""
    return xs @ w.expert(e).dequantize(ct)


def _quant_mm(xs, w, e, ct):
    """A quantized expert on the torch backend: its format's expert GEMM (``register_format``'s ``torch_expert``:
    fp8's weight-only one, the fused kernel's arithmetic), else its ``QuantWeight`` through the backend's quantized
    linear."""
    return (weight_format(w.dtype).torch_expert or torch_linear)(xs, w.expert(e))


def _loop(x, w_gate, w_up, w_down, weights, ids, activation, b_gate, b_up, b_down, alpha, limit, ct, mm=_float_mm):
    """Per expert: gather its tokens, the two GEMMs, the activation, the down GEMM, times the routing weight,
    index_add into y (transformers' expert loop), in compute dtype ``ct``; y returned in x's dtype. ``mm(xs, w, e,
    ct)`` is xs @ expert e's weight (float, or a quantized one dequantized or through the torch backend's GEMM)."""
    if activation not in ACTIVATIONS:
        raise RooflineError(f"unknown MoE activation {activation!r}: choose one of {', '.join(ACTIVATIONS)}.")
    T, H = x.shape
    y = torch.zeros(T, H, dtype=ct, device=x.device)
    xc = x.to(ct)
    for e in torch.unique(ids).tolist():
        tok, pos = torch.where(ids == e)
        xs = xc[tok]
        u = mm(xs, w_up, e, ct)
        g = mm(xs, w_gate, e, ct) if w_gate is not None else None      # relu2 experts: no gate
        if b_up is not None:
            u = u + b_up[e].to(ct)
            g = g + b_gate[e].to(ct) if g is not None else None
        if activation == "relu2":                   # transformers' ReLUSquaredActivation
            hh = torch.square(torch.relu(u))
        elif activation == "silu":
            hh = torch.nn.functional.silu(g) * u
        else:
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            hh = (u + 1) * (g * torch.sigmoid(g * alpha))
        o = mm(hh, w_down, e, ct)
        if b_down is not None:
            o = o + b_down[e].to(ct)
        y.index_add_(0, tok, o * weights[tok, pos, None].to(ct))
    return y.to(x.dtype)


def reference(x, w_gate, w_up, w_down, weights, ids, *, activation="silu", b_gate=None, b_up=None, b_down=None,
              alpha=1.702, limit=7.0, compute_dtype=None) -> torch.Tensor:
    """The plain loop over experts in fp32 (``compute_dtype`` torch.float64 for checks); y in x's dtype. Quantized
    experts (``QuantExperts``) multiply by their dequantized weights."""
    ct = compute_dtype or (torch.float64 if x.dtype == torch.float64 else torch.float32)
    mm = _dequant_mm if isinstance(w_up, QuantExperts) else _float_mm
    return _loop(x, w_gate, w_up, w_down, weights, ids, activation, b_gate, b_up, b_down, alpha, limit, ct, mm)


def torch_moe(x, w_gate, w_up, w_down, weights, ids, *, activation="silu", b_gate=None, b_up=None, b_down=None,
              alpha=1.702, limit=7.0, out=None) -> torch.Tensor:
    """The torch backend's peer: the same loop in the input dtype (cuBLAS GEMMs per expert, as transformers);
    quantized experts run each expert's ``QuantWeight`` through ``kernels.quant.torch_linear`` (aten's int8 /
    int4 GEMM where this torch has it, else its dequantize reference: ``QuantExperts.torch_impl``); fp8 experts
    x @ the weight dequantized to x's dtype (weight-only, as the fused kernel: the activations are not quantized)."""
    mm = _quant_mm if isinstance(w_up, QuantExperts) else _float_mm
    y = _loop(x, w_gate, w_up, w_down, weights, ids, activation, b_gate, b_up, b_down, alpha, limit, x.dtype, mm)
    return y if out is None else out.copy_(y)


def cost(tokens: int, hidden: int, intermediate: int, n_experts: int, k: int, dtype="bf16", *, distinct=None,
         activation: str = "silu", bias: bool = False, weight_dtype: str | None = None, group_size: int | None = None,
         zero_point: bool = False):
    """The roofline formula's Cost (roofline.formulas.moe_experts; uniform routing unless ``distinct``); quantized
    experts with ``weight_dtype`` "int8" / "int4" (``group_size``, ``zero_point``): their bytes and scales."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.moe_experts(tokens, hidden, intermediate, n_experts, k, distinct=distinct, activation=activation,
                         bias=bias, weight_dtype=weight_dtype or d, act_dtype=d, group_size=group_size,
                         zero_point=zero_point)


def stored_cost(tokens: int, hidden: int, intermediate: int, n_experts: int, k: int, fmt: str, dtype="bf16", *,
                distinct=None, activation: str = "silu", bias: bool = False) -> Cost:
    """``roofline.formulas.moe_experts`` with each touched expert's three weights as stored in the registered weight
    format ``fmt`` (``roofline.precision.weight_bytes``: gate, up [H, I], down [I, H], scales included; + the
    biases in the activation dtype), the activations in ``dtype`` (weight-only: fp8 e4m3 experts (W8A16), mxfp4 /
    nvfp4 (W4A16)). fp8 per channel, H 64, I 96 in bf16: 3 * 64 * 96 values + (2 * 96 + 64) fp32 scales = 19,456 B
    an expert."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    f = precision_format(fmt)
    H, I = hidden, intermediate  # noqa: E741
    per = 2 * weight_bytes(f, H, I, d) + weight_bytes(f, I, H, d) + ((2 * I + H) * FLOAT_BYTES[d] if bias else 0)
    return F.moe_experts(tokens, H, I, n_experts, k, distinct=distinct, activation=activation, bias=bias,
                         weight_dtype=d, act_dtype=d, expert_bytes=per)
