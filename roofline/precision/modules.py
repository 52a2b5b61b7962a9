"""Each module's precision: the classes of weight-reading ops, and a ``Precision`` saying each one's formats.

Every op that reads a weight belongs to one module class (``roofline.op_spec.OpSpec.module``, set where the op is
built from what it is): ``experts`` (the routed experts), ``shared_experts``, ``mlp`` (a dense MLP),
``attention`` (its q/k/v/o projections), ``mla`` (latent attention's projections), ``router`` (an MoE gate, and
Qwen2-MoE's shared-expert gate), ``lm_head``, ``embedding``; and ``norm`` (RMSNorm weights: always in the
activation dtype, never quantized).

A ``Precision`` is, per module class, the weight's ``Format`` and the activations' (``roofline.precision.formats``;
absent: the activation dtype, a float GEMM), a few ops whose checkpoint stores them otherwise than their class
(what an ignore list leaves out of a module that is otherwise quantized), and the KV cache's format (None: the
activation dtype). It comes from the checkpoint (``roofline.precision.checkpoint``) and from the flags
(``with_flags``: ``--weight-dtype int8`` quantizes every class a plain flag always has -- every projection,
MLP, expert and lm_head, with the router and embeddings kept in the activation dtype --, ``--weight-dtype
experts=nvfp4,attention=fp8`` one class each; ``--kv-dtype``). Flags override the checkpoint. Costs ask it the
bytes of an op's K x N weight (``weight_bytes``, counted by ``formats.weight_bytes``) and the rate its GEMM runs
at (``compute``, by ``formats.gemm_compute``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RooflineError
from .formats import FLOAT_BYTES, PLAIN, Format, gemm_compute, kv_format, lookup, weight_bytes, weight_format

MODULES = ("experts", "shared_experts", "mlp", "attention", "mla", "router", "lm_head", "embedding")
NORM = "norm"                                   # norms' weights: the activation dtype, never a format of their own
# The classes a plain --weight-dtype sets (the router's gate and the embedding table stay in the activation dtype).
PLAIN_FLAG = ("experts", "shared_experts", "mlp", "attention", "mla", "lm_head")
WEIGHT_ROLES = ("linear", "experts")            # WeightSpec roles a module's format applies to (biases: act dtype)


def module_pairs(d: dict) -> tuple:
    return tuple((k, d[k]) for k in MODULES + (NORM,) if k in d)


@dataclass(frozen=True)
class Precision:
    """Per module class (module docstring): ``weights`` and ``acts`` as (module, Format) pairs, ``ops`` as
    (op name, its class, Format or None) for the ops stored unlike their class (None: the activation dtype), ``kv`` the
    KV cache's Format (None: the activation dtype), and ``source``: where it was read ("quantization_config",
    "hf_quant_config.json", "--weight-dtype"; "" for a float model)."""

    weights: tuple = ()
    acts: tuple = ()
    ops: tuple = ()
    kv: Format | None = None
    source: str = ""

    # ------------------------------------------------------------------ what an op is stored and run in
    def weight(self, op) -> Format | None:
        """The format of ``op``'s weights (None: the activation dtype)."""
        for name, _, f in self.ops:
            if name == op.name:
                return f
        return dict(self.weights).get(op.module)

    def act(self, op) -> Format | None:
        """The format ``op``'s input activations are quantized to (None: the activation dtype)."""
        if self.weight(op) is None:
            return None
        return dict(self.acts).get(op.module)

    def weight_format(self, op, act_dtype: str) -> Format:
        """``weight``, with the activation dtype's plain format for None."""
        return self.weight(op) or lookup(act_dtype, "weight")

    def weight_bytes(self, op, K: int, N: int, act_dtype: str) -> float:
        """Bytes of one K x N weight of ``op`` as stored, scales included (``formats.weight_bytes``), plus a
        static per-tensor activation scale (one fp32 per weight) when its activations carry one, or their
        second-level tensor scale (NVFP4: ModelOpt's ``input_scale``)."""
        b = weight_bytes(self.weight_format(op, act_dtype), K, N, act_dtype)
        a = self.act(op)
        if a is not None and a.scales.k == 0 and a.scales.n == 0 and not a.scales.none:
            b += FLOAT_BYTES[a.scales.dtype]
        elif a is not None and a.scales.tensor:        # NVFP4 activations' global scale (ModelOpt's input_scale)
            b += FLOAT_BYTES[a.scales.tensor]
        return b

    def quantized(self, op) -> bool:
        w = self.weight(op)
        return w is not None and w.quantized

    def element_dtype(self, op, act_dtype: str) -> str:
        """The plain float ``op``'s weights are stored in when not quantized (the activation dtype if none)."""
        w = self.weight(op)
        return w.name if w is not None and w.element in PLAIN else act_dtype

    def compute(self, op, act_dtype: str, has_peak=lambda dtype: True) -> str:
        """The dtype whose peak a GEMM of ``op`` is judged against (``formats.gemm_compute``); without a device
        every low-precision peak is assumed, and the roof falls back to the activation dtype's where a device
        has none (``roofline.bounds``)."""
        w = self.weight(op)
        if w is None:
            return act_dtype
        return gemm_compute(w, self.act(op) or lookup(act_dtype, "act"), has_peak)

    # ------------------------------------------------------------------ the KV cache
    def kv_dtype(self, act_dtype: str) -> str:
        """The KV cache's element as the attention formulas take it: a plain float, "fp8" or "int8"."""
        f = self.kv
        if f is None:
            return act_dtype
        if f.element in PLAIN:
            return f.element
        return "int8" if f.element == "int8" else "fp8"

    @property
    def kv_scales(self) -> bool:
        """Whether the cache keeps a scale per token and KV head (our kernels'); per-tensor ones are a few bytes."""
        return self.kv is not None and self.kv.scales.n == 1

    # ------------------------------------------------------------------ flags
    def with_flags(self, weight=None, kv=None, *, group_size=None, zero_point=False) -> "Precision":
        """This precision with the flags over it: ``weight`` a format name (every class of ``PLAIN_FLAG``) or
        ``module=format,...`` (``parse_weight_flag``); ``kv`` a KV format name. A class a flag sets drops its
        activation format (weight-only: its GEMM runs in the activation dtype) and the exceptions of its ops."""
        p = self
        if weight not in (None, ""):
            chosen = parse_weight_flag(weight, group_size, zero_point)
            w = {**dict(p.weights), **chosen}
            acts = {m: f for m, f in p.acts if m not in chosen}
            ops = tuple(o for o in p.ops if o[1] not in chosen)
            p = Precision(module_pairs(w), module_pairs(acts), ops, p.kv, _flag_source(p.source, "--weight-dtype"))
        if kv not in (None, ""):
            p = Precision(p.weights, p.acts, p.ops, kv_format(kv), _flag_source(p.source, "--kv-dtype"))
        return p

    # ------------------------------------------------------------------ saying it
    def describe(self, modules: tuple, act_dtype: str) -> str:
        """One line: each of ``modules`` (the classes a model has, in order) with its format, e.g. "weights from
        quantization_config: experts mxfp4 (blocks of 32, e8m0 scales), attention bf16, lm_head bf16"."""
        w, a = dict(self.weights), dict(self.acts)
        parts = []
        for m in modules:
            f = w.get(m)
            s = f"{m} {f.describe() if f else act_dtype}"
            if f is not None and m in a:
                s += f" with {a[m].name} activations"
            odd = [f"{n} {g.describe() if g else act_dtype}" for n, om, g in self.ops if om == m]
            if odd:
                s += f" (but {', '.join(odd)})"
            parts.append(s)
        return f"weights from {self.source or 'the model (unquantized)'}: {', '.join(parts)}"

    def describe_kv(self, act_dtype: str) -> str:
        return f"KV cache {self.kv.describe() if self.kv else act_dtype}"

    def to_dict(self, act_dtype: str) -> dict:
        """What ``--json`` carries: each class's weight and activation format, the exceptions, the KV cache."""
        w, a = dict(self.weights), dict(self.acts)
        return {"source": self.source,
                "modules": {m: {"weight": w[m].name if m in w else act_dtype,
                                "weight_label": w[m].describe() if m in w else act_dtype,
                                "act": a[m].name if m in a else act_dtype} for m in MODULES if m in w or m in a},
                "ops": {n: (f.name if f else act_dtype) for n, _, f in self.ops},
                "kv": self.kv.name if self.kv else act_dtype, "kv_label": self.describe_kv(act_dtype)}


