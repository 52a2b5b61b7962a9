"""``roofline check``'s FP8 rows: the W8A8 GEMM, the activation quantization and fp8 KV caches, each one failing
when a scale is 1% off (tests/test_fp8_kernels.py perturbs one and sees the row fail).

- ``linear_fp8`` per tensor, per channel and 128 x 128 blocks (every fp8 weight format of the registry:
  ``kernels.linear_fp8.FORMATS``) at shapes that are not multiples of the blocks (K = 300: two whole blocks and
  one of 44; N = 70, 200, 48), forced tiles and split-K on triton, a bias, outputs in fp32 and fp16 (``GEMM_OUTS``). Against ``reference_q`` (fp64 over the same fp8 operands: ``act_quant.reference`` is bit-exact with the
  kernel) element by element: error / (the output's rounding, one unit in its last place, + the fp32
  accumulation bound K 2^-24 sum_k |x| |w|) <= 1. A scale 1% off moves the elements it covers by 1% of their
  share: ten units of fp16 (2^-10), far over the fp32 bound.
- ``act_quant`` per token and per 1 x 128 group (fp32, and the run's dtype in): each scale against amax / 448 in
  fp64 (to 2^-23 relative: one rounding) and each value within the e4m3 rounding bound of x (2^-4 |x| + 2^-10
  scale, + fp32 arithmetic); the larger of the two ratios <= 1.
- fp8 routed experts (``kernels.moe``'s QUANT 5 / 6: e4m3 decoded in registers, W8A16) per channel, per tensor and
  128 x 128 blocks, x in fp32 (so a scale 1% off, ~1e-3 of the output, is far over ``MOE_TOL``), skinny (GPT-OSS's
  clamped SwiGLU with biases) and tiled (SiLU), I = 192 (a partial 128-block along N of gate/up and K of down),
  against ``moe.reference`` (fp64 over the dequantized experts); the torch backend's peer is the same weight-only
  arithmetic (``linear_fp8.torch_expert``). These need no fp8 hardware (the bytes are decoded as integers): they run
  on every GPU too.
- decode and prefill attention over fp8 e4m3 caches with per-token-per-head scales ("fp8") and one scale per
  tensor ("fp8-tensor", vLLM's), q in fp32 (so a 1% scale error, >= 1e-4 of the output here, is far over the fp32
  tolerance 1e-5), against the fp64 reference over the dequantized cache.

Where: the torch backend always (``torch._scaled_mm`` / the dequantize reference, ``act_quant.reference``, the
attention peers); triton on a GPU with fp8 and under the interpreter (which runs these kernels: see
``kernels.linear_fp8``); on a GPU without fp8 the triton rows are not produced (``fp8_skip``: said in one line).
"""

from __future__ import annotations

import math

import torch

from roofline.precision import names

from . import act_quant as AQ
from . import decode_attention as DA
from . import linear_fp8 as LF
from . import moe as MOE
from . import router as RT
from . import prefill_attention as PA
from ._common import dtype_name, torch_dtype
from .check_result import rel_err, result
from .quant import fp8_supported, quantize_experts, quantize_kv_rows

UNIT = {"fp32": 2.0 ** -23, "fp16": 2.0 ** -10}   # one unit in the last place (relative): round or truncate
# The GEMM rows' outputs: fp32 and fp16. Not bf16: its unit (2^-7 of a value, truncated by the interpreter) is
# within a factor 1.3 of a 1% error, so a bf16 row could not fail on a scale 1% off; tests/test_fp8_kernels.py
# checks bf16 outputs against the reference to their unit.
GEMM_OUTS = ("fp32", "fp16")
ATTN_TOL = 1e-5                                                      # fp32 q (KERNEL_TOL["fp32"])
SMALL = dict(block_m=16, block_n=32, block_k=32)
GEMM_CASES = ((37, 70, 300, SMALL, True), (3, 200, 260, dict(split_k=3), False), (1, 48, 64, {}, False))
ACT_CASES = ((37, 300), (5, 1000), (1, 37))
MOE_TOL = 1e-5                                                       # fp32 x (KERNEL_TOL["fp32"])
# (T, E, k, H, I, activation, bias): skinny (10 rows over 4 experts: decode) and tiled (80 rows: prefill)
MOE_CASES = ((5, 4, 2, 128, 192, "swiglu_oai", True), (40, 4, 2, 256, 192, "silu", False))


