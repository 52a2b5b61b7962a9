"""FP8 W8A8 linear: y[M, N] = (xq[M, K] * sx) @ (wq[K, N] * sw) (+ bias), e4m3 operands, fp32 accumulation.

Weights (``quantize``; the weight formats of ``roofline.precision.formats``): e4m3 ``qweight`` [N, K] (K
contiguous: the checkpoints' [out, in] ``weight``) with fp32 scales per tensor ("fp8-tensor", scales [1]: the
compressed-tensors ``weight_scale``), per output channel ("fp8", scales [N]) or per 128 x 128 block ("fp8-block",
scales [cdiv(N, 128), cdiv(K, 128)]: DeepSeek-V3's ``weight_scale_inv``, the value w = q * scale). Activations:
e4m3 with dynamic fp32 scales (``kernels.act_quant``) in the activation format whose scale covers the same input
features as the weight's (``act_format_for``): per token for per-tensor / per-channel weights, 1 x 128 groups
for 128 x 128 blocks. ``linear_fp8(x, qw)`` quantizes a bf16 / fp16 ``x`` and runs ``gemm_fp8``; the output is
in x's dtype (``gemm_fp8`` takes any float ``out_dtype``), a bias [N] in it is added in the epilogue.

The kernel is the bf16 linear's (``kernels.linear``: grid, grouped tile order, tiles from ``linear_config`` with
BLOCK_K = 128, one-launch split-K): e4m3 tiles go to ``tl.dot`` as they are (the fp8 tensor cores, sm_89+) and
accumulate in fp32. Per-token x per-channel (or per-tensor) scales are constant along K, so they multiply the
accumulator once, before a split's partial is stored: sum_k sx[m] x[m,k] sw[n] w[k,n] = sx[m] sw[n] sum_k ...
Block scales change every 128 input features: each BLOCK_K step (32, 64 or 128: inside one block) takes its own
dot, multiplied by sx[m, kb] sw[n // 128, kb] before it joins the accumulator (DeepSeek's promotion to fp32 per
128 features). N, K need not be multiples of the blocks: the last block is partial, its missing features load 0.

Under the Triton interpreter (``TRITON_INTERPRET=1``) the kernel itself runs: loading e4m3 and upcasting to fp32
is exact in the interpreter, and so is an fp32 dot of e4m3 values (every product is exact in fp32); only its
fp32 -> e4m3 cast is wrong, which ``act_quant`` avoids. So the interpreter checks the Triton kernel against the
reference (``roofline check``). On a GPU without fp8 (before sm_89) the launcher refuses in one line.

The torch backend (``prepare_torch``): ``torch._scaled_mm`` with row-wise scales (per-token x per-channel; a
per-tensor weight scale broadcast over N) where this torch runs it (it does on the CPU in torch 2.13), with
the bias in the op; 128 x 128 blocks, or a torch without the op, a dequantize reference (x and w dequantized to
fp32, then a matmul), labelled so in ``torch_impl``. ``reference_q`` is the fp64 reference of the kernel's
arithmetic on the same fp8 operands. ``cost``: the GEMM on fp8 activations, its bytes from the registry.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

from roofline.cost import Cost
from roofline.errors import RooflineError
from roofline.precision import Format, act_format, names, weight_bytes, weight_format
from roofline.precision.formats import FLOAT_BYTES

from . import act_quant as AQ
from ._common import FLOAT_DTYPES, INTERPRET, cdiv, check_tensor, dtype_name
from ._launch import launch
from .linear import add_bias, check_bias, grouped_tile, linear_config, split_k_buffers, store_tile
from .env import device_label, fp8_supported
from .quant_weight import QuantWeight, register_format, remake

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
FORMATS = tuple(n for n in names("weight") if weight_format(n).element == "e4m3" and weight_format(n).compute == "fp8"
                and weight_format(n).scales.dtype == "fp32")     # fp8, fp8-tensor, fp8-block (not MX: e8m0)
REFUSAL = ("fp8 GEMM needs a GPU with fp8 (sm_89+: Ada, Hopper, Blackwell); {dev} has none (under the Triton "
           "interpreter it runs on the CPU, the torch path too).")


@triton.jit
def _linear_fp8_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, p_ptr, lock_ptr, M, N, K, K_PER_SPLIT, SPLIT, bias_ptr,
                       stride_xm, stride_wn, stride_ym, stride_yn, stride_xsm, stride_xsg, stride_wsn, stride_wsk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, BLOCKWISE: tl.constexpr, WS_N: tl.constexpr,
                       SCALE_K: tl.constexpr, BIAS: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    k_lo = pid_k * K_PER_SPLIT                                 # this split's input features [k_lo, k_hi)
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M     # wrapped rows/cols: computed, never stored
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    xs_row = xs_ptr + offs_m.to(tl.int64) * stride_xsm                     # the activations' scales of each row
    ws_col = ws_ptr + (offs_n // WS_N).to(tl.int64) * stride_wsn            # the weight's of each column
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < k_hi                                  # the split's (and K's) edge: loads 0 past it
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                    mask=kmask[None, :], other=0.0)                                  # e4m3 [BLOCK_M, BLOCK_K]
        b = tl.load(w_ptr + offs_k[:, None] + offs_n[None, :].to(tl.int64) * stride_wn,
                    mask=kmask[:, None], other=0.0)                                  # e4m3 [BLOCK_K, BLOCK_N]
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if BLOCKWISE:                                # one 128-block along K: its own dot, times its two scales
            kb = k0 // SCALE_K
            sab = tl.load(xs_row + kb * stride_xsg)[:, None] * tl.load(ws_col + kb * stride_wsk)[None, :]
            acc += tl.dot(a, b) * sab
        else:
            acc = tl.dot(a, b, acc)
    if not BLOCKWISE:                                # constant along K: once per tile
        acc = acc * tl.load(xs_row)[:, None] * tl.load(ws_col)[None, :]
    store_tile(acc, y_ptr, p_ptr, lock_ptr, bias_ptr, pid, pid_k, pid_m, pid_n, M, N, SPLIT, stride_ym, stride_yn,
               BLOCK_M, BLOCK_N, SPLIT_K, BIAS)


def fp8_format(qw_or_name):
    """The registry's fp8 weight format of a ``QuantWeight`` or a name; anything else refused in one line."""
    name = getattr(qw_or_name, "dtype", qw_or_name)
    f = name if isinstance(name, Format) else weight_format(name)
    if f.name not in FORMATS:
        raise ValueError(f"an fp8 W8A8 GEMM takes weights in {', '.join(FORMATS)}, not {f.describe()}.")
    return f