def _flag_source(source: str, flag: str) -> str:
    return f"{source}, {flag}" if source and flag not in source else (source or flag)


def plain(weight: str = "bf16", *, group_size=None, zero_point=False) -> Precision:
    """A plain ``--weight-dtype`` as today's costs read it: every class of ``PLAIN_FLAG`` in ``weight``, the
    router's gate and the embedding table in the activation dtype."""
    return Precision().with_flags(weight, group_size=group_size, zero_point=zero_point)


def element_bytes(label: str, op, act_dtype: str) -> float:
    """Bytes of one element of ``op``'s weight (an ``OpSpec``; None: the label's one format) under a point key's
    weight label (the ``--weight-dtype`` syntax: a format, ``module=format`` pairs, or the activation dtype), scales
    left out: what a working-set estimate multiplies a weight's elements by."""
    if op is None:
        return weight_format(label if "=" not in str(label) else act_dtype).bits / 8
    return plain(label).weight_format(op, act_dtype).bits / 8


def parse_weight_flag(value, group_size=None, zero_point=False) -> dict:
    """``--weight-dtype``: a format name for every class of ``PLAIN_FLAG`` ("int8"), or ``module=format`` pairs
    separated by commas ("experts=nvfp4,attention=fp8"); unknown classes or formats in one line."""
    text = str(value).strip()
    if "=" not in text:
        f = weight_format(text, group_size, zero_point)
        return {m: f for m in PLAIN_FLAG}
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m, sep, name = (s.strip().lower() for s in part.partition("="))
        if not sep or not name:
            raise RooflineError(f"--weight-dtype {value!r}: {part!r} is not module=format (e.g. "
                                "experts=nvfp4,attention=fp8).")
        if m not in MODULES:
            raise RooflineError(f"--weight-dtype {value!r}: unknown module class {m!r}: choose one of "
                                f"{', '.join(MODULES)}.")
        f = weight_format(name, group_size, zero_point)
        if m == "embedding" and f.quantized:
            raise RooflineError(f"--weight-dtype {value!r}: a quantized embedding table ({f.name}) is not "
                                f"modelled: give it a float ({', '.join(PLAIN)}).")
        out[m] = f
    return out
