"""What one op of a model's step is, as data: ``OpSpec`` (its kind, colour group, count, sizes, the layers that run
it, its module class) and the ``WeightSpec`` of each weight tensor it reads (shape, Hugging Face name, ``--tp`` shard
rule). ``roofline.layer.model_ops`` lists a model's; a family's ``edit_ops`` (``roofline.families``) may add or
rename some. Nothing here costs or runs an op: ``roofline.ops`` (by ``OpSpec.kind``) and ``kernels`` do."""

from __future__ import annotations

from dataclasses import dataclass, field

from .ops import kind


@dataclass(frozen=True)
class WeightSpec:
    """One weight tensor an op reads.

    ``shape`` is this rank's, in our layout: linear [in, out], bias [out], norm [width], embedding [V, H].
    ``hf`` names the Hugging Face tensor (per-layer names are relative to ``model.layers.{i}.``);
    ``part`` = (index, sizes) when it is one slice, along the output dimension, of a fused HF tensor
    (Phi-3's qkv_proj and gate_up_proj). ``offset``: the file stores w and the model multiplies by 1 + w
    (Gemma's norms). ``shard``: how --tp splits it (``kernels.tp``): "q_cols", "kv_cols", "i_cols" (column
    parallel, by query heads, KV heads or intermediate features), "q_rows", "i_rows" (row parallel),
    "rank0" (a row-parallel linear's bias: added once, by rank 0), "vocab" (rows of the padded vocabulary),
    "replicated"; MoE: "e_cols" / "e_rows" (every expert's intermediate columns / rows), "e_whole" (whole
    experts, expert parallelism); MLA: "mla_q_cols", "mla_kv_cols" (whole heads of nope + rope / nope + v
    columns), "mla_o_rows" (heads of v rows); "q_heads" (one value per query head: sinks).
    """

    key: str
    shape: tuple
    role: str                    # "linear" | "bias" | "norm" | "embedding" | "experts" | "expert_bias" | "vector"
    hf: str
    shard: str = "replicated"
    part: tuple = ()
    offset: bool = False
    rope: tuple = ()             # (head width, rope offset, rope dims): de-interleave the rope rows (DeepSeek, ERNIE)
    out_in: bool = False         # a 3-D [E, in, out] tensor the file may hold [E, out, in] (read that shape first)


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str
    part: str                    # "pre" | "layer" | "post"
    group: str                   # colour group: embed, norm, attention, mlp, residual, head
    count: int                   # instances per step
    weights: tuple = ()
    dims: dict = field(default_factory=dict, compare=False, hash=False)
    layers: tuple = ()           # the layer indices that run it (per-layer ops)
    module: str = ""             # its module class (roofline.precision.modules.MODULES, or "norm"): what it reads

    @property
    def tensor(self) -> bool:
        return kind(self.kind).tensor   # runs on tensor cores at the activation dtype (roofline.ops)

    @property
    def per_layer(self) -> bool:
        return self.part == "layer"