def fp8_skip(backend: str, dev) -> str:
    """Why the triton fp8 rows cannot run on ``dev`` ("" when they can: a GPU with fp8, or the interpreter)."""
    if backend == "triton" and torch.device(dev).type == "cuda" and not fp8_supported(dev):
        return LF.REFUSAL.format(dev=dev)
    return ""


def gemm_bound_err(y, ref, x_abs_w_abs, K: int, out_dtype: str) -> float:
    """max |y - ref| / (UNIT |ref| + K 2^-24 |x| @ |w|) (module docstring); inf for NaN or a wrong shape."""
    y, ref = y.double(), ref.double()
    if y.shape != ref.shape or not torch.isfinite(y).all():
        return math.inf
    bound = UNIT[out_dtype] * ref.abs() + K * 2.0 ** -24 * x_abs_w_abs + 1e-30
    return float(((y - ref).abs() / bound).max())


def act_quant_err(x, q, s, group: int) -> float:
    """The larger of: each scale's distance from amax / 448 (fp64) over 2^-23 of it, and each value's distance from
    x over the e4m3 bound (module docstring)."""
    if not (torch.isfinite(q.double()).all() and torch.isfinite(s).all()):
        return math.inf
    s_ref = AQ.grouped(x.double(), group).abs().amax(-1).view(s.shape) / AQ.E4M3_MAX     # amax / 448 in fp64
    s_err = float(((s.double() - s_ref).abs() / (2.0 ** -23 * s_ref + 1e-300)).max())
    xd = x.double()
    deq = AQ.dequantize(q, s, group)
    sc = AQ.dequantize(torch.ones_like(q, dtype=torch.float64), s, group)        # each element's scale
    bound = 2.0 ** -4 * xd.abs() + 2.0 ** -10 * sc + 2.0 ** -21 * xd.abs() + 1e-300
    return max(s_err, float(((deq - xd).abs() / bound).max()))


