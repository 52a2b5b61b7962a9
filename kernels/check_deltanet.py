"""``roofline check``'s Gated DeltaNet rows (part "kernels", issue 32): the chunked gated delta rule (from zeros, and
from a slot's state over three chunks of 16 and two of 64, the last partial), the recurrent decode step, the causal
conv1d with its state (prefill and the one-token update), the gates, the gated RMSNorm and the output gate, each
against its torch reference (transformers' fallbacks, ``kernels.deltanet``: fp32 maths) on the same inputs; outputs
and the written states compared (a slot the call does not name must stay as it was), outputs poisoned with NaN.

``gate_error`` / ``decay_error`` multiply the beta / g the references get by (1 + error): a kernel 1% off in a gate
or a decay fails these rows (tests/test_deltanet_kernels.py)."""

from __future__ import annotations

import torch

from . import conv1d as CV
from . import deltanet as DN
from ._common import dtype_name
from .check_result import rel_err, result
from .runner_registry import checks

# fp32: summation order only; bf16/fp16 inputs upcast, fp32 maths, one rounding at each store
TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}
KINDS = ("conv1d", "delta_gates", "gated_delta", "gated_norm", "sigmoid_gate")


def deltanet_rows(ops, dt, dev, gate_error: float = 0.0, decay_error: float = 0.0, seed: int = 3232):
    """Yield (name, out, ref, detail) per row (module docstring) on ``ops``' backend."""
    g_ = torch.Generator(device=dev).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g_, device=dev).to(dt)  # noqa: E731
    tri = ops.name == "triton"
    B, Hk, Hv, dk, dv = 2, 2, 4, 16, 24
    slots = torch.tensor([2, 0], device=dev)
    for T, chunk, has in ((37, 16, False), (37, 16, True), (70, 64, True)):
        q, k, v = rnd(B, T, Hk, dk), rnd(B, T, Hk, dk), rnd(B, T, Hv, dv)
        decay = -torch.rand(B, T, Hv, generator=g_, device=dev) * 0.5
        beta = torch.rand(B, T, Hv, generator=g_, device=dev).to(dt)
        s0 = torch.randn(3, Hv, dk, dv, generator=g_, device=dev) * 0.3
        s1, s2 = s0.clone(), s0.clone()
        kw = dict(chunk=chunk, has_state=has)
        o = (ops.delta_prefill(q, k, v, decay, beta, s1, slots, **kw, out=torch.full((B, T, Hv, dv), float("nan"),
                                                                                     dtype=dt, device=dev))
             if tri else ops.delta_prefill(q, k, v, decay, beta, s1, slots, **kw))
        ref = DN.chunk_reference(q.float(), k.float(), v.float(), decay * (1 + decay_error),
                                 beta.float() * (1 + gate_error), s2, slots, **kw)
        what = f"B={B} T={T} Hk/Hv={Hk}/{Hv} dk={dk} dv={dv} chunk={chunk}" + (" from a state" if has else "")
        yield f"gated_delta prefill {what}", o, ref, "vs transformers' chunked rule"
        yield f"gated_delta state {what}", s1, s2, "the slots' final states; slot 1 untouched"
    q, k, v = rnd(B, Hk, dk), rnd(B, Hk, dk), rnd(B, Hv, dv)
    decay, beta = -torch.rand(B, Hv, generator=g_, device=dev) * 0.5, torch.rand(B, Hv, generator=g_, device=dev).to(dt)
    s0 = torch.randn(3, Hv, dk, dv, generator=g_, device=dev) * 0.3
    s1, s2 = s0.clone(), s0.clone()
    o = ops.delta_decode(q, k, v, decay, beta, s1, slots)
    ref = DN.recurrent_reference(q.float(), k.float(), v.float(), decay * (1 + decay_error),
                                 beta.float() * (1 + gate_error), s2, slots)
    yield f"gated_delta decode B={B} Hv={Hv} dk={dk} dv={dv}", o, ref, "vs transformers' recurrent step"
    yield f"gated_delta decode state B={B}", s1, s2, "read and written once"
    C, K = 40, 4
    w = rnd(C, K)
    for T in (1, 19):
        x, cs = rnd(B, T, C), rnd(3, C, K - 1)
        c1, c2 = cs.clone(), cs.float().clone()
        y = ops.conv1d(x, w, None, c1, slots)
        yield (f"causal_conv1d B={B} T={T} C={C} k={K}", y, CV.reference(x.float(), w.float(), None, c2, slots),
               "from the slots' conv states" + ("; decode update" if T == 1 else ""))
        yield f"causal_conv1d state T={T}", c1, c2, "the last k - 1 inputs"
    a, b = rnd(9, Hv) * 3, rnd(9, Hv)
    a_log, dt_b = rnd(Hv), rnd(Hv)
    g1, b1 = ops.delta_gates(a, b, a_log, dt_b)
    g2, b2 = DN.gates_reference(a.float(), b.float(), a_log.float(), dt_b.float())
    yield f"delta_gates g N=9 Hv={Hv}", g1, g2 * (1 + decay_error), "-exp(A_log) softplus(a + dt_bias), fp32"
    yield f"delta_gates beta N=9 Hv={Hv}", b1, b2 * (1 + gate_error), "sigmoid(b)"
    x, z, wn = rnd(11, dv), rnd(11, dv), rnd(dv)
    yield (f"gated_rmsnorm N=11 D={dv}", ops.gated_rmsnorm(x, z, wn, 1e-6),
           DN.gated_norm_reference(x.float(), z.float(), wn.float()) * (1 + gate_error), "rmsnorm(x) w silu(z)")
    yield (f"sigmoid_gate N=11 D={dv}", ops.sigmoid_gate(x, z), DN.sigmoid_gate_reference(x.float(), z.float())
           * (1 + gate_error), "the gated attention's output")


@checks("deltanet", "kernels", KINDS, order=20)
def _deltanet_rows(ops, dt, dev, quick, model):
    tol = TOL[dtype_name(dt)]
    return [result(name, rel_err(out, ref), tol, detail) for name, out, ref, detail in deltanet_rows(ops, dt, dev)]
