"""``roofline check``'s FP4 rows (part "quant"): the mxfp4 and nvfp4 linear and fused MoE experts against fp64
references over the dequantized weights, on the backend being checked (triton: ``kernels.linear_fp4`` and
``kernels.moe``'s QUANT 3 / 4 kernels, under the interpreter on a CPU; torch: ``kernels.fp4``'s dequantize path).

Shapes are not multiples of the blocks (N = 70, 50; I = 96 against BLOCK_N 64), one launch forces small tiles,
one split-K; the MoE cases take the skinny configuration (GPT-OSS-like: T k = 10 rows on 4 experts, the clamped
SwiGLU with biases, mxfp4) and the tiled one (80 rows, SiLU, both formats); expert 0 is favoured, expert E-1
gets no token.

Tolerance (``FP4_TOL``, per kind): the dequantized weights are exact in every activation dtype (``kernels.fp4``),
so what is left is the fp32 accumulation and the roundings of x, h, the partials and y: KERNEL_TOL's fp32 / fp16
bounds; in bf16 7.5e-3 for the linear (measured at most 5.4e-3 under the interpreter, which truncates) and
KERNEL_TOL's 1.6e-2 for the experts (at most 8.2e-3: h and the partials are rounded too). ``scale_error`` puts
an error into the references' scales (tests/test_fp4_kernels.py): nvfp4 through its stored fp32 tensor scale
(x (1 + error)); mxfp4, whose e8m0 scales cannot hold a 1% step (powers of two only), through its dequantized
scales on the reference side (every block's 2^e x (1 + error)). A 1% error fails every row in every dtype: the
linear's by about 1% (bf16: at least 9.4e-3 measured), the experts' by about 3% (all three weights' scales off:
at least 2.0e-2 in bf16). NB in bf16 one of the three expert weights 1% off alone (about 1%) would sit below the
experts' bf16 tolerance: the rows are sharp in fp32 and fp16, and per tensor in bf16.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from . import fp4
from . import moe as MOE
from . import router as RT
from ._common import dtype_name
from .linear_fp4 import linear_fp4
from .quant_weight import QuantExperts

FP4_TOL = {"linear": {"fp32": 1e-5, "fp16": 2e-3, "bf16": 7.5e-3}, "moe": {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}}
# (M, N, K, the triton launch's overrides)
LINEAR_CASES = ((37, 70, 96, dict(block_m=16, block_n=32, block_k=16)), (3, 50, 160, dict(block_k=32, split_k=3)),
                (1, 48, 64, {}))
# (T, E, k, H, I, activation, bias, formats): skinny (T k = 10 <= 16 x 4) and tiled (80 rows > 64)
MOE_CASES = ((5, 4, 2, 64, 96, "swiglu_oai", True, ("mxfp4",)), (5, 4, 2, 64, 96, "silu", False, ("nvfp4",)),
             (40, 4, 2, 128, 160, "silu", False, ("mxfp4", "nvfp4")))


def _off(q, err: float):
    """What the reference multiplies by: ``q`` itself (err 0), nvfp4 with its tensor scale x (1 + err), or mxfp4's
    weights dequantized in fp64 with every scale x (1 + err) (a float weight)."""
    if not err:
        return q
    if q.tensor_scale is not None:
        fresh = dict(views=()) if isinstance(q, QuantExperts) else {}          # the experts' views: rebuilt
        return replace(q, tensor_scale=q.tensor_scale * (1 + err), **fresh)
    return q.dequantize(torch.float64) * (1 + err)


def _linear_ref(x, q, err):
    w = _off(q, err)
    return fp4.reference(x, w) if not torch.is_tensor(w) else (x.double() @ w).to(x.dtype)


def fp4_rows(ops, dt, dev, scale_error: float = 0.0, seed: int = 2929):
    """Yield (name, out, ref, tol, detail) per FP4 row (module docstring) on ``ops``' backend, inputs drawn from
    ``seed`` in ``dt`` on ``dev``, outputs poisoned with NaN; ``scale_error`` goes into the references. Called by
    ``kernels.check.run_checks`` with part "quant"."""
    g = torch.Generator(device=dev).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev).to(dt)  # noqa: E731
    nan = lambda *s: torch.full(s, float("nan"), dtype=dt, device=dev)  # noqa: E731
    tri = ops.name == "triton"
    tol = {kind: t[dtype_name(dt)] for kind, t in FP4_TOL.items()}
    for fmt in fp4.FP4:
        for M, Nn, K, cfg in LINEAR_CASES:
            x, q = rnd(M, K), fp4.quantize(rnd(K, Nn) * K ** -0.5, fmt)
            y = linear_fp4(x, q, out=nan(M, Nn), **cfg) if tri else fp4.torch_linear(x, q)
            how = ", ".join(f"{k}={v}" for k, v in cfg.items()) if tri else q.torch_impl.split(":")[0]
            yield (f"linear_{fmt} M={M} N={Nn} K={K}", y, _linear_ref(x.double(), q, scale_error), tol["linear"],
                   f"vs dequantized; {how}")
    for T, E, k, H, I, act, bias, fmts in MOE_CASES:  # noqa: E741
        lean = torch.zeros(E, device=dev)
        lean[0], lean[E - 1] = 2.0, -1e9                     # expert 0 takes most tokens, expert E-1 none
        w, ids = RT.route(rnd(T, E).float() + lean, k, kind="softmax_topk")
        x = rnd(T, H)
        wts = [rnd(E, K, N) * K ** -0.5 for K, N in ((H, I), (H, I), (I, H))]
        bb = {n: rnd(E, m) * 0.1 for n, m in (("b_gate", I), ("b_up", I), ("b_down", H))} if bias else {}
        for fmt in fmts:
            q = [fp4.quantize_experts(t, fmt) for t in wts]
            y = ops.moe_experts(x, *q, w, ids, activation=act, **bb, **(dict(out=nan(T, H)) if tri else {}))
            ref = MOE.reference(x.double(), *[_off(t, scale_error) for t in q], w.double(), ids, activation=act,
                                compute_dtype=torch.float64, **{n: b.double() for n, b in bb.items()})
            c = MOE.moe_config(T, E, k, H, I, x.dtype, dev)
            how = f"{c['kind']}, block_k={c['block_k']}" if tri else f"per expert: {q[0].torch_impl}"
            yield (f"experts_{fmt} T={T} E={E} k={k} {act}" + (" +bias" if bias else ""), y, ref, tol["moe"],
                   f"vs dequantized; {how}")
