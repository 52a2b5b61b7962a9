"""Llama-4's text model (``model_type`` llama4_text; the multimodal ``llama4`` wrapper is read as its
text_config): GQA whose RoPE layers attend over chunks of attention_chunk_size positions (chunked local
attention: a query sees its own chunk's keys, causally) with a weightless qk-norm after RoPE (use_qk_norm),
and every no_rope_layer_interval-th layer a NoPE layer over the whole context whose queries are scaled by a
factor of their position (attn_temperature_tuning, floor_scale, attn_scale). The MLP is routed experts
(num_local_experts of intermediate_size, top num_experts_per_tok of the router logits, weighted by their
sigmoid applied to each expert's INPUT) plus one shared expert of intermediate_size on every
interleave_moe_layer_step-th layer (or moe_layers), a dense MLP of intermediate_size_mlp on the others.
RoPE rotates interleaved pairs (transformers' complex form): q_proj and k_proj are loaded de-interleaved
(``rope_interleave``), which leaves every attention score as transformers computes it. Its checkpoint keeps
the MLP under feed_forward. and the experts as two 3-D tensors (gate and up as halves of gate_up_proj)."""

from __future__ import annotations

from ..config_fields import float_field, int_field
from ..errors import RooflineError
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, Tensors, register

LLAMA4_TENSORS = Tensors(mlp="feed_forward.", halved_gate_up=True, moe=dict(
    router="feed_forward.router.weight", gate="feed_forward.experts.gate_up_proj",
    up="feed_forward.experts.gate_up_proj", down="feed_forward.experts.down_proj",
    shared="feed_forward.shared_expert."))

# Llama4TextConfig (transformers 5.24, configuration_llama4.py); RoPE base 500,000 (its default_theta)
LLAMA4_TEXT_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(202048, 5120, 8192, 48, 40, 8, 131072, 1e-5, head_dim=128, theta=500000.0),
    "intermediate_size_mlp": 16384, "num_experts_per_tok": 1, "num_local_experts": 16, "moe_layers": None,
    "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layers": None, "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192, "layer_types": None, "attn_temperature_tuning": True, "floor_scale": 8192,
    "attn_scale": 0.1, "attention_bias": False},
    irrelevant=("for_llm_compressor",))   # a flag of the quantization tooling some published configs carry
# Llama4Config's own keys beside text_config and vision_config (the vision tower is not costed)
LLAMA4_VISION = ("boi_token_index", "eoi_token_index", "image_token_index")


def _layer_list(r: HFReader, key: str, allowed, what: str) -> list | None:
    v = r.d.get(key)
    if v is None or v == []:             # transformers: empty or absent means derived (no_rope_layers: ``or``)
        return None
    if not isinstance(v, list) or any(isinstance(x, bool) or x not in allowed for x in v):
        r.refuse(key, f"is not modelled (give {what})")
    return v


def _rotates(r: HFReader, n: int) -> list:
    """Per layer, whether it applies RoPE: no_rope_layers (1 RoPE, 0 NoPE; at least one per layer, as
    transformers indexes it), else every no_rope_layer_interval-th layer is NoPE."""
    flags = _layer_list(r, "no_rope_layers", (0, 1), "1 (RoPE) or 0 (NoPE) per layer")
    if flags is None:
        every = r.count("no_rope_layer_interval", 4)
        return [(i + 1) % every != 0 for i in range(n)]
    if len(flags) < n:
        raise RooflineError(f"{r.where}: no_rope_layers has {len(flags)} entries for num_hidden_layers {n}: give "
                            "one per layer.")
    return [bool(f) for f in flags[:n]]


def _moe_layers(r: HFReader, n: int) -> tuple:
    """The layers with routed experts: moe_layers, else every interleave_moe_layer_step-th (from step - 1)."""
    given = r.d.get("moe_layers")
    if given is not None:
        if not isinstance(given, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in given):
            r.refuse("moe_layers", "must list layer indices")
        return tuple(i for i in range(n) if i in given)
    step = r.count("interleave_moe_layer_step", 1)
    return tuple(range(step - 1, n, step))


