"""Gated DeltaNet's kinds (Qwen3-Next, Qwen3.5: ``roofline.formulas.deltanet``): conv1d (the causal depthwise
conv over q, k, v and its state), delta_gates (beta and the decay g, reading A_log and dt_bias), gated_delta
(the chunked rule in prefill, the recurrent step in decode: the state read and written per sequence),
gated_norm (the gated RMSNorm of its output); and sigmoid_gate (the gated attention's output x sigmoid(gate)).
The projections (in_proj_*, out_proj) are linears."""

from __future__ import annotations

from .. import formulas as F
from .registry import OpKind, register


def _has_state(s) -> bool:
    return s.decode or s.cached > 0


def _conv(op, s):
    d = op.dims
    return F.causal_conv1d(s.rows, s.batch, d["channels"], d["kernel"], act_dtype=s.dtypes.act,
                           reads_state=_has_state(s), bias=d.get("bias", False))


def _gates(op, s):
    return F.delta_gates(s.rows, op.dims["v_heads"], act_dtype=s.dtypes.act)


def _delta(op, s):
    d, a = op.dims, s.dtypes.act
    if s.decode:
        return F.gated_delta_decode(s.batch, d["k_heads"], d["v_heads"], d["k_dim"], d["v_dim"], act_dtype=a)
    return F.gated_delta_prefill(s.batch, s.chunk, d["k_heads"], d["v_heads"], d["k_dim"], d["v_dim"],
                                 chunk=d["chunk"], act_dtype=a, reads_state=_has_state(s))


def _gated_norm(op, s):
    return F.gated_rmsnorm(s.rows * op.dims["rows"], op.dims["width"], act_dtype=s.dtypes.act)


def _sigmoid_gate(op, s):
    return F.sigmoid_gate(s.rows, op.dims["width"], act_dtype=s.dtypes.act)


CONV1D = register(OpKind("conv1d", "attention", _conv))
DELTA_GATES = register(OpKind("delta_gates", "attention", _gates))
# tensor: the chunked prefill's products run on tensor cores (FLA's tl.dot); decode is bound by the state's bytes
GATED_DELTA = register(OpKind("gated_delta", "attention", _delta, tensor=True, per_sequence=True))
GATED_NORM = register(OpKind("gated_norm", "norm", _gated_norm))
SIGMOID_GATE = register(OpKind("sigmoid_gate", "attention", _sigmoid_gate))
