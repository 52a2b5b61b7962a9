"""The model-family registry: one ``Family`` per Hugging Face ``model_type``.

A family says everything that is particular to one ``model_type``: its config.json reader (``read``: fill
the architecture fields of ``roofline.models.ModelConfig`` from the config, refuse what is not modelled),
every config key it knows with transformers' default (``keys``: ``reader.Keys``; any other key is refused),
the other model_types that are it exactly (``aliases``: Kimi-K2's ``kimi_k2`` is ``deepseek_v3``), the
multimodal wrappers whose ``text_config`` it reads (``wrappers``: ``gemma3`` around ``gemma3_text``), its own head width
or RoPE reading where the shared one does not fit (``head_dim``, ``rope``), where its checkpoint keeps the
tensors that differ from the Llama layout (``tensors``: read by ``roofline.layer``), and its presets with
their sources (``presets``).

A ``model_type`` whose every key is known but whose features are not modelled yet is a ``Refused`` entry
(``register_refused``: DeepSeek-V4): ``hf_config`` checks its keys as a family's, then refuses the first feature
the config turns on in that feature's own line, naming the others.

Entries live one file per family beside this module and call ``register``; ``roofline.families`` (the
package) imports them. This module imports none of them, nor any consumer: ``roofline.families.hf_config``
(the config.json reader), ``roofline.models`` (``load_model``, ``PRESETS``) and ``roofline.layer`` look
families up here and loop over them; none of them names a ``model_type``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..config_fields import show_value
from ..errors import RooflineError
from .reader import Keys

# Mixtures of experts and hybrids that are not modelled: refused as such (not as unknown types).
UNMODELLED = ("deepseek_v2", "dbrx", "jamba", "olmoe", "phimoe", "granitemoe")

# Served families (late 2026) refused for a named feature: the feature they lack here (their text model's type
# and, for a multimodal wrapper, the wrapper's own).
LACKING = {
    "gemma4": "per-layer input embeddings, KV shared across layers and proportional partial RoPE (Gemma-4)",
    "gemma3n": "per-layer input embeddings, KV shared across layers and AltUp (Gemma-3n)",
}
LACKING.update({f"{k}_text": v for k, v in tuple(LACKING.items())})


@dataclass(frozen=True)
class Feature:
    """One feature of a family refused feature by feature: its name, whether a config (its family's defaults
    filled in) turns it on, and its refusal (``refusal(d)``: the key, what it does, what costing it needs)."""

    name: str
    on: Callable                       # (config dict) -> bool
    refusal: Callable                  # (config dict) -> str: one line, without the where / model_type prefix


@dataclass(frozen=True)
class Refused:
    """A ``model_type`` whose config is read (every key known, ``keys``: transformers' defaults) but refused, each
    feature not modelled yet by its own line (``features``, in the order they are said)."""

    model_type: str
    keys: Keys
    features: tuple                    # Feature entries

    def refusals(self, d: dict) -> list:
        """The one-line refusal of every feature ``d`` turns on, in order."""
        return [f.refusal(d) for f in self.features if f.on(d)]


_REFUSED: dict[str, Refused] = {}


def register_refused(entry: Refused) -> Refused:
    """Add a family refused feature by feature (once; never a registered family's model_type)."""
    if entry.model_type in _REFUSED or any(entry.model_type in _names(f) for f in _FAMILIES.values()):
        raise ValueError(f"model_type {entry.model_type!r} is registered twice")
    _REFUSED[entry.model_type] = entry
    return entry


def refused(model_type) -> Refused | None:
    """The ``Refused`` entry of ``model_type``, or None."""
    return _REFUSED.get(model_type) if isinstance(model_type, str) else None


def refused_families() -> tuple:
    return tuple(_REFUSED.values())


@dataclass(frozen=True)
class Tensors:
    """Where a family's Hugging Face checkpoint keeps the tensors that differ from the Llama layout
    (``roofline.layer`` names the rest: ``model.layers.{i}.self_attn.q_proj.weight``, ...)."""

    fused_qkv: bool = False            # q/k/v_proj are slices of one self_attn.qkv_proj (Phi-3)
    fused_gate_up: bool = False        # gate/up_proj are the halves of one mlp.gate_up_proj (Phi-3)
    # The MoE tensors' per-layer names ("{e}": the expert): router, router_bias, correction (DeepSeek's
    # e_score_correction_bias), the experts' gate / up / down (and *_bias), shared (the shared expert's
    # prefix), shared_gate. A name without "{e}" is one 3-D [E, in, out] tensor of every expert.
    moe: dict = field(default_factory=dict)
    interleaved_gate_up: bool = False  # the experts' gate = [..., 0::2], up = [..., 1::2] of one tensor (GPT-OSS)
    # Gated DeltaNet's input projections (linear_attn.<name>.weight): (name, the outputs it holds, in order, of
    # q, k, v, z, b, a); Qwen3-Next fuses them in two, Qwen3.5 keeps four
    deltanet: tuple = (("in_proj_qkvz", "qkvz"), ("in_proj_ba", "ba"))
    halved_gate_up: bool = False       # the experts' gate = [..., :I], up = [..., I:] of one tensor (Qwen3-VL-MoE, Llama-4)
    # its 3-D experts may also be stored [E, out, in] (transformers 5's own layout, what its save_pretrained writes):
    # read as transformers reads them, that shape first (Qwen3-VL-MoE)
    experts_out_in: bool = False
    mlp: str = "mlp."                  # a dense layer's MLP prefix: mlp.gate_proj.weight, ... (Llama-4: feed_forward.)


LLAMA_TENSORS = Tensors()


@dataclass(frozen=True)
class Preset:
    """A published model's numbers: ``ModelConfig(name, *sizes, arch=<its family's model_type>, **fields)``."""

    name: str
    sizes: tuple        # hidden, intermediate, n_layers, n_heads, n_kv_heads, vocab, max_context
    fields: dict        # the other ModelConfig fields that differ from their defaults
    source: str         # the config.json the numbers come from, and what in it matters


def preset(name: str, *sizes, source: str, **fields) -> Preset:
    """A ``Preset`` written like the ``ModelConfig`` it becomes, with its source."""
    if len(sizes) != 7:
        raise ValueError(f"preset {name!r}: give the 7 sizes (hidden ... max_context), not {len(sizes)}")
    return Preset(name, tuple(sizes), fields, source)


@dataclass(frozen=True)
class Family:
    model_type: str
    read: Callable                     # (roofline.families.reader.HFReader) -> None: fill r.arch, refuse
    tensors: Tensors = LLAMA_TENSORS
    presets: tuple = ()                # Preset entries, in the order they are listed
    keys: Keys = Keys()                # every config key it knows, with transformers' defaults
    aliases: dict = field(default_factory=dict)    # model_type -> why it is this family exactly (its source)
    # a multimodal model_type whose text_config defaults to this family -> {"what": the wrapper, "tie_word_embeddings":
    # its class's default, "vision": its own keys (the vision tower's and the projector's: not costed)}
    wrappers: dict = field(default_factory=dict)
    head_dim: Callable | None = None   # (HFReader) -> int: a query/key head's width when head_dim is not it
    rope: Callable | None = None       # (HFReader) -> float: RoPE base (and arch fields) when not the shared one
    says_quantization: bool = False    # its reader words the quantization_config note itself
    # (cfg, shard, ops: list of OpSpec) -> list: the family's own ops placed where they run (a kind the shared
    # layer does not build: roofline.ops registers its cost, kernels.runner_registry its runner); None: as built
    edit_ops: Callable | None = None
    # (config dict, where) -> the dict with keys derived before the sizes are read (Nemotron-H's layer count from
    # its block pattern), or None
    normalize: Callable | None = None


_FAMILIES: dict[str, Family] = {}


def _names(f: Family) -> tuple:
    return (f.model_type, *f.aliases, *f.wrappers)


def register(fam: Family) -> Family:
    """Add ``fam`` under its model_type (once); its presets' names, aliases and wrappers must be new."""
    taken_types = {n for f in _FAMILIES.values() for n in _names(f)}
    for n in _names(fam):
        if n in taken_types or _names(fam).count(n) > 1 or n in _REFUSED:
            raise ValueError(f"model_type {n!r} is registered twice")
    taken = {p.name for f in _FAMILIES.values() for p in f.presets}
    for p in fam.presets:
        if p.name in taken:
            raise ValueError(f"preset {p.name!r} of {fam.model_type!r} is already a preset")
    _FAMILIES[fam.model_type] = fam
    return fam


def alias(model_type) -> tuple:
    """(the family ``model_type`` is an exact alias of, why), or None when it is no alias."""
    for f in _FAMILIES.values():
        if isinstance(model_type, str) and model_type in f.aliases:
            return f, f.aliases[model_type]
    return None


def wrapper(model_type) -> tuple:
    """(the text family a multimodal ``model_type``'s text_config defaults to, what the wrapper is), or None."""
    for f in _FAMILIES.values():
        if isinstance(model_type, str) and model_type in f.wrappers:
            return f, f.wrappers[model_type]
    return None


def families() -> tuple:
    """Every registered family, in the order they registered."""
    return tuple(_FAMILIES.values())


def model_types() -> tuple:
    return tuple(_FAMILIES)


def family(model_type, where: str = "model config") -> Family:
    """The family of ``model_type``, or a one-line RooflineError listing the supported types."""
    hashable = isinstance(model_type, (str, int, float, bool, type(None)))
    if hashable and model_type in _FAMILIES:
        return _FAMILIES[model_type]
    if alias(model_type) is not None:
        return alias(model_type)[0]
    supported = ", ".join(_FAMILIES)
    if hashable and model_type in _REFUSED:
        names = ", ".join(f.name for f in _REFUSED[model_type].features)
        raise RooflineError(f"{where}: model_type {model_type!r} needs {names}, which are not modelled yet: "
                            f"supported are {supported}.")
    if hashable and model_type in LACKING:
        raise RooflineError(f"{where}: model_type {model_type!r} needs {LACKING[model_type]}, which is not modelled "
                            f"yet: supported are {supported}.")
    if model_type in UNMODELLED:
        raise RooflineError(f"{where}: model_type {model_type!r} is a mixture of experts (or a hybrid), which is "
                            f"not modelled yet: supported are {supported}.")
    raise RooflineError(f"{where}: model_type {show_value(model_type)} is not supported: supported are "
                        f"{supported}.")


def tensors(model_type: str) -> Tensors:
    """Where ``model_type``'s checkpoint keeps its tensors (the Llama layout for a type not registered)."""
    fam = _FAMILIES.get(model_type) if isinstance(model_type, str) else None
    return fam.tensors if fam is not None else LLAMA_TENSORS


def edit_ops(model_type: str):
    """``model_type``'s own edit of its op list (``Family.edit_ops``), or None."""
    fam = _FAMILIES.get(model_type) if isinstance(model_type, str) else None
    return fam.edit_ops if fam is not None else None


def presets() -> tuple:
    """(model_type, Preset) of every registered family's presets, family by family."""
    return tuple((f.model_type, p) for f in _FAMILIES.values() for p in f.presets)
