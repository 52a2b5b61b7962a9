"""Llama and Mistral (``model_type`` llama, mistral): the reference layout every other family starts from.

``llama_like`` is what every Llama-style reader shares (SwiGLU, plain RoPE on every head dimension, causal
attention); the other families' readers call it first and add their own fields.
"""

from __future__ import annotations

from .reader import HFReader, Keys
from .registry import Family, preset, register

# Every key a Llama-style reader knows (transformers 5.24's LlamaConfig defaults, configuration_llama.py);
# the sizes' defaults are each family's own (its config class).
LLAMA_LIKE_KEYS = Keys(
    {"hidden_act": "silu", "pretraining_tp": 1, "partial_rotary_factor": None, "use_bidirectional_attention": None})


def sizes(vocab, hidden, inter, layers, heads, kv_heads, max_pos, eps, tie=False, head_dim=None, theta=10000.0) -> dict:
    """A family's size keys with its config class's defaults (None: derived from the others)."""
    return {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": max_pos,
            "rms_norm_eps": eps, "tie_word_embeddings": tie, "head_dim": head_dim, "rope_theta": theta}


LLAMA_KEYS = LLAMA_LIKE_KEYS + Keys({**sizes(32000, 4096, 11008, 32, 32, None, 2048, 1e-6),
                                     "attention_bias": False, "mlp_bias": False}, refused={
    "attention_chunk_size": ("chunked local attention (Llama-4)", (None,)),
    "no_rope_layers": ("NoPE layers on a llama (Llama-4's; SmolLM3's are read under smollm3)", (None,))})
# MistralConfig (configuration_mistral.py): 8 KV heads and a 4,096 window unless the config says otherwise
MISTRAL_KEYS = LLAMA_LIKE_KEYS + Keys({**sizes(32000, 4096, 14336, 32, 32, 8, 131072, 1e-6), "sliding_window": 4096,
                                       "layer_types": None})


def llama_like(r: HFReader, partial_rotary: bool = False) -> None:
    """``partial_rotary``: the family reads partial_rotary_factor itself (``rotary_dim``), else it is refused."""
    r.arch["activation"] = r.activation("hidden_act")
    if r.get("pretraining_tp", 1) not in (1,):
        r.refuse("pretraining_tp", "is not modelled (only 1: the split-weight matmul of Llama-2 pretraining)")
    if not partial_rotary and r.get("partial_rotary_factor", 1.0) != 1.0:
        r.refuse("partial_rotary_factor", "is not modelled (RoPE rotates every head dimension)")
    params = r.d.get("rope_parameters")
    if not partial_rotary and isinstance(params, dict) and params.get("partial_rotary_factor", 1.0) != 1.0:
        r.refuse("rope_parameters", "says a partial_rotary_factor, which is not modelled here (RoPE rotates every "
                                    "head dimension)")
    if r.flag("use_bidirectional_attention"):
        r.refuse("use_bidirectional_attention", "is not modelled (attention is causal)")


def read_llama(r: HFReader) -> None:
    llama_like(r)
    bias = r.flag("attention_bias")
    r.arch.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.flag("mlp_bias"))


def read_mistral(r: HFReader) -> None:
    llama_like(r)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()


register(Family("llama", read_llama, keys=LLAMA_KEYS, presets=(
    preset("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, source="meta-llama/Llama-2-7b-hf: MHA"),
    preset("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, source="meta-llama/Llama-2-13b-hf: MHA"),
    preset("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, source="meta-llama/Llama-2-70b-hf: GQA 8:1"),
    preset("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, rope_theta=500000.0,
           source="meta-llama/Meta-Llama-3-8B: GQA 4:1, big vocab"),
    preset("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, rope_theta=500000.0,
           source="meta-llama/Meta-Llama-3-70B: GQA 8:1, big vocab"),
)))

register(Family("mistral", read_mistral, keys=MISTRAL_KEYS, wrappers={
    "mistral3": {"what": "Mistral-Small-3.x, Mistral3ForConditionalGeneration", "tie_word_embeddings": True,
                 "vision": ("image_token_index", "multimodal_projector_bias", "projector_hidden_act",
                            "spatial_merge_size", "vision_feature_layer")}},
    presets=(
    preset("mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, sliding_window=4096,
           source="mistralai/Mistral-7B-v0.1: every layer attends over a 4,096-token window"),
)))
