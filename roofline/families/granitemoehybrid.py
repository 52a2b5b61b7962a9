"""Granite-4.0-H (``model_type`` granitemoehybrid: transformers 5.24, configuration_granitemoehybrid.py /
modeling_granitemoehybrid.py): Granite's multipliers (``granite.granite_multipliers``) on a hybrid of Mamba-2 and
attention layers.

layer_types (or layers_block_type; the published configs' "mamba" / "attention" are transformers' legacy names
for linear_attention / full_attention) says each layer's mixer: Mamba-2 (``ModelConfig.mamba_*``: in_proj to z,
x, B, C, dt with mamba_proj_bias, the conv1d with mamba_conv_bias, the SSD scan by mamba_chunk_size, the gated
RMSNorm in mamba_n_groups groups, out_proj) or attention (RoPE only with position_embedding_type "rope", else
none). Every layer then runs its MLP: routed experts (num_local_experts of intermediate_size, a top-k then a
softmax over the k logits: ``topk_softmax``) beside the shared MLP (shared_intermediate_size, SwiGLU, ungated),
or with num_local_experts 0 the shared MLP alone (a dense SwiGLU of shared_intermediate_size: ``_dense_width``).
The checkpoint keeps the shared MLP's gate and up in one input_linear (its halves, gate first), the experts' in one
input_linear [E, 2I, H] and their down in one output_linear: loaded as those slices.
"""

from __future__ import annotations

from dataclasses import replace

from .granite import granite_multipliers
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, Tensors, register

# the checkpoints' layout (what save_pretrained writes): the experts' gate and up the halves of one input_linear
# [E, 2I, H], down one output_linear [E, H, I], the router's linear router.layer
GRANITE_H_TENSORS = Tensors(moe=dict(router="block_sparse_moe.router.layer.weight",
                                     gate="block_sparse_moe.input_linear.weight",
                                     up="block_sparse_moe.input_linear.weight",
                                     down="block_sparse_moe.output_linear.weight", shared="shared_mlp."),
                            halved_gate_up=True, experts_out_in=True)

# GraniteMoeHybridConfig (transformers 5.24): every field with its default
GRANITE_H_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(32000, 4096, 11008, 32, 32, None, 2048, 1e-6), "attention_bias": False, "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0, "num_local_experts": 8,
    "num_experts_per_tok": 2, "shared_intermediate_size": 1024, "position_embedding_type": None, "layer_types": None,
    "layers_block_type": None, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "time_step_limit": None},
    # time_step_limit (default (0, inf)) is the prefill scan's dt clamp (ModelConfig.mamba_dt_min / max); the published
    # configs' normalization_function ("rmsnorm") is read by no transformers code (every norm is its RMSNorm)
    irrelevant=("normalization_function",))

_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "full", "attention": "full"}


def _layer_types(r: HFReader) -> tuple:
    n = r.d["num_hidden_layers"]
    key = "layer_types" if r.d.get("layer_types") is not None else "layers_block_type"
    lt = r.d.get(key)
    if lt is None:                   # transformers' default: every layer Mamba-2
        return ("mamba",) * n
    if not isinstance(lt, list) or any(t not in _KINDS for t in lt):
        r.refuse(key, "is not modelled (supported: mamba / linear_attention, attention / full_attention per layer)")
    if len(lt) != n:
        r.refuse(key, f"has {len(lt)} entries for num_hidden_layers {n} (give one per layer)")
    return tuple(_KINDS[t] for t in lt)


def _dense_width(d: dict, where: str) -> dict:
    """Without experts the shared MLP is the whole MLP: its width (shared_intermediate_size, transformers'
    default 1024) is the dense width ModelConfig.intermediate says."""
    if d.get("num_local_experts", 8) == 0:
        return {**d, "intermediate_size": d.get("shared_intermediate_size") or 1024}
    return d


def read_granitemoehybrid(r: HFReader) -> None:
    llama_like(r)
    granite_multipliers(r)
    types = _layer_types(r)
    H = r.d["hidden_size"]
    heads, groups = r.count("mamba_n_heads", 128), r.count("mamba_n_groups", 1)
    inner = r.count("mamba_expand", 2) * H
    d_head = r.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head == "auto" else r.count("mamba_d_head", 0)
    if heads * d_head != inner or heads % groups:
        r.refuse("mamba_n_heads", f"x mamba_d_head {d_head} must be mamba_expand x hidden_size ({inner}), and "
                                  "mamba_n_groups must divide it")
    # transformers rotates only with "rope"; the published configs say "nope" for none
    rope = r.expect("position_embedding_type", (None, "nope", "rope"), None) == "rope"
    r.arch.update(
        layer_types=types, nope_layers=() if rope else tuple(i for i, t in enumerate(types) if t == "full"),
        mamba_heads=heads, mamba_head_dim=d_head, mamba_state=r.count("mamba_d_state", 256), mamba_groups=groups,
        mamba_conv=r.count("mamba_d_conv", 4), mamba_chunk=r.count("mamba_chunk_size", 256),
        mamba_conv_bias=r.flag("mamba_conv_bias", True), mamba_proj_bias=r.flag("mamba_proj_bias"), **r.dt_limit())
    if r.get("num_local_experts", 8):
        r.arch.update(n_experts=r.experts("num_local_experts"), n_active=r.count("num_experts_per_tok", 2),
                      moe_intermediate=r.size("intermediate_size"), router="topk_softmax", norm_topk=True,
                      shared_intermediate=r.count("shared_intermediate_size", 1024))


_RENAME = (("mlp.gate_proj.", "shared_mlp.input_linear."), ("mlp.up_proj.", "shared_mlp.input_linear."),
           ("mlp.down_proj.", "shared_mlp.output_linear."), ("shared_mlp.gate_proj.", "shared_mlp.input_linear."),
           ("shared_mlp.up_proj.", "shared_mlp.input_linear."), ("shared_mlp.down_proj.", "shared_mlp.output_linear."))


def _names(cfg, sh, ops: list) -> list:
    """The shared MLP's tensors: gate and up the halves of input_linear [2S, H] (gate first: transformers' chunk(2)),
    down output_linear (costed as separate linears)."""
    def renamed(w):
        for a, b in _RENAME:
            if w.hf.startswith(a):
                which = 0 if "gate_proj." in a else 1 if "up_proj." in a else None     # [H, S]: S of 2S rows
                part = {} if which is None else {"part": (which, (w.shape[1],) * 2)}
                return replace(w, hf=b + w.hf[len(a):], **part)
        return w
    return [replace(o, weights=tuple(renamed(w) for w in o.weights)) for o in ops]


register(Family("granitemoehybrid", read_granitemoehybrid, tensors=GRANITE_H_TENSORS, keys=GRANITE_H_KEYS,
                edit_ops=_names, normalize=_dense_width))
