"""Qwen2-MoE and Qwen3-MoE (``model_type`` qwen2_moe, qwen3_moe): routed experts (softmax, top-k, optionally
renormalised) on every layer but mlp_only_layers and those decoder_sparse_step skips; Qwen2-MoE adds a
gated shared expert, Qwen3-MoE has Qwen3's qk-norm attention."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .qwen2 import QWEN_WINDOW_KEYS, qwen_window
from .qwen3 import QWEN3_ATTENTION_KEYS, QWEN3_VL_TEXT_KEYS, qwen3_attention
from .reader import HFReader, Keys
from .registry import Family, Tensors, preset, register

_ROUTED = dict(router="mlp.gate.weight", gate="mlp.experts.{e}.gate_proj.weight", up="mlp.experts.{e}.up_proj.weight",
               down="mlp.experts.{e}.down_proj.weight")
QWEN3_MOE_TENSORS = Tensors(moe=_ROUTED)
QWEN2_MOE_TENSORS = Tensors(moe=dict(_ROUTED, shared="mlp.shared_expert.",
                                     shared_gate="mlp.shared_expert_gate.weight"))
# Qwen3-VL-MoE's text model keeps every layer's experts in two 3-D tensors: gate_up_proj [E, H, 2I] (gate the first
# half of the outputs, up the second) and down_proj [E, I, H] as published; transformers 5.24 holds (and its
# save_pretrained writes) them [E, 2I, H] / [E, H, I], and its loader transposes a tensor not of that shape.
QWEN3_VL_MOE_TENSORS = Tensors(moe=dict(router="mlp.gate.weight", gate="mlp.experts.gate_up_proj",
                                        up="mlp.experts.gate_up_proj", down="mlp.experts.down_proj"),
                               halved_gate_up=True, experts_out_in=True)

# The keys of Qwen2MoeConfig / Qwen3MoeConfig / Qwen3VLMoeTextConfig (transformers 5.24). The number of experts is
# spelled num_experts or num_local_experts: neither is filled in (a config without one is refused).
_MOE_KEYS = Keys({"decoder_sparse_step": 1, "mlp_only_layers": None, "num_experts": None, "num_local_experts": None,
                  "norm_topk_prob": False})
QWEN2_MOE_KEYS = LLAMA_LIKE_KEYS + QWEN_WINDOW_KEYS + _MOE_KEYS + Keys({
    **sizes(151936, 2048, 5632, 24, 16, 16, 32768, 1e-6), "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "qkv_bias": True})
QWEN3_MOE_KEYS = LLAMA_LIKE_KEYS + QWEN_WINDOW_KEYS + QWEN3_ATTENTION_KEYS + _MOE_KEYS + Keys({
    **sizes(151936, 2048, 6144, 24, 32, 4, 32768, 1e-6), "moe_intermediate_size": 768, "num_experts_per_tok": 8},
    refused={"shared_expert_intermediate_size": ("a shared expert (Qwen3-MoE has none: Hy3 relabelled is not "
                                                 "Qwen3-MoE)", (None, 0)),
             # Hy3's own keys (HYV3Config): a Hy3 config relabelled qwen3_moe is refused, --allow-unknown-fields or not
             "num_shared_experts": ("shared experts (Hy3's: read a Hy3 config as hy_v3)", (None, 0)),
             "router_scaling_factor": ("scaled routing weights (Hy3's: read a Hy3 config as hy_v3)", (None, 1, 1.0))})
# Qwen3-VL-MoE's text model: Qwen3-MoE without the window keys, RoPE base 500,000, head_dim 128, and the top-k
# always renormalised (its router has no norm_topk_prob)
QWEN3_VL_MOE_KEYS = LLAMA_LIKE_KEYS + QWEN3_ATTENTION_KEYS + _MOE_KEYS + Keys({
    **sizes(151936, 2048, 5632, 24, 16, 16, 128000, 1e-6, tie=True, theta=500000.0),
    "moe_intermediate_size": 1408, "num_experts_per_tok": 4, "sliding_window": None, "norm_topk_prob": None},
    refused={"norm_topk_prob": ("a top-k left unnormalised (Qwen3-VL-MoE always renormalises)", (None, True))},
    rope=QWEN3_VL_TEXT_KEYS.rope)


def _sparse_every(r: HFReader) -> tuple:
    """Qwen-MoE's dense layers: mlp_only_layers, and those that decoder_sparse_step skips."""
    n = r.d["num_hidden_layers"]
    step = r.count("decoder_sparse_step", 1)
    only = r.get("mlp_only_layers", [])
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        r.refuse("mlp_only_layers", "must list layer indices")
    return tuple(i for i in range(n) if i in only or (i + 1) % step)