def _chunked(r: HFReader, rotates: list) -> tuple:
    """(attention_chunk, layer_types): layer_types as given (chunked_attention / full_attention), else the RoPE
    layers chunked when attention_chunk_size is set (transformers' default)."""
    n = len(rotates)
    size = r.d.get("attention_chunk_size")
    chunk = 0 if size is None else int_field(r.where, "attention_chunk_size", size, 1,
                                             " (positions per chunk of local attention)")
    given = r.d.get("layer_types")
    if given is None:
        types = ["chunked" if rope and chunk else "full" for rope in rotates]
    else:
        kinds = {"chunked_attention": "chunked", "full_attention": "full"}
        if not isinstance(given, list) or any(t not in kinds for t in given):
            r.refuse("layer_types", "is not modelled (supported: chunked_attention, full_attention per layer)")
        if len(given) != n:
            raise RooflineError(f"{r.where}: layer_types has {len(given)} entries for num_hidden_layers {n}: give "
                                "one per layer.")
        types = [kinds[t] for t in given]
        if "chunked" in types and not chunk:
            raise RooflineError(f"{r.where}: layer_types has chunked_attention layers but attention_chunk_size is "
                                "null: give the chunk size.")
    if "chunked" not in types:
        return 0, ()
    return chunk, (() if all(t == "chunked" for t in types) else tuple(types))


def _temperature(r: HFReader, rotates: list) -> tuple:
    """(floor_scale, attn_scale) when attn_temperature_tuning is on (transformers tests its truth: published
    configs say 4) and there are NoPE layers, else ()."""
    on = r.get("attn_temperature_tuning", True)
    if not isinstance(on, (bool, int, float)):
        r.refuse("attn_temperature_tuning", "is not modelled (true or false)")
    if not on or all(rotates):
        return ()
    floor = r.d.get("floor_scale", 8192)
    if isinstance(floor, float) and floor.is_integer():
        floor = int(floor)
    return (int_field(r.where, "floor_scale", floor, 1, " (tokens per step of the attention temperature)"),
            float_field(r.where, "attn_scale", r.get("attn_scale", 0.1)))


def read_llama4_text(r: HFReader) -> None:
    llama_like(r)
    n = r.d["num_hidden_layers"]
    rotates = _rotates(r, n)
    moe = _moe_layers(r, n)
    chunk, types = _chunked(r, rotates)
    bias = r.flag("attention_bias")
    inter = r.size("intermediate_size")
    r.arch.update(qkv_bias=bias, o_bias=bias, nope_layers=tuple(i for i, rope in enumerate(rotates) if not rope),
                  attention_chunk=chunk, layer_types=types, qk_l2_norm=r.flag("use_qk_norm", True),
                  attn_temperature=_temperature(r, rotates), rope_interleave=True)
    if moe:
        dense = tuple(i for i in range(n) if i not in moe)
        r.arch.update(n_experts=r.experts("num_local_experts"), n_active=r.count("num_experts_per_tok", 1),
                      moe_intermediate=inter, router="sigmoid_topk", norm_topk=False, routed_input=True,
                      shared_intermediate=inter, dense_layers=dense)
        if dense:         # the dense layers' width (ModelConfig.intermediate: roofline.layer's dense MLP)
            r.arch["intermediate"] = r.size("intermediate_size_mlp")
    else:
        r.arch["intermediate"] = r.size("intermediate_size_mlp")


register(Family("llama4_text", read_llama4_text, tensors=LLAMA4_TENSORS, keys=LLAMA4_TEXT_KEYS, wrappers={
    "llama4": {"what": "Llama-4 Scout / Maverick, Llama4ForConditionalGeneration", "tie_word_embeddings": False,
               "vision": LLAMA4_VISION}}))