def act_format_for(qw_or_name):
    """The fp8 activation format paired with a weight format: the one whose scale covers the same input features
    (per token: k = 0, for per-tensor / per-channel weights; 1 x 128 groups for 128 x 128 blocks)."""
    k = fp8_format(qw_or_name).scales.k
    for n in names("act"):
        f = act_format(n)
        if f.element == "e4m3" and f.scales.dtype == "fp32" and f.scales.k == k:
            return f
    raise RooflineError(f"no fp8 activation format has scales over {k or 'all'} input features.")


def linear_fp8_config(M: int, N: int, K: int, device="cpu", *, block: bool = False, **overrides) -> dict:
    """The bf16 linear's rule (``kernels.linear.linear_config``: skinny split-K for M <= 64, tiles for prefill)
    with BLOCK_K = 128 (the tensor cores' fp8 step is 32; a weight block is 128 deep). ``block``: 128 x 128
    weight blocks, so BLOCK_K must divide 128 (a K step inside one block)."""
    bk = overrides.pop("block_k", None) or 128
    if bk < 32 or (block and 128 % bk):
        raise ValueError(f"block_k must be at least 32 (the fp8 tensor cores' K step)"
                         f"{' and divide 128 (a step inside one weight block)' if block else ''}, got {bk}.")
    return linear_config(M, N, K, torch.bfloat16, device, block_k=bk, **overrides)


def run_config(qw: QuantWeight, M: int, dtype, device) -> dict:
    """The GEMM's tiles for M rows of ``qw`` (``linear_fp8_config``; 128 x 128 blocks: BLOCK_K inside one)."""
    K, N = qw.shape
    return linear_fp8_config(M, N, K, device, block=bool(fp8_format(qw).scales.k))


def check_fp8_device(device) -> None:
    """One line when ``device`` is a GPU without fp8 (the interpreter's CPU and the compile check's meta pass)."""
    dev = torch.device(device)
    if dev.type == "cuda" and not fp8_supported(dev):
        raise RooflineError(REFUSAL.format(dev=device_label(dev)))