def _routed(r: HFReader) -> None:
    qwen_window(r)
    r.arch.update(n_experts=r.experts("num_experts", "num_local_experts"), n_active=r.count("num_experts_per_tok", 4),
                  moe_intermediate=r.size("moe_intermediate_size"), router="softmax_topk",
                  norm_topk=r.flag("norm_topk_prob", False), dense_layers=_sparse_every(r))


def read_qwen2_moe(r: HFReader) -> None:
    llama_like(r)
    r.arch["qkv_bias"] = r.flag("qkv_bias", True)
    _routed(r)
    shared = r.get("shared_expert_intermediate_size", 0)
    if shared:
        r.arch.update(shared_intermediate=r.count("shared_expert_intermediate_size", 0), shared_gate=True)


def read_qwen3_moe(r: HFReader) -> None:
    llama_like(r)
    qwen3_attention(r)
    _routed(r)


def read_qwen3_vl_moe_text(r: HFReader) -> None:
    read_qwen3_moe(r)
    r.arch["norm_topk"] = True


register(Family("qwen2_moe", read_qwen2_moe, tensors=QWEN2_MOE_TENSORS, keys=QWEN2_MOE_KEYS))

register(Family("qwen3_moe", read_qwen3_moe, tensors=QWEN3_MOE_TENSORS, keys=QWEN3_MOE_KEYS, presets=(
    preset("qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 151936, 40960, head_dim=128, rope_theta=1e6, rms_eps=1e-6,
           qk_norm=True, n_experts=128, n_active=8, moe_intermediate=768,
           source="Qwen/Qwen3-30B-A3B: 128 experts of 768, top-8, renormalised; qk-norm, head_dim 128 (30.5B, "
                  "3.3B active)"),
)))

register(Family("qwen3_vl_moe_text", read_qwen3_vl_moe_text, tensors=QWEN3_VL_MOE_TENSORS, keys=QWEN3_VL_MOE_KEYS,
                wrappers={"qwen3_vl_moe": {"what": "Qwen3-VL-MoE, Qwen3VLMoeForConditionalGeneration",
                                           "tie_word_embeddings": False, "vision": ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}},
                presets=(
    preset("qwen3-vl-235b-a22b", 4096, 12288, 94, 64, 4, 151936, 262144, head_dim=128, rope_theta=5e6, rms_eps=1e-6,
           qk_norm=True, n_experts=128, n_active=8, moe_intermediate=1536,
           source="Qwen/Qwen3-VL-235B-A22B-Instruct's config.json as transformers 5.7 loads it (a public model "
                  "report of the checkpoint: tests/data/hf_configs/multimodal/qwen3-vl-235b-a22b-instruct.json), "
                  "the text model of its qwen3_vl_moe wrapper (the vision tower is not costed): 94 layers of 128 "
                  "experts of 1,536, top-8 renormalised, 64 heads / 4 KV of 128, qk-norm, RoPE base 5e6 (its "
                  "interleaved mrope rotates text positions as plain RoPE), untied; 235.09B text parameters of the "
                  "checkpoint's 235.67B"),
)))