def _cfg(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def gemm_checks(tri: bool, dev, g):
    """The fp8 GEMM rows (module docstring)."""
    for fmt in LF.FORMATS:
        for M, N, K, cfg, bias in GEMM_CASES:
            w = torch.randn(K, N, generator=g, device=dev) * K ** -0.5
            qw = LF.quantize(w, fmt)
            for od in GEMM_OUTS:
                odt = torch_dtype(od)
                x = torch.randn(M, K, generator=g, device=dev).to(odt)
                b = (torch.randn(N, generator=g, device=dev) * 0.1).to(odt) if bias else None
                y = LF.linear_fp8(x, qw, b, **cfg) if tri else LF.torch_linear(x, qw, b)
                xq, xs = AQ.reference(x, LF.act_format_for(qw))
                ref = LF.reference_q(xq, xs, qw, b)
                mag = AQ.dequantize(xq, xs, LF.act_format_for(qw).scales.k).abs() @ LF.dequantize(
                    qw, torch.float64).abs()
                how = _cfg(cfg) if tri else qw.torch_impl.split(":")[0]
                yield result(f"linear_fp8 {fmt} M={M} N={N} K={K}{' +bias' if bias else ''} out {od}",
                                     gemm_bound_err(y, ref, mag, K, od), 1.0,
                                     f"error / (out rounding + fp32 accumulation); {how}")


def act_quant_checks(tri: bool, dt, dev, g):
    """The activation quantization rows (module docstring)."""
    for fmt in (n for n in names("act") if n in ("fp8", "fp8-group")):
        group = AQ.group_of(fmt)
        for M, K in ACT_CASES:
            for d in dict.fromkeys([torch.float32, dt]):
                x = (torch.randn(M, K, generator=g, device=dev) * 3).to(d)
                x[-1, : K // 2] = 0                                     # a zero group (scale 0) when K >= 256
                q, s = AQ.act_quant(x, fmt) if tri else AQ.reference(x, fmt)
                yield result(f"act_quant {fmt} M={M} K={K} {dtype_name(d)}", act_quant_err(x, q, s, group),
                                     1.0, "max(scale vs amax/448, value vs e4m3 bound)" + ("" if tri else
                                                                                          "; torch path"))


def moe_checks(tri: bool, ops, dev, g):
    """fp8 routed experts per weight format (module docstring): expert 0 takes most tokens, expert E-1 none."""
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev)  # noqa: E731 - fp32
    for T, E, k, H, I, act, bias in MOE_CASES:  # noqa: E741
        logits = rnd(T, E)
        logits[:, 0] += 2.0
        logits[:, E - 1] = -1e9
        w, ids = RT.route(logits, k, kind="softmax_topk")
        x = rnd(T, H)
        bb = dict(b_gate=rnd(E, I) * 0.1, b_up=rnd(E, I) * 0.1, b_down=rnd(E, H) * 0.1) if bias else {}
        floats = (rnd(E, H, I) * H ** -0.5, rnd(E, H, I) * H ** -0.5, rnd(E, I, H) * I ** -0.5)
        for fmt in LF.FORMATS:
            q = [quantize_experts(t, fmt) for t in floats]
            y = ops.moe_experts(x, *q, w, ids, activation=act, **bb)
            ref = MOE.reference(x.double(), *q, w.double(), ids, activation=act, compute_dtype=torch.float64,
                                **{n: b.double() for n, b in bb.items()})
            c = MOE.moe_config(T, E, k, H, I, x.dtype, dev, scale_k=q[0].group_size)
            how = f"{c['kind']}, block_k={c['block_k']}" if tri else q[0].torch_impl.split(":")[0]
            yield result(f"moe_experts {fmt} T={T} E={E} k={k} {act}" + (" +bias" if bias else ""), rel_err(y, ref),
                         MOE_TOL, f"vs dequantized; {how}")


def kv_caches(g, dev):
    """(label, k values, v values, scales) of fp8 caches [4, 2, 64, 16]: per token per head, and per tensor."""
    (kq, ks), (vq, vs) = (quantize_kv_rows(torch.randn(4, 2, 64, 16, generator=g, device=dev), "fp8")
                          for _ in range(2))
    yield "fp8", kq, vq, (ks, vs)
    kf, vf = (torch.randn(4, 2, 64, 16, generator=g, device=dev) for _ in range(2))
    sk, sv = kf.abs().max().reshape(1) / 448, vf.abs().max().reshape(1) / 448
    yield "fp8-tensor", (kf / sk).to(LF.FP8), (vf / sv).to(LF.FP8), (sk, sv)


def kv_checks(tri: bool, dev, g):
    """Decode and prefill attention over fp8 caches (module docstring)."""
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev)  # noqa: E731 - fp32 q
    for label, kq, vq, sc in kv_caches(g, dev):
        for B, n, Hq, p, causal in ((2, 37, 4, 0, True), (1, 21, 4, 13, True), (2, 19, 2, 5, False)):
            q, slots = rnd(B, n, Hq, 16), torch.tensor([2, 0][:B], device=dev)
            o = (PA.prefill_attention(q, kq, vq, slots, p, causal=causal, scales=sc, block_m=16, block_n=16) if tri
                 else PA.sdpa(q, kq, vq, slots, p, causal=causal, scales=sc))
            ref = PA.reference(q.double(), kq, vq, slots, p, causal=causal, scales=sc)
            yield result(f"prefill_attn {label} KV B={B} n={n} p={p}" + ("" if causal else " noncausal"),
                                 rel_err(o, ref), ATTN_TOL, "fp32 q vs dequantized K/V")
        for Hq, lens, cfg in ((4, [37, 1, 0, 60], dict(block_n=16)), (8, [50, 13], dict(block_n=16, splits=3))):
            q = rnd(len(lens), Hq, 16)
            slots, ln = torch.tensor([3, 0, 1, 2][:len(lens)], device=dev), torch.tensor(lens, device=dev)
            o = (DA.decode_attention(q, kq, vq, ln, slots, scales=sc, **cfg) if tri
                 else DA.torch_decode(q, kq, vq, ln, slots, scales=sc))
            ref = DA.reference(q.double(), kq, vq, ln, slots, scales=sc)
            yield result(f"decode_attn {label} KV lens={lens} Hq={Hq}", rel_err(o, ref), ATTN_TOL,
                                 "fp32 q vs dequantized K/V" + (f"; {_cfg(cfg)}" if tri else ""))


def fp8_checks(ops, dt, dev, quick=True) -> list:
    """Every FP8 row for backend ``ops`` in dtype ``dt`` on ``dev`` (for triton on a GPU without fp8 only the
    experts', which decode e4m3 as integers)."""
    tri = ops.name == "triton"
    g = torch.Generator(device=dev).manual_seed(8)
    experts = list(moe_checks(tri, ops, dev, g))
    if fp8_skip(ops.name, dev):
        return experts
    return [*gemm_checks(tri, dev, g), *act_quant_checks(tri, dt, dev, g), *experts, *kv_checks(tri, dev, g)]
