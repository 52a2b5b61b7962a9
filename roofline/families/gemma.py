"""Gemma, Gemma-2, Gemma-3 text (``model_type`` gemma, gemma2, gemma3_text): GeGLU, (1 + w) norms and a
sqrt(hidden) embedding scale; Gemma-2 adds sandwich norms, softcaps and alternating windows; Gemma-3 adds
qk-norm and its own RoPE base for the sliding layers. Embeddings are tied and rms_norm_eps is 1e-6 unless
the config says otherwise (transformers' defaults for these types).
"""

from __future__ import annotations

from ..config_fields import float_field, int_field
from .llama import sizes
from .reader import HFReader, Keys, rope_theta
from .registry import Family, preset, register

# The keys of GemmaConfig, Gemma2Config, Gemma3TextConfig (transformers 5.24): tied, eps 1e-6, head_dim 256;
# Gemma-3n's and Gemma-4's shared KV layers and keys-as-values are refused.
_GEMMA_KEYS = Keys({"hidden_activation": None, "hidden_act": None, "attention_bias": False,
                    "use_bidirectional_attention": None}, refused={
    "num_kv_shared_layers": ("KV shared across layers (Gemma-3n, Gemma-4)", (None, 0)),
    "attention_k_eq_v": ("keys used as values (Gemma-4)", (None, False))})
GEMMA_KEYS = _GEMMA_KEYS + Keys(sizes(256000, 3072, 24576, 28, 16, 16, 8192, 1e-6, tie=True, head_dim=256))
GEMMA2_KEYS = _GEMMA_KEYS + Keys({**sizes(256000, 2304, 9216, 26, 8, 4, 8192, 1e-6, tie=True, head_dim=256),
                                  "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None,
                                  "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
                   irrelevant=("sliding_window_size",))   # 4.42's copy of sliding_window: transformers reads the latter
GEMMA3_TEXT_KEYS = _GEMMA_KEYS + Keys({
    **sizes(262208, 2304, 9216, 26, 8, 4, 131072, 1e-6, tie=True, head_dim=256, theta=1e6),
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "use_bidirectional_attention": False, "sliding_window_pattern": None,
    "_sliding_window_pattern": None, "rope_local_base_freq": 10000.0})


def _alternate(n: int, every: int) -> tuple:
    """Layer types where every ``every``-th layer (1-based) is full and the rest slide (Gemma-2: 2, Gemma-3: 6)."""
    return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n))


def _gemma_common(r: HFReader) -> None:
    r.arch.update(activation=r.activation("hidden_activation", "hidden_act", want=("gelu_tanh",)),
                  norm_offset=True, embed_scale=True)
    if r.flag("attention_bias"):
        r.refuse("attention_bias")
    if r.flag("use_bidirectional_attention"):
        r.refuse("use_bidirectional_attention", "is not modelled (attention is causal)")


def read_gemma(r: HFReader) -> None:
    _gemma_common(r)


def read_gemma2(r: HFReader) -> None:
    _gemma_common(r)
    qs = r.number("query_pre_attn_scalar")
    r.arch.update(sandwich_norms=True, query_scale=qs ** -0.5 if qs else 0.0,
                  attn_softcap=r.number("attn_logit_softcapping"), final_softcap=r.number("final_logit_softcapping"))
    w, types = r.window()
    if w and r.d.get("layer_types") is None:      # older configs: even layers (the first) slide
        n = r.d["num_hidden_layers"]
        types = tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
    r.arch["sliding_window"], r.arch["layer_types"] = w, types


def read_gemma3_text(r: HFReader) -> None:
    read_gemma2(r)
    r.arch["qk_norm"] = True
    w, types = r.arch["sliding_window"], r.arch["layer_types"]
    if w and r.d.get("layer_types") is None:      # older configs: sliding_window_pattern (every 6th layer full)
        n, every = r.d["num_hidden_layers"], int_field(r.where, "sliding_window_pattern", r.get(
            "sliding_window_pattern", r.get("_sliding_window_pattern", 6)), 1)
        types = _alternate(n, every)
        r.arch["layer_types"] = () if all(t == "sliding" for t in types) else types