def gemm_fp8(xq: torch.Tensor, xs: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, *,
             out_dtype=torch.bfloat16, out: torch.Tensor | None = None, **config) -> torch.Tensor:
    """y[..., N] = dequant(xq, xs) @ dequant(qw) (+ bias) with the Triton kernel, from fp8 activations ``xq``
    [..., K] e4m3 and their fp32 scales ``xs`` ([...] per token, [..., cdiv(K, 128)] per group: the layout of
    ``act_format_for(qw)``); y in ``out_dtype``. ``config`` overrides block sizes / splits."""
    f = fp8_format(qw)
    K, N = qw.shape
    check_fp8_device(qw.device)
    check_tensor("qweight", qw.qweight, (N, K), dtype=FP8)
    check_tensor("xq", xq, dtype=FP8, device=qw.device)
    if xq.dim() == 0 or xq.shape[-1] != K:
        raise ValueError(f"xq must have shape [..., {K}] to match the fp8 weight [{K}, {N}], got {list(xq.shape)}.")
    group = act_format_for(f).scales.k
    xq2 = xq.reshape(-1, K)
    M = xq2.shape[0]
    xs2 = xs.reshape(M, -1)
    check_tensor("xs", xs2, AQ.scales_shape(M, K, group) if group else (M, 1), dtype=torch.float32,
                 device=qw.device, contiguous_last=False)
    ws = qw.scales
    check_tensor("scales", ws, scales_shape(f, K, N), dtype=torch.float32, device=qw.device)
    out = torch.empty(*xq.shape[:-1], N, dtype=out_dtype, device=xq.device) if out is None else out
    check_tensor("out", out, tuple(xq.shape[:-1]) + (N,), dtypes=FLOAT_DTYPES, device=xq.device)
    check_bias(bias, N, out)
    y2 = out.view(-1, N)
    if M == 0:
        return out
    c = linear_fp8_config(M, N, K, xq.device, block=bool(group), **config)
    tiles, split, part, locks = split_k_buffers(M, N, c, y2)
    w2 = ws.view(ws.shape[0], -1) if ws.dim() == 2 else ws.view(-1, 1)
    per_n = f.scales.n or 1                               # per tensor: every column reads scale 0 (stride 0)
    launch(_linear_fp8_kernel, (tiles, split), xq2, xs2, qw.qweight, ws, y2, part, locks, M, N, K, c["k_per_split"],
           split, ws if bias is None else bias, xq2.stride(0), qw.qweight.stride(0), y2.stride(0), y2.stride(1),
           xs2.stride(0), xs2.stride(1) if group else 0, w2.stride(0) if f.scales.n else 0,
           w2.stride(1) if group else 0,
           BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], BLOCK_K=c["block_k"], GROUP_M=c["group_m"],
           SPLIT_K=split > 1, UPCAST=INTERPRET, BLOCKWISE=bool(group), WS_N=per_n, SCALE_K=group or 1,
           BIAS=bias is not None, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


def linear_fp8(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
               **config) -> torch.Tensor:
    """y[..., N] = x[..., K] @ dequant(qw) (+ bias) with both Triton kernels: ``act_quant`` (x in its fp8
    format, ``act_format_for(qw)``), then ``gemm_fp8``; y in x's dtype."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, device=qw.device)
    check_fp8_device(qw.device)
    xq, xs = AQ.act_quant(x, act_format_for(qw))
    return gemm_fp8(xq, xs, qw, bias, out_dtype=x.dtype, out=out, **config)


# ---------------------------------------------------------------- quantize, dequantize, references

def scales_shape(fmt, K: int, N: int) -> tuple:
    """The fp32 scales' shape of a [K, N] weight in ``fmt``: [1], [N] or [cdiv(N, 128), cdiv(K, 128)]."""
    s = fmt.scales
    if s.k:
        return (cdiv(N, s.n), cdiv(K, s.k))
    return (N,) if s.n else (1,)


def scales_per_element(t: torch.Tensor, fmt, K: int, N: int) -> torch.Tensor:
    """[N, K] float -> [N, K] of each element's block's value of ``t`` (a scale per tensor / row / block)."""
    s = fmt.scales
    if s.k:
        return t.repeat_interleave(s.n, 0)[:N].repeat_interleave(s.k, 1)[:, :K]
    return t.view(-1, 1).expand(N, K) if s.n else t.view(1, 1).expand(N, K)


