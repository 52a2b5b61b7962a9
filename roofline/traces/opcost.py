"""What a trace cost rule reads and returns: ``OpArgs`` (an op's recorded inputs) and ``OpCost``.

A rule (``roofline.traces.registry``) is called with an ``OpArgs``: the op's name, its recorded
shapes (``Input Dims``), dtypes (``Input type``), values (``Concrete Inputs``), the raw args and
the run's activation dtype. It returns ``args.op(cost, dtype, signature, ...)``: an ``OpCost``
whose category is the rule's own (a rule that declares several, as copy/cast, names which),
``FRAMEWORK`` for an op that moves nothing, or None (uncosted). Also here: the dtype names a
trace records, and the two small helpers every rule uses (``numel``, ``signature``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..safejson import whole

TYPES = {"float": "fp32", "c10::bfloat16": "bf16", "bfloat16": "bf16", "c10::half": "fp16", "half": "fp16",
         "double": "fp64", "long int": "int64", "long": "int64", "int": "int32", "short int": "int16",
         "short": "int16", "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
         "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8",
         "c10::float8_e5m2fnuz": "fp8", "c10::qint8": "int8", "c10::quint8": "uint8"}
SCALAR_TYPES = {5: "fp16", 6: "fp32", 7: "fp64", 15: "bf16", 4: "int64", 3: "int32", 11: "bool", 23: "fp8",
                24: "fp8", 25: "fp8", 26: "fp8", 0: "uint8", 1: "int8", 2: "int16"}   # c10::ScalarType codes
FLOATS = ("fp32", "bf16", "fp16", "fp8", "fp64", "fp4")
FRAMEWORK = "framework"     # what a rule returns for an op that moves no data (its cost is truly zero)


class UndeclaredCategory(RuntimeError):
    """A rule returned a category it did not declare (a bug in the rule, never bad input)."""


@dataclass(frozen=True)
class OpCost:
    name: str               # the op, e.g. "aten::mm"
    category: str           # the rule's declared category (gemm, attention, norm, ..., communication)
    cost: object            # roofline.cost.Cost
    dtype: str              # the op's data dtype (our key)
    signature: str          # shapes and dtype, e.g. "[8,64]x[64,64] fp32"
    note: str = ""          # what was assumed ("causal assumed")
    detail: dict = field(default_factory=dict)  # gemm m/k/n, attention sizes, wire bytes
    tensor_cores: bool = False                  # the rule's: computed on tensor cores
    rule: str = ""                              # the label of the rule that costed it (module.function)

    @property
    def compute_dtype(self) -> str:
        """The peak that applies: tensor-core ops their dtype, vector ops fp32 (the workload's rule)."""
        return self.dtype if self.tensor_cores and self.dtype in FLOATS else "fp32"


def dtype_of(type_name) -> str | None:
    return TYPES.get(str(type_name).strip().lower())


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


def signature(*shapes, dtype="") -> str:
    return "x".join("[" + ",".join(map(str, s)) + "]" for s in shapes) + (f" {dtype}" if dtype else "")


def _list(v) -> list:
    return v if isinstance(v, list) else []


class OpArgs:
    """An op's recorded inputs, and the rule that costs it (its category and tensor-core flag)."""

    def __init__(self, name: str, args: dict, rule, default_dtype: str = "bf16"):   # read_trace kept lists only
        self.name, self.raw, self.rule, self.default_dtype = name, args, rule, default_dtype
        self.base = name.rpartition("::")[2]
        self.dims = _list(args.get("Input Dims"))
        self.types = _list(args.get("Input type"))
        self.concrete = _list(args.get("Concrete Inputs"))

    def op(self, cost, dtype: str, sig: str, note: str = "", detail: dict | None = None,
           category: str | None = None) -> OpCost:
        """This op's ``OpCost`` in the rule's category (or ``category``, one the rule declared)."""
        cats = self.rule.categories
        if category is not None and category not in cats:
            raise UndeclaredCategory(f"trace rule {self.rule.label} returned category {category!r}; it declares "
                                     f"{', '.join(cats)}")
        return OpCost(self.name, category or cats[0], cost, dtype, sig, note, detail if detail is not None else {},
                      self.rule.tensor_cores, self.rule.label)

    def tensor(self, i):
        """(shape tuple, dtype) of input i, or None when it is not a tensor."""
        if i >= len(self.dims) or i >= len(self.types):
            return None
        d, t = self.dims[i], dtype_of(self.types[i])
        if t is None or not isinstance(d, list) or any(whole(x, 0) is None for x in d):
            return None
        return tuple(whole(x) for x in d), t

    def tensors(self):
        return [x for x in (self.tensor(i) for i in range(len(self.dims))) if x is not None]

    def value(self, i):
        return self.concrete[i] if i < len(self.concrete) else ""

    def flag(self, i):
        v = str(self.value(i)).strip().lower()
        return True if v == "true" else False if v == "false" else None

    def integer(self, i):
        try:
            return int(str(self.value(i)).strip())
        except ValueError:
            return None


@dataclass(frozen=True, eq=False)
class ReplayKernels:
    """The kernels of one CUDA-graph replay as a kernel rule sees them (no ops, no shapes): their names and streams
    in start order. One object per distinct sequence, shared by every replay of that graph."""

    names: tuple
    streams: tuple


class KernelArgs(OpArgs):
    """A GPU kernel as a kernel rule sees it (``registry``: a rule with ``kernels=`` and a cost function).

    ``kernel``: its name; the inputs its launching op recorded (``OpArgs``: empty when no op launched it, or the
    op recorded no shapes); ``meta``: the kernel event's own args (launch metadata where the launcher recorded
    any); ``step``: the engine step it ran in (``roofline.traces.engine_steps.EngineStep``, None outside every
    step), ``model``: ``--model``'s ``ModelConfig`` (None without); ``nth``: how many launches of this rule came
    before it in its step (attention: its layer), ``nth_in_op``: the same under its op (a fused MoE's first or
    second launch); ``tp``: the trace's world size (heads and widths per rank); ``replay``: the graph replay it
    ran in (``ReplayKernels``, None outside one) and ``position`` its index there; ``say(text)``: a sentence about
    the trace for its notes (why a rule could not cost what it matched)."""

    def __init__(self, kernel: str, op_name: str, args: dict, rule, default_dtype: str = "bf16", *, meta=None,
                 step=None, model=None, nth: int = 0, nth_in_op: int = 0, tp: int = 1, replay=None, position=None,
                 notes=None):
        super().__init__(op_name, args or {}, rule, default_dtype)
        self.kernel, self.low = kernel, kernel.lower()
        self.meta = meta if isinstance(meta, dict) else {}
        self.step, self.model, self.nth, self.nth_in_op, self.tp = step, model, nth, nth_in_op, max(int(tp or 1), 1)
        self.replay, self.position = replay, position
        self._notes = notes if notes is not None else []

    def say(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    @property
    def mix(self):
        return self.step.mix if self.step is not None else None

    @property
    def layer(self) -> int | None:
        """This launch's layer (its ``nth`` over the model's layers), None without a model."""
        return self.nth % self.model.n_layers if self.model is not None and self.model.n_layers else None

    def op(self, cost, dtype: str, sig: str, note: str = "", detail: dict | None = None,
           category: str | None = None) -> OpCost:
        """The kernel's ``OpCost``, named by the kernel (its first 80 characters), in the rule's category."""
        oc = super().op(cost, dtype, sig, note, detail, category)
        return OpCost(self.kernel[:80], oc.category, oc.cost, oc.dtype, oc.signature, oc.note, oc.detail,
                      oc.tensor_cores, oc.rule)
