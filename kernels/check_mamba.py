"""``roofline check``'s Mamba-2 rows (part "kernels", issue 32): the SSD chunked scan (from zeros over two chunks of
16 and a partial one, from a slot's state over a chunk of 32 and a partial one, Nemotron-H's dt limit), the
recurrent decode step continuing from the written state, the causal conv1d with its bias and state (prefill and
the one-token update) and the gated RMSNorm in groups, each against its torch reference (transformers' torch
path, ``kernels.mamba`` / ``kernels.conv1d``: fp32 maths) on the same inputs; outputs and the written states
compared (a slot the call does not name must stay as it was), Triton outputs poisoned with NaN.

``dt_error`` / ``a_error`` / ``d_error`` give the references dt, A (= -exp(A_log)) and D times (1 + error): a
kernel 1% off in any of them fails these rows (tests/test_mamba_kernels.py)."""

from __future__ import annotations

import math

import torch

from . import conv1d as CV
from . import mamba as MB
from ._common import dtype_name
from .check_result import rel_err, result
from .runner_registry import checks

# fp32: summation order only; bf16/fp16 inputs upcast, fp32 maths, one rounding at each store
TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}
KINDS = ("conv1d", "ssd_scan", "gated_norm")
LIMIT = (0.001, float("inf"))          # Nemotron-H's time_step_limit


def mamba_rows(ops, dt, dev, dt_error: float = 0.0, a_error: float = 0.0, d_error: float = 0.0, seed: int = 3233):
    """Yield (name, out, ref, detail) per row (module docstring) on ``ops``' backend."""
    g_ = torch.Generator(device=dev).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g_, device=dev).to(dt)  # noqa: E731
    tri = ops.name == "triton"
    B, H, P, G, N = 2, 4, 24, 2, 16
    slots = torch.tensor([2, 0], device=dev)
    a_log = torch.rand(H, generator=g_, device=dev).mul(3).log1p().to(dt)
    dt_bias, D = (rnd(H) * 0.5), rnd(H)
    ref_p = dict(a_log=a_log.float() + math.log1p(a_error), dt_bias=dt_bias.float(), D=D.float() * (1 + d_error))
    state = torch.randn(3, H, P, N, generator=g_, device=dev) * 0.3
    s1, s2 = state.clone(), state.clone()
    for T, chunk, has in ((37, 16, False), (45, 32, True)):
        x, dtt, Bm, Cm = rnd(B, T, H, P), rnd(B, T, H), rnd(B, T, G, N), rnd(B, T, G, N)
        kw = dict(chunk=chunk, has_state=has, dt_limit=LIMIT)
        nan = dict(out=torch.full((B, T, H, P), float("nan"), dtype=dt, device=dev)) if tri else {}
        y = ops.ssd_prefill(x, dtt, Bm, Cm, a_log, dt_bias, D, s1, slots, **kw, **nan)
        ref = MB.ssd_reference(x.float(), dtt.float() * (1 + dt_error), Bm.float(), Cm.float(), ref_p["a_log"],
                               ref_p["dt_bias"], ref_p["D"], s2, slots, **kw)
        what = f"B={B} T={T} H={H} P={P} G={G} N={N} chunk={chunk}" + (" from a state" if has else "")
        yield f"ssd_scan prefill {what}", y, ref, "vs transformers' chunked scan"
        yield f"ssd_scan state {what}", s1, s2, "the slots' final states; slot 1 untouched"
    for step in range(2):                                        # decode continues from the prefill's states
        x, dtt, Bm, Cm = rnd(B, H, P), rnd(B, H), rnd(B, G, N), rnd(B, G, N)
        y = ops.ssd_decode(x, dtt, Bm, Cm, a_log, dt_bias, D, s1, slots)
        ref = MB.step_reference(x.float(), dtt.float() * (1 + dt_error), Bm.float(), Cm.float(), ref_p["a_log"],
                                ref_p["dt_bias"], ref_p["D"], s2, slots)
        yield f"ssd_scan decode step {step + 1} B={B} H={H} P={P} N={N}", y, ref, "vs transformers' cached step"
        yield f"ssd_scan decode state step {step + 1}", s1, s2, "read and written once"
    C, K = H * P + 2 * G * N, 4
    w, bias = rnd(C, K), rnd(C)
    cs = rnd(3, C, K - 1)
    c1, c2 = cs.clone(), cs.float().clone()
    for T in (19, 1):
        x = rnd(B, T, C)
        y = ops.conv1d(x, w, bias, c1, slots)
        yield (f"conv1d B={B} T={T} C={C} k={K} bias", y, CV.reference(x.float(), w.float(), bias.float(), c2, slots),
               "from the slots' conv states" + ("; decode update" if T == 1 else ""))
        yield f"conv1d state T={T}", c1, c2, "the last k - 1 inputs"
    x, z, wn = rnd(11, H * P), rnd(11, H * P), rnd(H * P)
    yield (f"gated_group_rmsnorm N=11 I={H * P} groups={G}", ops.gated_group_rmsnorm(x, z, wn, G, 1e-5),
           MB.gated_norm_reference(x.float(), z.float(), wn.float(), G, 1e-5), "w x grouped rmsnorm(y silu(z))")


@checks("mamba", "kernels", KINDS, order=30)
def _mamba_rows(ops, dt, dev, quick, model):
    tol = TOL[dtype_name(dt)]
    return [result(name, rel_err(out, ref), tol, detail) for name, out, ref, detail in mamba_rows(ops, dt, dev)]