def quantize(w: torch.Tensor, fmt="fp8") -> QuantWeight:
    """``w`` [K, N] (any float dtype) in the fp8 weight format ``fmt``: per scale region, scale = amax / 448,
    q = e4m3(w * 448 / amax) (0 and scale 0 for an all-zero region), in fp32."""
    f = fp8_format(fmt)
    K, N = w.shape
    wt = w.t().float()                                                          # [N, K]
    s = f.scales
    if s.k:
        nb, kb = cdiv(N, s.n), cdiv(K, s.k)
        pad = torch.nn.functional.pad(wt, (0, kb * s.k - K, 0, nb * s.n - N))
        amax = pad.view(nb, s.n, kb, s.k).abs().amax((1, 3))                    # [N/128, K/128]
    else:
        amax = wt.abs().amax(1) if s.n else wt.abs().amax().view(1)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.where(amax > 0, torch.full_like(amax, E4M3_MAX).div(safe), torch.zeros_like(amax))
    q = (wt * scales_per_element(inv, f, K, N)).clamp(-E4M3_MAX, E4M3_MAX).to(FP8).contiguous()
    return QuantWeight(f.name, q, amax.div(torch.full_like(amax, E4M3_MAX)).contiguous(), None, K, N,
                       s.k if s.k else 0)


def dequantize(qw: QuantWeight, dtype=torch.float32) -> torch.Tensor:
    """[K, N]: q * its scale, in fp64 then ``dtype``."""
    f = fp8_format(qw)
    K, N = qw.shape
    return (qw.qweight.double() * scales_per_element(qw.scales.double(), f, K, N)).t().to(dtype)


