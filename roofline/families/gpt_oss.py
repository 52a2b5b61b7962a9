"""GPT-OSS (``model_type`` gpt_oss): experts top-4 with the softmax over the chosen, biases everywhere,
attention sinks, a clamped SwiGLU (alpha 1.702, limit 7.0), alternating 128-token windows, YaRN RoPE. Its
checkpoint keeps every expert in 3-D tensors, gate and up interleaved in one gate_up_proj; its MXFP4
expert weights are read from its quantization_config (roofline.precision.checkpoint; the reader says so in its
own note)."""

from __future__ import annotations

import math

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, Tensors, preset, register

GPT_OSS_TENSORS = Tensors(moe=dict(router="mlp.router.weight", router_bias="mlp.router.bias",
                                   gate="mlp.experts.gate_up_proj", up="mlp.experts.gate_up_proj",
                                   down="mlp.experts.down_proj", gate_bias="mlp.experts.gate_up_proj_bias",
                                   up_bias="mlp.experts.gate_up_proj_bias", down_bias="mlp.experts.down_proj_bias"),
                          interleaved_gate_up=True)


# GptOssConfig (transformers 5.24); the experts' count is not filled in
GPT_OSS_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(201088, 2880, 2880, 36, 64, 8, 131072, 1e-5, head_dim=64, theta=150000.0), "sliding_window": 128,
    "layer_types": None, "num_local_experts": None, "num_experts": None, "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "attention_bias": True, "rope_parameters": dict(
        rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
        original_max_position_embeddings=4096, rope_theta=150000.0),
    "experts_per_token": None},      # OpenAI's own spelling of num_experts_per_tok (both published): must agree
    numerics={"initial_context_length": (4096, "is YaRN's original length as OpenAI's code reads it (transformers "
                                               "reads rope_scaling's)")})


def read_gpt_oss(r: HFReader) -> None:
    llama_like(r)
    if r.d.get("quantization_config") is not None:
        q = r.d["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        r.notes.append(f"quantization_config {method!r}: the experts' published weights are quantized; costs read "
                       "their format from it (--weight-dtype overrides); real weights run as stored where the "
                       "backend's kernels take mxfp4, else dequantized at load (the model's notes say which).")
    if r.d.get("layer_types") is None and r.d.get("sliding_window") is not None:   # transformers: even layers slide
        r.d["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                              for i in range(r.d["num_hidden_layers"])]
    w, types = r.window()
    r.arch.update(sliding_window=w, layer_types=types, qkv_bias=r.flag("attention_bias", True),
                  o_bias=r.flag("attention_bias", True), attn_sinks=True,
                  n_experts=r.experts("num_local_experts", "num_experts"), n_active=r.count("num_experts_per_tok", 4),
                  moe_intermediate=r.d["intermediate_size"], router="topk_softmax", norm_topk=True,
                  router_bias=True, expert_bias=True, expert_activation="swiglu_oai")
    if r.get("experts_per_token", r.arch["n_active"]) != r.arch["n_active"]:
        r.refuse("experts_per_token", f"disagrees with num_experts_per_tok ({r.arch['n_active']}): give one value")
    if r.get("swiglu_alpha", 1.702) != 1.702 or r.get("swiglu_limit", 7.0) != 7.0:
        r.refuse("swiglu_alpha" if r.get("swiglu_alpha", 1.702) != 1.702 else "swiglu_limit",
                 "is not modelled (GPT-OSS's alpha 1.702 and limit 7.0 only)")


# YaRN: x32 over 4,096 positions, beta 32 / 1, attention factor 0.1 ln 32 + 1, not truncated.
_YARN = (32.0, 32.0, 1.0, 4096, 0.1 * math.log(32.0) + 1.0, False)


def _gpt_oss(name: str, n_layers: int, n_experts: int, source: str):
    return preset(name, 2880, 2880, n_layers, 64, 8, 201088, 131072, head_dim=64, rope_theta=150000.0,
                  qkv_bias=True, o_bias=True, attn_sinks=True, sliding_window=128,
                  layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers)),
                  n_experts=n_experts, n_active=4, moe_intermediate=2880, router="topk_softmax", router_bias=True,
                  expert_bias=True, expert_activation="swiglu_oai", rope_yarn=_YARN, quantization=_MXFP4, source=source)


# The released checkpoints' quantization_config (both sizes): MXFP4 routed experts, everything else bf16.
_MXFP4 = {"source": "quantization_config", "config": {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"}}


register(Family("gpt_oss", read_gpt_oss, tensors=GPT_OSS_TENSORS, says_quantization=True, keys=GPT_OSS_KEYS, presets=(
    _gpt_oss("gpt-oss-20b", 24, 32, "openai/gpt-oss-20b (released in MXFP4 experts, the rest bf16): 24 layers, 32 experts of 2,880, top-4 (softmax over the "
                                    "chosen), every other layer (the first) over a 128-token window, YaRN x32"),
    _gpt_oss("gpt-oss-120b", 36, 128, "openai/gpt-oss-120b: as gpt-oss-20b with 36 layers and 128 experts"),
)))
