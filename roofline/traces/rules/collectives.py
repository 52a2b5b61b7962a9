"""Trace cost rules for collectives: ``record_param_comms`` (Collective name, In/Out msg nelems, Group size,
dtype), ``c10d::`` / ``_c10d_functional::`` / ``nccl:`` ops from their input shapes.

Category "communication": message bytes and ``formulas.collective_bytes`` on the wire (for busbw),
no HBM cost (kept off the roofline). Costed without recorded shapes when the message sizes are there.
"""

from __future__ import annotations

from ... import formulas as F
from ...cost import Cost
from ...dtypes import bytes_per_element
from ...safejson import finite, whole
from ..opcost import numel
from ..registry import rule

COLLECTIVE_OPS = ("record_param_comms", "c10d::", "nccl:", "_c10d_functional::")
_COMM_TYPES = {"float": "fp32", "bfloat16": "bf16", "half": "fp16", "double": "fp64", "long": "int64", "int": "int32",
               "byte": "uint8", "char": "int8", "bool": "bool", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def _elements(v):
    """A message's element count as recorded: a whole number stays one; NaN, Infinity, negatives and junk are None."""
    n = whole(v, 0)
    if n is not None:
        return n
    f = finite(v)
    return f if f is not None and f >= 0 else None


@rule(pattern="^(?:" + "|".join(COLLECTIVE_OPS) + ")", category="communication", shapes=False)
def collective(a):
    args = a.raw
    kind = str(args.get("Collective name") or a.name.split("::")[-1].split(":")[-1]).strip('"')
    group = whole(args.get("Group size"), 1)
    dt = _COMM_TYPES.get(str(args.get("dtype", "")).strip('"').lower())
    elems = _elements(args.get("In msg nelems"))
    if "gather" in kind.lower():
        elems = _elements(args.get("Out msg nelems", elems))
    ts = a.tensors()
    if elems is None and ts:
        elems, dt = numel(ts[0][0]), ts[0][1]
    detail = {"collective": kind, "group_size": group}
    if isinstance(elems, (int, float)) and dt:
        msg = elems * bytes_per_element(dt)
        detail["message_bytes"] = msg
        if isinstance(group, int) and group > 0:
            detail["wire_bytes"] = F.collective_bytes(kind, msg, group)
    return a.op(Cost(0, 0), dt or "bf16", f"{kind} {elems} x {dt} over {group} ranks", detail=detail)
