"""The mixture-of-experts kinds: router (the [H, E] gate GEMM and the top-k), experts (the routed experts as
one grouped GEMM: the weight bytes of the distinct experts a chunk touches; under expert parallelism one
rank's E / ep whole experts and the rows routed to them) and gate (Qwen2-MoE's shared-expert gate)."""

from __future__ import annotations

from .. import formulas as F
from ..dtypes import bytes_per_element
from ..errors import RooflineError
from .registry import OpKind, register


def distinct_experts(n_experts: int, k: int, tokens: int, load=()) -> float:
    """Experts a step of ``tokens`` routed tokens touches per MoE layer, in expectation: uniform routing, or
    ``load`` (each expert's share of the routed slots: a skew or a measured histogram)
    (``formulas.expected_distinct_experts``)."""
    try:
        return F.expected_distinct_experts(n_experts, k, tokens, skew=list(load) if load else None)
    except ValueError as e:   # a histogram that no top-k routing can produce, or of the wrong length
        raise RooflineError(f"expert load: {e}") from None


def rank_experts(d: dict, tokens: int, load=()) -> tuple:
    """(routed rows, distinct experts) of one rank's experts op (its ``dims`` ``d``) for ``tokens`` tokens: all
    T*k rows and ``distinct_experts`` of all E, or under expert parallelism the busiest rank's
    (``formulas.moe_rank_load``)."""
    ep = d.get("ep", 1)
    if ep > 1:
        return F.moe_rank_load(d["n_experts"], d["k"], tokens, ep, skew=list(load) if load else None)
    return tokens * d["k"], distinct_experts(d["n_experts"], d["k"], tokens, load)


def _gate_weights(op, s):
    """The op's first weight as its format stores it (the router's and the shared gate's: the activation dtype
    unless a flag says otherwise; no checkpoint here quantizes them)."""
    w = op.weights[0].shape
    return s.dtypes.precision.weight_bytes(op, w[0], w[1], s.dtypes.act)


def _router(op, s):   # the gate's bias, like the gate, in the activation dtype
    d, a = op.dims, s.dtypes.act
    return F.router(s.rows, d["in_features"], d["n_experts"], d["k"], kind=d["kind"], weight_dtype=a, act_dtype=a,
                    gate_bias=any(w.key == "router_bias" for w in op.weights),
                    score_bias=any(w.key == "router_correction" for w in op.weights),
                    renorm=d.get("renorm", True), n_group=d.get("n_group", 1), weight_bytes=_gate_weights(op, s))


def _experts_load(op, s):
    return rank_experts(op.dims, s.rows, s.dtypes.expert_load)


def one_expert_bytes(op, s) -> float:
    """One expert's weights as the step's precision stores them (``expert_bytes``)."""
    return expert_bytes(op, s.dtypes.precision, s.dtypes.act)


def expert_bytes(op, precision, act: str) -> float:
    """One expert's weights as their format stores them: gate and up [H, I] (up alone without a gate:
    ``formulas.expert_matrices``), down [I, H], scales included (``Precision.weight_bytes``), + its biases
    (2I + H, activation dtype) with ``bias`` (GPT-OSS)."""
    d = op.dims
    H, I, m = d["hidden"], d["intermediate"], F.expert_matrices(d["activation"])
    w = (m - 1) * precision.weight_bytes(op, H, I, act) + precision.weight_bytes(op, I, H, act)
    return w + (((m - 1) * I + H) * bytes_per_element(act) if d["bias"] else 0)


def _experts(op, s):
    d, dt, T = op.dims, s.dtypes, s.rows
    shared = dict(activation=d["activation"], bias=d["bias"], act_dtype=dt.act, expert_bytes=one_expert_bytes(op, s))
    if d.get("ep", 1) > 1:   # expert parallel: this rank's routed rows and its experts
        rows, distinct = _experts_load(op, s)
        return F.moe_experts_ep(T, d["hidden"], d["intermediate"], d["n_experts"], d["k"], d["ep"], rows=rows,
                                distinct=distinct, **shared)
    return F.moe_experts(T, d["hidden"], d["intermediate"], d["n_experts"], d["k"],
                         distinct=distinct_experts(d["n_experts"], d["k"], T, dt.expert_load), **shared)


def _experts_weight_bytes(op, s):
    """The distinct experts the chunk touches (on this rank), each read once, scales and biases included."""
    return one_expert_bytes(op, s) * _experts_load(op, s)[1]


def _gate(op, s):     # Qwen2-MoE's shared-expert gate: sigmoid(x w) [T, 1] times the shared output [T, H]
    d, a, T = op.dims, s.dtypes.act, s.rows
    return (F.linear(T, d["in_features"], 1, act_dtype=a, weight_bytes=_gate_weights(op, s))
            + F.elementwise(T * d["width"], ((T * d["width"], a), (T, a)), out_dtype=a, flops_per_element=1))


ROUTER = register(OpKind("router", "mlp", _router, weight_bytes=_gate_weights, tensor=True))
EXPERTS = register(OpKind("experts", "mlp", _experts, weight_bytes=_experts_weight_bytes, tensor=True,
                          experts=_experts_load))
GATE = register(OpKind("gate", "mlp", _gate, weight_bytes=_gate_weights))