def reference_q(xq: torch.Tensor, xs: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp64 [..., N]: the dequantized fp8 activations @ the dequantized weight (+ bias): the kernel's arithmetic
    without its rounding."""
    y = AQ.dequantize(xq, xs, act_format_for(qw).scales.k) @ dequantize(qw, torch.float64)
    return y if bias is None else y + bias.double()


def reference(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x quantized as the launcher does (``act_quant.reference``), then ``reference_q``; in x's dtype."""
    xq, xs = AQ.reference(x, act_format_for(qw))
    return reference_q(xq, xs, qw, bias).to(x.dtype)


def prepare_torch(qw: QuantWeight) -> None:
    """``torch._scaled_mm`` with row-wise scales where this torch runs it for ``qw``'s device (per-token x
    per-channel or per-tensor weights); else the dequantize reference, labelled in ``qw.torch_impl``."""
    f = fp8_format(qw)
    K, N = qw.shape
    op = getattr(torch, "_scaled_mm", None)
    why = f"torch {torch.__version__} has no torch._scaled_mm"
    if f.scales.k:
        why = "torch._scaled_mm takes no 128x128 weight blocks with 1x128 activation groups here"
    elif op is not None:
        sb = qw.scales.view(1, -1).expand(1, N).contiguous()
        try:
            op(torch.zeros(1, K, dtype=FP8, device=qw.device), qw.qweight.t(), scale_a=torch.ones(1, 1,
               device=qw.device), scale_b=sb, out_dtype=torch.bfloat16)
            qw.torch_impl, qw.torch_args = "torch._scaled_mm (row-wise scales)", (qw.qweight.t(), sb)
            return
        except (RuntimeError, NotImplementedError) as e:
            why = f"torch._scaled_mm refused it on {qw.device.type} ({str(e).splitlines()[0][:80]})"
    qw.torch_impl = f"dequantize reference: fp8 x and w dequantized to fp32, then x @ w per call ({why})"
    qw.torch_args = ()


def torch_gemm(xq: torch.Tensor, xs: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None, *,
               out_dtype=torch.bfloat16) -> torch.Tensor:
    """The torch peer of ``gemm_fp8`` (what ``prepare_torch`` chose)."""
    K, N = qw.shape
    xq2 = xq.reshape(-1, K)
    if qw.torch_args:
        wt, sb = qw.torch_args
        y = torch._scaled_mm(xq2, wt, scale_a=xs.reshape(-1, 1).float(), scale_b=sb, bias=bias, out_dtype=out_dtype)
        return y.view(*xq.shape[:-1], N)
    group = act_format_for(qw).scales.k
    x = AQ.dequantize(xq2, xs.reshape(xq2.shape[0], -1) if group else xs.reshape(-1), group, torch.float32)
    y = x @ dequantize(qw, torch.float32)
    return add_bias(y, None if bias is None else bias.float()).to(out_dtype).view(*xq.shape[:-1], N)


def torch_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The torch backend's fp8 linear: x quantized in torch (``act_quant.reference``), then ``torch_gemm``."""
    if not qw.torch_impl:
        prepare_torch(qw)
    xq, xs = AQ.reference(x, act_format_for(qw))
    return torch_gemm(xq, xs, qw, bias, out_dtype=x.dtype)


def cost(tokens: int, in_features: int, out_features: int, weight="fp8", out_dtype="bf16", *,
         bias: bool = False) -> Cost:
    """The GEMM on fp8 activations: FLOPs 2 T K N (+ T N with a bias); bytes = the weight as stored with its
    scales (``weight_bytes`` of ``weight``) + the activations in their fp8 format with theirs (``weight_bytes``
    of ``act_format_for(weight)`` over [K, T]) + y [T, N] in ``out_dtype`` (+ the bias's N once). Quantizing x
    is ``act_quant.cost``."""
    d = out_dtype if isinstance(out_dtype, str) else dtype_name(out_dtype)
    T, K, N = tokens, in_features, out_features
    wb = weight_bytes(fp8_format(weight), K, N, d)
    xb = weight_bytes(act_format_for(weight), K, T, d)
    ob = (T * N + (N if bias else 0)) * FLOAT_BYTES[d]
    return Cost(flops=2.0 * T * K * N + (T * N if bias else 0), bytes=wb + xb + ob)


# ---------------------------------------------------------------- the torch backend's routed experts

EXPERT_IMPL = ("weight-only (W8A16, as the fused kernel): x @ the fp8 expert dequantized to x's dtype; "
               "the activations are not quantized")


def torch_expert(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """The torch backend's GEMM of one fp8 routed expert: the fused MoE kernel's arithmetic (``kernels.moe``: the
    weight dequantized, x in its own dtype), not the W8A8 linear's (``EXPERT_IMPL``)."""
    return x @ dequantize(qw, x.dtype)


# ---------------------------------------------------------------- tensor-parallel shards

def _cut(what: str, start: int, stop: int, full: int, block: int) -> None:
    if start % block or (stop % block and stop != full):
        raise ValueError(f"an fp8-block slice of {what} {start}:{stop} (of {full}) cuts a {block}-block of scales: "
                         "shard at whole blocks.")


def slice_rows(q, axis: str, start: int, stop: int):
    """``kernels.quant.slice_quant`` for the fp8 formats (a ``QuantWeight`` or, with a leading E, ``QuantExperts``):
    qweight [.., N, K] by rows ("out") or columns ("in"); per-tensor scales [.., 1] whole; per-channel [.., N]
    follow "out" and stay whole on "in"; 128 x 128 blocks [.., cdiv(N, 128), cdiv(K, 128)] follow both, so a slice
    must keep whole blocks (its stop may be the weight's last, partial one): else a ValueError
    (``kernels.quant.check_tp_scales`` says so in one line before anything runs)."""
    sc = fp8_format(q).scales
    K, N = q.in_features, q.out_features
    if axis == "out":
        if sc.k:
            _cut("output channels", start, stop, N, sc.n)
            scales = q.scales[..., start // sc.n: cdiv(stop, sc.n), :]
        else:
            scales = q.scales[..., start:stop] if sc.n else q.scales
        return remake(q, qweight=q.qweight[..., start:stop, :], scales=scales, out_features=stop - start)
    if sc.k:
        _cut("input features", start, stop, K, sc.k)
        scales = q.scales[..., start // sc.k: cdiv(stop, sc.k)]
    else:
        scales = q.scales
    return remake(q, qweight=q.qweight[..., start:stop], scales=scales, in_features=stop - start)


def pad_out(q: QuantWeight, n: int) -> QuantWeight:
    """``q`` with zero output channels up to ``n``: zero values (so 0 whatever their scale), zero scales for the
    new channels (per channel) or the new blocks (128 x 128; a partial last block's new rows keep its scale)."""
    sc = fp8_format(q).scales
    extra = n - q.out_features
    qweight = torch.cat([q.qweight, q.qweight.new_zeros(extra, q.qweight.shape[1])])
    s = q.scales
    if sc.k:
        s = torch.cat([s, s.new_zeros(cdiv(n, sc.n) - s.shape[0], s.shape[1])])
    elif sc.n:
        s = torch.cat([s, s.new_zeros(extra)])
    return remake(q, qweight=qweight, scales=s, out_features=n)


for _name in FORMATS:
    register_format(_name, quantize=partial(quantize, fmt=_name), dequantize=dequantize, prepare_torch=prepare_torch,
                    torch_linear=torch_linear, triton_linear=linear_fp8, triton_config=run_config, slice=slice_rows,
                    pad_out=pad_out,
                    acts={"linear": act_format_for(_name)}, torch_expert=torch_expert, torch_expert_impl=EXPERT_IMPL)
