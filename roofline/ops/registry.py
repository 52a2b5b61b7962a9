"""The op-kind registry: what costs an op of each kind (``roofline.op_spec.OpSpec.kind``).

An ``OpKind`` says, for one kind: the cost of one per-layer instance for one chunk of a step (``cost``), the
cost of a pre- or post-layer op (``edge_cost``), the weight bytes one instance reads per chunk
(``weight_bytes``), its default colour group, whether it runs on tensor cores at the activation dtype
(``tensor``; else its peak is fp32's), whether it is a linear layer (``linear``: the analysis's weight share
and working set), for routed experts the rows and distinct experts one chunk sends it (``experts``), and the
bytes each of its weights holds in memory (``resident``: ``roofline.capacity``).
Each callable takes ``(op, step)``: the ``OpSpec`` (its ``dims`` and ``weights``) and a ``StepContext``,
everything the step says about the chunk, so that a new kind needs nothing else.

``register(OpKind(...))`` adds a kind (the entries: ``roofline.ops``'s family modules, or a test);
``KINDS`` maps names to kinds; ``kind(name)`` looks one up and refuses an unknown one in one line. This
module imports none of its entries or consumers (``roofline.workload``, ``roofline.analysis``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..cost import Cost
from ..errors import RooflineError
from ..dtypes import bytes_per_element
from ..formulas import INT4_GROUP
from ..precision import Precision


@dataclass(frozen=True)
class Dtypes:
    """The step's precision: ``precision`` says each op's weight and activation formats (``roofline.precision``:
    ``weight_bytes``, ``compute``); ``weight`` is how it was asked ("bf16", "int4", "experts=nvfp4", or
    "checkpoint"), ``act`` the activation dtype, ``kv`` the KV cache's element as the attention formulas take it
    with ``kv_scales`` (a scale per token and KV head, as our kernels keep; per-tensor ones are not counted)."""

    weight: str = "bf16"
    act: str = "bf16"
    kv: str = "bf16"
    group_size: int = INT4_GROUP     # int4 weights: input rows per scale (formulas.weight_scale_bytes)
    zero_point: bool = False         # int4 weights: a zero point per group beside each scale
    expert_load: tuple = ()          # MoE: each expert's share of the routed slots (a histogram); (): uniform
    precision: Precision = Precision()
    kv_scales: bool = True


@dataclass(frozen=True)
class StepContext:
    """One chunk of a step as an op's cost sees it (``roofline.workload`` builds one per chunk).

    Per-layer ops: ``rows`` = batch x ``chunk`` rows through every linear, the chunk's ``chunk`` new tokens per
    sequence after ``cached`` (decode: chunk 1, cached = the context). Pre- and post-layer ops: one context
    for the whole step, ``rows`` = batch x every new token."""

    dtypes: Dtypes
    rows: int          # T: rows through a linear layer
    batch: int         # sequences
    chunk: int         # new tokens per sequence
    cached: int        # tokens per sequence already in the KV cache before the chunk
    decode: bool       # a decode step (one new token attending over the cache) rather than prefill
    tp: int = 1        # tensor-parallel ranks (the op's sizes are already one rank's)


def held_bytes(op, w, precision: Precision, act: str) -> float:
    """Bytes one weight tensor ``w`` of ``op`` occupies in memory: a linear's or the experts' ([E, in, out]) as
    stored in its format (``precision.weight_bytes``, scales included), the embedding table in its float, and
    norms, biases and vectors in the activation dtype."""
    if w.role == "linear":
        return precision.weight_bytes(op, *w.shape, act)
    if w.role == "experts":
        return w.shape[0] * precision.weight_bytes(op, *w.shape[1:], act)
    n = 1
    for s in w.shape:
        n *= s
    return n * bytes_per_element(precision.element_dtype(op, act) if w.role == "embedding" else act)


def no_weights(op, step: StepContext) -> float:
    """An op that reads no weights (or whose weights are not counted: norms, the embedding's gather)."""
    return 0.0


@dataclass(frozen=True)
class OpKind:
    name: str
    group: str                                  # colour group an op of this kind takes by default
    cost: Callable | None = None                # (op, step) -> Cost of one per-layer instance, one chunk
    edge_cost: Callable | None = None           # (op, step) -> Cost of a pre- or post-layer op
    weight_bytes: Callable = no_weights         # (op, step) -> bytes of weights one instance reads per chunk
    tensor: bool = False                        # tensor cores at the activation dtype (else the fp32 peak)
    linear: bool = False                        # a linear layer: its bytes are mostly its weight
    experts: Callable | None = None             # routed experts: (op, step) -> (routed rows, distinct experts)
    resident: Callable = held_bytes             # (op, weight, precision, act dtype) -> bytes it holds (capacity)
    per_sequence: bool = False                  # its cost depends on each sequence's new and cached tokens (attention),
                                                # not only on the rows: a mixed step costs it per prefill chunk and
                                                # per decode group (``roofline.workload.mixed``)

    def layer_cost(self, op, step: StepContext) -> Cost:
        """``cost``, or a one-line refusal when this kind has no per-layer cost."""
        if self.cost is None:
            raise RooflineError(f"op {op.name!r} of kind {self.name!r} has no per-layer cost")
        return self.cost(op, step)

    def pre_post_cost(self, op, step: StepContext) -> Cost:
        """``edge_cost``, or a one-line refusal when this kind cannot run before or after the layers."""
        if self.edge_cost is None:
            raise RooflineError(f"op {op.name!r} of kind {self.name!r} has no pre/post-layer cost")
        return self.edge_cost(op, step)


KINDS: dict[str, OpKind] = {}


def register(entry: OpKind) -> OpKind:
    """Add ``entry`` under its name; a name registered twice is refused."""
    if entry.name in KINDS:
        raise RooflineError(f"op kind {entry.name!r} is already registered.")
    KINDS[entry.name] = entry
    return entry


def kind(name: str) -> OpKind:
    """The registered kind ``name``, or a one-line RooflineError naming the registered ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise RooflineError(f"unknown op kind {name!r}: the registered kinds are {', '.join(sorted(KINDS))}.") \
            from None
