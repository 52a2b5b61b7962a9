"""Mixtral (``model_type`` mixtral): a Mistral whose MLP is 8 routed experts, top-2, softmax then
renormalised; its checkpoint keeps them under block_sparse_moe (w1 / w3 / w2: gate / up / down)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, Tensors, preset, register

MIXTRAL_TENSORS = Tensors(moe=dict(router="block_sparse_moe.gate.weight",
                                   gate="block_sparse_moe.experts.{e}.w1.weight",
                                   up="block_sparse_moe.experts.{e}.w3.weight",
                                   down="block_sparse_moe.experts.{e}.w2.weight"))


# MixtralConfig (transformers 5.24); the experts' count (num_local_experts or num_experts) is not filled in
MIXTRAL_KEYS = LLAMA_LIKE_KEYS + Keys({**sizes(32000, 4096, 14336, 32, 32, 8, 131072, 1e-5, theta=1e6),
                                       "sliding_window": None, "layer_types": None, "num_experts_per_tok": 2,
                                       "num_local_experts": None, "num_experts": None})


def read_mixtral(r: HFReader) -> None:
    llama_like(r)
    r.arch["sliding_window"], r.arch["layer_types"] = r.window()
    r.arch.update(n_experts=r.experts("num_local_experts", "num_experts"),
                  n_active=r.count("num_experts_per_tok", 2), moe_intermediate=r.d["intermediate_size"],
                  router="softmax_topk", norm_topk=True)


register(Family("mixtral", read_mixtral, tensors=MIXTRAL_TENSORS, keys=MIXTRAL_KEYS, presets=(
    preset("mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768, rope_theta=1e6, n_experts=8, n_active=2,
           moe_intermediate=14336,
           source="mistralai/Mixtral-8x7B-v0.1: 8 experts of 14,336, top-2, softmax then renormalised (46.7B, "
                  "12.9B active)"),
)))
