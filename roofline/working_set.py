"""What a point keeps touching when it is timed: the working set a cache-level roof is judged by, and the share of a
point's bytes that are linear weights (``roofline.analysis`` reads both).

A linear op's working set is its weight (the activations stream through), counted from its FLOPs and rows and
each op's element bytes under the point's weight label (``precision.modules.element_bytes``: a checkpoint's
per-module formats too); any other op's is its whole ``Cost.bytes``. A step's is its largest op's when each op
was timed alone and repeated (a profile), the sum over its ops' instances when they ran one after another (a
trace). An op is found in the model's step (``roofline.layer``), a Llama's when the model is unknown (a result
file written before the layer became data).
"""

from __future__ import annotations

from .formulas import linear_weight_elements_from_flops
from .layer import model_ops
from .ops import kind
from .precision.modules import element_bytes
from .records import Measurement
from .workload import LAYER_OP, LLAMA_LAYER_OPS, LLAMA_OPS


def op_kind(op: str, model) -> tuple:
    """(kind, per-layer) of the op named ``op`` in ``model``'s step, a Llama's when the model is unknown (a result
    file written before the layer became data); ("", False) for a name the step does not have (``layer``)."""
    if model is None:
        return LLAMA_OPS.get(op, ""), op in LLAMA_LAYER_OPS
    for o in model_ops(model):
        if o.name == op:
            return o.kind, o.per_layer
    return "", False


def is_linear(op: str, model) -> bool:
    """A linear layer, by its kind's ``linear`` flag (``roofline.ops``)."""
    k = op_kind(op, model)[0]
    return bool(k) and kind(k).linear


def weight_bytes_per_layer(model, label: str, act: str) -> float:
    """Linear weight bytes of one layer (on average over the layers) under a point's weight label (each op's
    element bytes: ``precision.modules.element_bytes``), from the model's op list."""
    per = [o for o in model_ops(model) if kind(o.kind).linear and o.per_layer]
    return sum(o.dims["in_features"] * o.dims["out_features"] * o.count * element_bytes(label, o, act)
               for o in per) / model.n_layers


def weight_share(m: Measurement, model) -> float:
    """Share of a measurement's bytes that are linear-layer weights (1 for a linear op)."""
    if is_linear(m.point.op, model):
        return 1.0
    b = m.point.cost.bytes
    if m.point.op != LAYER_OP or model is None or not b:
        return 0.0
    return weight_bytes_per_layer(model, m.point.weight_dtype, m.point.dtype) / m.point.tp / b


def working_set_bytes(p, model=None) -> float:
    """Bytes a point's repeated calls keep touching: a linear op's weight (the activations stream through), else
    its whole ``Cost.bytes``. ``model``: the run's ModelConfig (None: a Llama's ops, an older result file)."""
    k, per_layer = op_kind(p.op, model)
    if k and kind(k).linear:
        rows = p.batch * p.new_tokens if per_layer else p.batch   # the head reads the last token only
        spec = next((o for o in model_ops(model) if o.name == p.op), None) if model is not None else None
        return linear_weight_elements_from_flops(p.cost.flops, rows) * element_bytes(p.weight_dtype, spec, p.dtype)
    return p.cost.bytes


def step_working_set(ops, header) -> float:
    """Bytes a step keeps touching: its largest op's working set when each op was timed alone and repeated (a
    profile), the sum over its ops' instances when they ran one after another (a trace)."""
    sets = [working_set_bytes(r.point, header.model) * (r.count if header.kind == "trace" else 1) for r in ops]
    return (sum(sets) if header.kind == "trace" else max(sets)) if sets else 0.0