def gemma3_rope(r: HFReader) -> float:
    """The global RoPE base of a Gemma-3 config, the sliding layers' into ``r.arch["rope_local_theta"]``:
    rope_parameters keyed by layer type (transformers 5) or rope_theta + rope_local_base_freq (+ rope_scaling
    for the global layers) at the top (4.x). YaRN is not read (Gemma-3 has none)."""
    params = r.d.get("rope_parameters")
    if isinstance(params, dict) and {"full_attention", "sliding_attention"} & set(params):
        thetas = {}
        for kind, default in (("full_attention", 1e6), ("sliding_attention", 1e4)):
            sub = dict(params.get(kind) or {})
            d = {"rope_parameters": sub}
            thetas[kind] = rope_theta(d, r.where, r.notes) if sub else default
            if sub:
                r.notes[:] = [n.replace("rope_parameters", f"rope_parameters.{kind}") for n in r.notes]
        r.arch["rope_local_theta"] = thetas["sliding_attention"]
        return thetas["full_attention"]
    theta = rope_theta(r.d, r.where, r.notes)
    local = r.d.get("rope_local_base_freq")
    r.arch["rope_local_theta"] = 10000.0 if local is None else float_field(r.where, "rope_local_base_freq", local)
    return theta


register(Family("gemma", read_gemma, keys=GEMMA_KEYS))

register(Family("gemma2", read_gemma2, keys=GEMMA2_KEYS, presets=(
    preset("gemma-2-9b", 3584, 14336, 42, 16, 8, 256000, 8192, head_dim=256, rms_eps=1e-6, tie_embeddings=True,
           activation="gelu_tanh", norm_offset=True, sandwich_norms=True, embed_scale=True,
           query_scale=256 ** -0.5, attn_softcap=50.0, final_softcap=30.0, sliding_window=4096,
           layer_types=_alternate(42, 2),
           source="google/gemma-2-9b: GeGLU, (1+w) norms, four per layer, sqrt(hidden) embedding scale, softcaps "
                  "50/30, every other layer (the first) over a 4,096 window, head_dim 256, query_pre_attn_scalar "
                  "256, tied"),
)))

register(Family("gemma3_text", read_gemma3_text, keys=GEMMA3_TEXT_KEYS, rope=gemma3_rope, wrappers={
    "gemma3": {"what": "Gemma-3 4B and up, Gemma3ForConditionalGeneration", "tie_word_embeddings": True,
               "vision": ("boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image")}},
    presets=(
    preset("gemma-3-12b", 3840, 15360, 48, 16, 8, 262208, 131072, head_dim=256, rope_theta=1e6, rms_eps=1e-6,
           tie_embeddings=True, qk_norm=True, activation="gelu_tanh", norm_offset=True, sandwich_norms=True,
           embed_scale=True, query_scale=256 ** -0.5, sliding_window=1024, layer_types=_alternate(48, 6),
           rope_local_theta=10000.0,
           notes=('rope_scaling {"rope_type": "linear", "factor": 8.0} (global layers) is not modelled: RoPE '
                  "uses plain theta=1e+06; costs are unaffected, logits differ from the real model.",),
           source="google/gemma-3-12b-pt (text): as Gemma-2 without softcaps, plus qk-norm; 5 of every 6 layers "
                  "over a 1,024 window with RoPE base 10,000, the 6th global with base 1e6 (its linear RoPE "
                  "scaling x8 is a note)"),
    preset("gemma-3-27b", 5376, 21504, 62, 32, 16, 262208, 131072, head_dim=128, rope_theta=1e6, rms_eps=1e-6,
           tie_embeddings=True, qk_norm=True, activation="gelu_tanh", norm_offset=True, sandwich_norms=True,
           embed_scale=True, query_scale=168 ** -0.5, sliding_window=1024, layer_types=_alternate(62, 6),
           rope_local_theta=10000.0,
           notes=('rope_scaling {"factor": 8.0, "rope_type": "linear"} is not modelled: RoPE uses plain theta=1e+06; '
                  "costs are unaffected, logits differ from the real model.",),
           source="google/gemma-3-27b-it (the text model of its gemma3 wrapper; the vision tower is not costed): "
                  "62 layers, 32 heads / 16 KV of 128, query_pre_attn_scalar 168, 5 of every 6 layers over a 1,024 "
                  "window; vocab 262,208 and the rest transformers' Gemma3TextConfig defaults"),
)))
