"""Phi-3 and Phi-4-mini (``model_type`` phi3): a Llama whose checkpoint fuses q/k/v into qkv_proj and gate/up
into gate_up_proj (costed as the split projections, loaded into them slice by slice); RoPE on each head's first
partial_rotary_factor of dims (Phi-4-mini: 0.75)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys, rotary_dim
from .registry import Family, Tensors, preset, register


# Phi3Config (transformers 5.24); dropout is training-only
PHI3_KEYS = LLAMA_LIKE_KEYS + Keys(
    {**sizes(32064, 3072, 8192, 32, 32, None, 4096, 1e-5), "sliding_window": None, "layer_types": None},
    numerics={"original_max_position_embeddings": (4096, "sets where LongRoPE's scaling starts")},
    irrelevant=("resid_pdrop", "embd_pdrop"))


def read_phi3(r: HFReader) -> None:
    llama_like(r, partial_rotary=True)       # Phi-4-mini rotates 3/4 of each head
    hd = r.d.get("head_dim") or r.d["hidden_size"] // r.d["num_attention_heads"]
    r.arch["rotary_dim"] = rotary_dim(r, hd)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()


register(Family("phi3", read_phi3, tensors=Tensors(fused_qkv=True, fused_gate_up=True), keys=PHI3_KEYS, presets=(
    preset("phi-3-mini", 3072, 8192, 32, 32, 32, 32064, 4096, sliding_window=2047,
           source="microsoft/Phi-3-mini-4k-instruct: fused qkv_proj / gate_up_proj (costed as the split ones), "
                  "MHA, a 2,047-token window on every layer"),
)))
