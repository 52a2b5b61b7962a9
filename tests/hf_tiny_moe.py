"""Tiny real mixture-of-experts and latent-attention checkpoints built with transformers' own code, and
transformers' own logits for them (issue 21). The same API as tests/hf_tiny.py, whose helpers this reuses.

For each ``model_type`` of ``MODEL_TYPES``: ``tiny_config(model_type)`` is a float32 config, 3 layers,
hidden 64, vocab 256, experts of intermediate 32, exercising every feature of the family (see ``_CONFIGS``):

- mixtral: 8 experts, top-2 (softmax over all, renormalised top-2); untied; no window (as Mixtral-8x7B).
- qwen2_moe: 8 experts, top-4, ``norm_topk_prob`` false; a shared expert (intermediate 48) behind its sigmoid
  gate (``shared_expert_gate``, hidden -> 1); q/k/v biases; ``mlp_only_layers=[1]`` makes layer 1 a dense MLP
  (intermediate 96), layers 0 and 2 are MoE (``decoder_sparse_step`` 1).
- qwen3_moe: 8 experts, top-2, ``norm_topk_prob`` true; qk-norm; head_dim 32 independent of hidden / heads.
- deepseek_v3: MLA (q_lora_rank 48, kv_lora_rank 32, qk_nope_head_dim 16, qk_rope_head_dim 8, v_head_dim 24,
  4 heads); ``first_k_dense_replace`` 1 (layer 0 a dense MLP of 96, layers 1-2 MoE); 8 routed experts in
  4 groups, ``topk_group`` 2, top-3; sigmoid scores with a non-zero ``e_score_correction_bias`` (a buffer,
  saved in the safetensors), ``routed_scaling_factor`` 2.5, one shared expert (intermediate 32);
  ``rope_scaling`` null (default RoPE, theta 1e4); ``rope_interleave`` as the config defaults
  (``ROPE_INTERLEAVE``: True in transformers 5.24, the rotary pairs interleaved).
- minimax_m2: 8 experts, top-3, in every layer; sigmoid scores with a non-zero ``e_score_correction_bias`` (a
  buffer of the MoE block, not of the router: transformers passes it in), renormalised, no scaling, no shared
  expert; qk-norm over the whole q and k projections; RoPE on the first ``rotary_dim`` 16 of head_dim 32; the
  published configs' own keys (qk_norm_type per_layer, scoring_func sigmoid, attn_type_list, one MTP module).
- gpt_oss: 4 experts, top-2 (softmax over the top-2 logits); biases on q/k/v/o, the router and both expert
  projections; per-head attention sinks; the clamped SwiGLU (the published limit 7.0 and alpha 1.702,
  gate/up interleaved; gate_up weights N(0, CLAMP_STD) so a share of the pre-activations pass the limit); layers 0 and 2 slide over ``WINDOW`` (8) keys, layer 1
  full; RoPE as the config defaults (YaRN, factor 32 over 4096, theta 150000); no quantization_config.
- ernie4_5_moe: 8 experts, top-3, chosen by softmax + a non-zero ``moe_statics.e_score_correction_bias``
  ([1, E], N(0, SOFTMAX_E_BIAS_STD)), weighed by the renormalised softmax; experts on layers 0-1
  (``moe_layer_start_index`` 0, ``moe_layer_end_index`` 1), layer 2 a dense MLP of 96; two shared experts (one
  MLP of 64); RoPE on interleaved pairs (base 500,000); tied embeddings.
- hy_v3: 8 experts, top-3, sigmoid scores + a non-zero ``mlp.expert_bias`` (the MoE block's
  e_score_correction_bias buffer, N(0, E_BIAS_STD)) to choose, renormalised x 2.826; one shared expert
  (``mlp.shared_mlp``, 32); qk-norm; q/k/v/o biases; ``mlp_layer_types`` makes layer 1 dense (96); head_dim 16.
- deepseek_v32: deepseek_v3's sizes and routing + DeepSeek Sparse Attention's indexer (8 heads of 16, RoPE
  half-split on its first 8) in every layer, each query attending to its top ``INDEX_TOPK`` (6) of the 20
  positions' keys (``index_margins``: how far from a tie transformers' selection was).
- glm_moe_dsa: the same sizes, one expert group; its indexer's RoPE on interleaved pairs; layer 1 "shared"
  (``indexer_types``: no indexer, layer 0's selection).

``build_checkpoint`` saves it (config.json + model.safetensors) with seeded weights: hf_tiny's scales, plus
router weights N(0, ROUTER_STD) so the routing is decisive (different tokens pick different experts, the
k-th and (k+1)-th scores far apart: ties impossible in practice; ``routing`` measures both), expert biases
N(0, BIAS_STD), sinks N(0, SINK_STD), DeepSeek's correction bias N(0, E_BIAS_STD), gpt_oss's expert
weights N(0, CLAMP_STD) / N(0, CLAMP_DOWN_STD); then each router's weight loses the direction all tokens
share (``_spread_routers``).

``reference_logits`` / ``reference`` / ``prefill_logits`` / ``checkpoint`` are hf_tiny's, loading with eager
attention and eager experts (transformers' loop over the experts that received tokens; its default on CPU
is grouped_mm, which routes identically). ``routing(folder, tokens)`` is what each MoE layer's router chose
for a prefill of ``tokens``, with the selection margins.

The safetensors are in the hub's layout, as save_pretrained converts back: per-expert 2-D weights
(Mixtral ``block_sparse_moe.experts.N.w1/w2/w3`` and ``block_sparse_moe.gate``; Qwen / DeepSeek
``mlp.experts.N.gate_proj/up_proj/down_proj``, ``mlp.gate``, ``mlp.shared_expert(s)``, ``mlp.shared_expert_gate``,
``mlp.gate.e_score_correction_bias``; MiniMax-M2 Mixtral's names and ``block_sparse_moe.e_score_correction_bias``;
ERNIE's ``mlp.moe_statics.e_score_correction_bias`` [1, E]; Hy3's
``mlp.router.gate``, ``mlp.expert_bias``, ``mlp.shared_mlp``), except gpt_oss's fused 3-D ``mlp.experts.gate_up_proj`` [E, hidden, 2I]
(gate and up interleaved along the last axis), ``down_proj`` [E, I, hidden] and their ``_bias``, ``mlp.router``.

A multimodal wrapper whose text model is an MoE (``WRAPPED``) is built whole (its vision tower one tiny block, which
our model does not read) from ``Qwen3VLMoeConfig(text_config=..., vision_config=...)`` and run on text alone:
- qwen3_vl_moe: 8 experts, top-2, always renormalised; qk-norm, head_dim 32; mrope sections (8, 4, 4) interleaved
  (text positions: plain RoPE). save_pretrained writes its experts as transformers 5.24 holds them, one 3-D tensor
  per layer: ``mlp.experts.gate_up_proj`` [E, 2I, hidden] (gate the first I rows) and ``down_proj`` [E, hidden, I]
  (the published checkpoints hold them transposed, [E, hidden, 2I] and [E, I, hidden]), under
  ``model.language_model.``, with ``lm_head`` and ``model.visual.*`` beside.

Written against transformers 5.24 (``BUILT_WITH``); ``require`` skips on versions without these classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import hf_tiny as H
from hf_tiny import PROMPT, TOKENS, Reference, one_thread, tokens, version  # noqa: F401  (re-exported API)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BUILT_WITH = "5.24.0"
MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "glm4_moe", "minimax_m2", "ernie4_5_moe",
               "hy_v3", "deepseek_v32", "glm_moe_dsa")
WRAPPED = ("qwen3_vl_moe",)   # multimodal wrappers of an MoE text model (built whole, run on text)
HYBRID = ("qwen3_next", "qwen3_5_text")   # Gated DeltaNet hybrids (issue 32): tests/test_hf_parity_hybrid.py
WINDOW = H.WINDOW          # gpt_oss's sliding layers
INDEX_TOPK = 6            # deepseek_v32: keys each query attends to (of 20 positions)
ROPE_INTERLEAVE = True     # DeepseekV3Config's default in 5.24 (the tiny config leaves it unset): see test
LAYERS = 3

_COMMON = dict(hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.02,
               use_cache=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

_CONFIGS = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                                      sliding_window=None, rope_theta=1000000.0)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=4, norm_topk_prob=False,
                                         shared_expert_intermediate_size=48, decoder_sparse_step=1,
                                         mlp_only_layers=[1], use_sliding_window=False,
                                         rope_theta=1000000.0)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=2, norm_topk_prob=True, head_dim=32,
                                         attention_bias=False, decoder_sparse_step=1, mlp_only_layers=[],
                                         use_sliding_window=False, rope_theta=1000000.0)),
    "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
                                             n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
                                             n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                             first_k_dense_replace=1, q_lora_rank=48, kv_lora_rank=32,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                                             rope_scaling=None, rope_theta=10000.0, attention_bias=False)),
    # DeepSeek-V3's tiny config + the lightning indexer: 8 heads of 16 (RoPE on its first 8), top-INDEX_TOPK of the
    # keys, fewer than the 20 positions, so decode past position INDEX_TOPK and every prefill past it select
    "deepseek_v32": ("DeepseekV32Config", dict(num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
                                               n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
                                               n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                               first_k_dense_replace=1, q_lora_rank=48, kv_lora_rank=32,
                                               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                                               rope_scaling=None, rope_theta=10000.0, attention_bias=False,
                                               index_topk=INDEX_TOPK, index_n_heads=8, index_head_dim=16)),
    # GLM-5's: the same sizes, its indexer's RoPE on interleaved pairs, layer 1 reusing layer 0's selection
    # ("shared"), one expert group (its default), the first layer dense
    "glm_moe_dsa": ("GlmMoeDsaConfig", dict(num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
                                            n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                                            routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                                            q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                            v_head_dim=24, rope_theta=10000.0, attention_bias=False,
                                            index_topk=INDEX_TOPK, index_n_heads=8, index_head_dim=16,
                                            indexer_types=["full", "shared", "full"])),
    # partial rotary (half of head_dim 32), q/k/v biases, qk-norm, the first layer dense, DeepSeek's routing
    "glm4_moe": ("Glm4MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                                       num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
                                       routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                                       head_dim=32, partial_rotary_factor=0.5, attention_bias=True,
                                       use_qk_norm=True, rope_theta=10000.0)),
    # whole-projection qk-norm, rotary_dim 16 of head_dim 32, sigmoid routing with a correction bias (one group),
    # and the published configs' own keys (MiniMax's configuration_minimax_m2.py), which transformers ignores
    "minimax_m2": ("MiniMaxM2Config", dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=3,
                                           head_dim=32, rotary_dim=16, rope_theta=10000.0, use_qk_norm=True,
                                           qk_norm_type="per_layer", scoring_func="sigmoid", use_routing_bias=True,
                                           shared_intermediate_size=0, attn_type_list=[1] * LAYERS, use_mtp=True,
                                           num_mtp_modules=1, mtp_transformer_layers=1)),
    # experts on layers 0-1 (start 0, end 1: layer 2 dense), softmax + correction bias, two shared experts (64),
    # interleaved RoPE pairs, tied embeddings (the class's default), RoPE base 500,000 (its default)
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, moe_num_experts=8,
                                                moe_k=3, moe_num_shared_experts=2, moe_layer_start_index=0,
                                                moe_layer_end_index=1, moe_layer_interval=1, use_bias=False,
                                                tie_word_embeddings=True)),
    # qk-norm, q/k/v/o biases, layer 1 dense (mlp_layer_types), sigmoid routing with a correction bias x 2.826,
    # one shared expert, head_dim 16, RoPE base 11,158,840 (its default)
    "hy_v3": ("HYV3Config", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3,
                                 num_shared_experts=1, router_scaling_factor=2.826, head_dim=16, attention_bias=True,
                                 mlp_layer_types=["sparse", "dense", "sparse"])),
    # Llama-4 (tests/test_hf_llama4.py; not in MODEL_TYPES: its experts run every token, see there): layers 0-1
    # RoPE over chunks of CHUNK with the weightless qk-norm, layer 2 NoPE over everything with the query
    # temperature (floor_scale 4: it moves from position 3 on); layer 0 a dense MLP of 96, layers 1-2 routed
    # experts (4 of 32, top-2 sigmoid weights on the inputs) + a shared expert of 32
    "llama4_text": ("Llama4TextConfig", dict(intermediate_size=32, intermediate_size_mlp=96, head_dim=16,
                                             num_local_experts=4, num_experts_per_tok=2, moe_layers=[1, 2],
                                             no_rope_layers=[1, 1, 0], attention_chunk_size=6, floor_scale=4,
                                             attn_scale=0.5, use_qk_norm=True, rope_theta=10000.0)),
    # Gated DeltaNet on layers 0, 1, 3 (2 key heads of 16, 4 value heads of 24, conv kernel 4), gated attention on
    # layer 2 (head_dim 32, RoPE on its first 8: partial_rotary_factor 0.25); 8 experts, top-2, renormalised, a
    # sigmoid-gated shared expert of 48 on layers 0, 2, 3; layer 1 dense (96)
    "qwen3_next": ("Qwen3NextConfig", dict(num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32,
                                           num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                           shared_expert_intermediate_size=48, decoder_sparse_step=1,
                                           mlp_only_layers=[1], head_dim=32, partial_rotary_factor=0.25,
                                           linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                           linear_value_head_dim=24, linear_conv_kernel_dim=4,
                                           layer_types=["linear_attention", "linear_attention", "full_attention",
                                                        "linear_attention"], rope_theta=10000.0)),
    # Qwen3.5's text model: the same layers with its four DeltaNet projections (in_proj_qkv, _z, _b, _a), a dense MLP
    "qwen3_5_text": ("Qwen3_5TextConfig", dict(num_hidden_layers=4, intermediate_size=96, head_dim=32,
                                               linear_num_key_heads=2, linear_num_value_heads=4,
                                               linear_key_head_dim=16, linear_value_head_dim=24,
                                               linear_conv_kernel_dim=4,
                                               layer_types=["linear_attention", "linear_attention",
                                                            "full_attention", "linear_attention"],
                                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.25})),
    "gpt_oss": ("GptOssConfig", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                     sliding_window=WINDOW, attention_bias=True, swiglu_limit=7.0,
                                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # the text_config; experts of 48 so that neither 3-D tensor is square (hidden 64 vs 2I 96, I 48)
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", dict(intermediate_size=96, moe_intermediate_size=48, num_experts=8,
                                              num_experts_per_tok=2, head_dim=32, decoder_sparse_step=1,
                                              mlp_only_layers=[], rope_parameters={
                                                  "rope_type": "default", "rope_theta": 1000000.0,
                                                  "mrope_section": [8, 4, 4], "mrope_interleaved": True})),
}
# the wrappers' vision towers: one block, as small as Qwen3VLMoeVisionConfig takes
_VISION = {"qwen3_vl_moe": dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                                num_position_embeddings=16, deepstack_visual_indexes=[0], patch_size=4)}

# Which layers run experts (the others a dense MLP): what a reader of these configs must find.
MOE_LAYERS = {"mixtral": (0, 1, 2), "qwen2_moe": (0, 2), "qwen3_moe": (0, 1, 2), "deepseek_v3": (1, 2), "deepseek_v32": (1, 2), "glm_moe_dsa": (1, 2),
              "gpt_oss": (0, 1, 2), "glm4_moe": (1, 2), "minimax_m2": (0, 1, 2), "qwen3_vl_moe": (0, 1, 2),
              "ernie4_5_moe": (0, 1), "hy_v3": (0, 2), "llama4_text": (1, 2), "qwen3_next": (0, 2, 3), "qwen3_5_text": ()}

LINEAR_STD, EMBED_STD, BIAS_STD = H.LINEAR_STD, H.EMBED_STD, H.BIAS_STD
ROUTER_STD = 0.5     # router logits ~N(0, 4): decisive choices, top-k margins far above fp32 rounding
SINK_STD = 1.0       # gpt_oss sinks: O(1) logits, comparable with the attention scores
E_BIAS_STD = 0.2     # DeepSeek's e_score_correction_bias against sigmoid scores in (0, 1): changes some choices
SOFTMAX_E_BIAS_STD = 0.05   # ERNIE's against softmax scores, most near 0: 0.2 would choose alone (seen: one expert
                            # taking every token)
CLAMP_STD = 0.6      # gpt_oss gate_up weights: pre-activations ~N(0, 5), so the published limit 7 clamps some
CLAMP_DOWN_STD = 0.02  # gpt_oss down weights: the clamped SwiGLU's outputs (up to ~60) back to O(1)


def require(model_type: str) -> None:
    """Skip the calling test when the installed transformers cannot build ``model_type`` as written here."""
    if model_type not in _CONFIGS:
        raise ValueError(f"model_type {model_type!r} has no tiny MoE config: known are "
                         f"{', '.join(MODEL_TYPES + WRAPPED + HYBRID)}")
    cls_name = _CONFIGS[model_type][0]
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {version()} has no {cls_name}: the {model_type} fixture needs a newer one")
    if H._major_minor(version()) < (5, 0):
        pytest.skip(f"transformers {version()}: the tiny MoE fixtures are written for 5.x (3-D expert weights, "
                    f"experts_implementation); built with {BUILT_WITH}")


def tiny_config(model_type: str):
    """A float32 transformers config of ``model_type`` (see the module docstring)."""
    require(model_type)
    cls_name, extra = _CONFIGS[model_type]
    if model_type in WRAPPED:
        cfg = getattr(transformers, cls_name)(text_config={**_COMMON, **extra}, vision_config=_VISION[model_type],
                                              tie_word_embeddings=False)
    else:
        cfg = getattr(transformers, cls_name)(**{**_COMMON, **extra})
    setattr(cfg, H._DTYPE(), torch.float32)
    return cfg


def _auto(model_type: str):
    """transformers' auto class of ``model_type``: a causal LM, or a wrapper's image-text-to-text model."""
    return transformers.AutoModelForImageTextToText if model_type in WRAPPED else transformers.AutoModelForCausalLM


def _load(folder):
    kw = {H._DTYPE(): torch.float32, "attn_implementation": "eager", "experts_implementation": "eager"}
    model_type = json.loads((Path(folder) / "config.json").read_text())["model_type"]
    return _auto(model_type).from_pretrained(Path(folder), **kw).eval()


def _is_router(module) -> bool:
    return type(module).__name__.lower().endswith("router")


def _randomize(model, model_type: str, seed: int) -> None:
    """hf_tiny's draw for every parameter, then, from the same generator: router weights N(0, ROUTER_STD),
    expert biases N(0, BIAS_STD), sinks N(0, SINK_STD), DeepSeek's correction bias N(0, E_BIAS_STD), gpt_oss's expert
weights N(0, CLAMP_STD) / N(0, CLAMP_DOWN_STD); then each router's weight loses the direction all tokens
share (``_spread_routers``)."""
    H._randomize(model, model_type, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for fqn, m in model.named_modules():
            if "e_score_correction_bias" in m._buffers and not _is_router(m):   # MiniMax-M2: on the MoE block
                m.e_score_correction_bias.copy_(torch.randn(m.e_score_correction_bias.shape, generator=g) * E_BIAS_STD)
            if _is_router(m):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * ROUTER_STD)
                bias = getattr(m, "e_score_correction_bias", None)
                if bias is not None:
                    bias.copy_(torch.randn(bias.shape, generator=g) * E_BIAS_STD)
        for fqn, m in model.named_modules():     # a correction bias held beside the router (ERNIE's moe_statics)
            bias = getattr(m, "e_score_correction_bias", None)
            if not _is_router(m) and isinstance(bias, torch.Tensor):
                std = SOFTMAX_E_BIAS_STD if model_type == "ernie4_5_moe" else E_BIAS_STD
                bias.copy_(torch.randn(bias.shape, generator=g) * std)
        for name, p in model.named_parameters():
            if name.endswith("_proj_bias"):           # gpt_oss experts: [E, out], 2-D but a bias
                p.copy_(torch.randn(p.shape, generator=g) * BIAS_STD)
            elif name.endswith(".sinks"):
                p.copy_(torch.randn(p.shape, generator=g) * SINK_STD)
            elif model_type == "gpt_oss" and name.endswith("experts.gate_up_proj"):
                p.copy_(torch.randn(p.shape, generator=g) * CLAMP_STD)
            elif model_type == "gpt_oss" and name.endswith("experts.down_proj"):
                p.copy_(torch.randn(p.shape, generator=g) * CLAMP_DOWN_STD)
    _spread_routers(model, seed)


def _spread_routers(model, seed: int) -> None:
    """Take out of each router's weight the direction every token shares.

    Biases and norm weights give all hidden states a common component; a router reading it sends every token
    to the same experts (seen: one gpt_oss layer sending all 20 tokens to experts 0 and 1). Layer by layer, on
    ``tokens(32, seed)``, the mean router input u (unit) is projected out of the rows: W <- W - (W u) u^T, so
    the logits vary with the token. A later layer is calibrated after the earlier ones changed."""
    ids = torch.tensor([tokens(32, seed)])
    routers = [m for _, m in model.named_modules() if _is_router(m)]
    for r in routers:
        got = []
        h = r.register_forward_hook(lambda mod, inp, out: got.append(inp[0].detach().reshape(-1, inp[0].shape[-1])))
        try:
            model(input_ids=ids, use_cache=False)
        finally:
            h.remove()
        u = got[0].double().mean(dim=0)
        u = u / u.norm()
        w = r.weight.double()
        r.weight.copy_((w - (w @ u)[:, None] * u[None, :]).to(r.weight.dtype))


def build_checkpoint(model_type: str, folder, seed: int = 0) -> Path:
    """Save a tiny ``model_type`` checkpoint in ``folder`` (config.json + model.safetensors, float32) with
    weights drawn from ``seed``; returns the folder."""
    cfg = tiny_config(model_type)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with one_thread(), torch.no_grad():
        torch.manual_seed(seed)
        model = _auto(model_type).from_config(cfg, attn_implementation="eager",
                                              experts_implementation="eager").float().eval()
        _randomize(model, model_type, seed)
        model.save_pretrained(folder, safe_serialization=True)
    if not (folder / "model.safetensors").exists():
        raise RuntimeError(f"save_pretrained wrote no model.safetensors in {folder}: {sorted(folder.iterdir())}")
    return folder


def reference_logits(folder, token_ids, *, prompt: int = PROMPT, steps: int = 0) -> Reference:
    """transformers' logits for ``token_ids`` and ``steps`` greedy tokens after them (hf_tiny's ``Reference``:
    a full uncached forward, and a cached prefill of ``prompt`` tokens then one token per step)."""
    seq = [int(t) for t in token_ids]
    n = len(seq)
    if not 1 <= prompt <= n:
        raise ValueError(f"prompt {prompt} must be between 1 and the {n} tokens given")
    with one_thread(), torch.no_grad():
        model = _load(folder)
        cache_kw = H.cache_kwarg(model)
        out = model(input_ids=torch.tensor([seq[:prompt]]), use_cache=True)
        rows, cache = [H._logits(out)], H._cache_of(out)
        for pos in range(prompt, n + steps):
            if pos >= len(seq):                      # past the given tokens: greedy
                seq.append(int(np.argmax(rows[-1][-1])))
            out = model(input_ids=torch.tensor([[seq[pos]]]), use_cache=True, position_ids=torch.tensor([[pos]]),
                        **{cache_kw: cache})
            cache = H._cache_of(out)
            rows.append(H._logits(out))
        full = H._logits(model(input_ids=torch.tensor([seq]), use_cache=False))
    return Reference(tuple(seq), prompt, full, np.concatenate(rows, axis=0))


def prefill_logits(folder, token_ids) -> np.ndarray:
    """transformers' logits [len(token_ids), vocab] of one forward over ``token_ids``, no cache."""
    with one_thread(), torch.no_grad():
        return H._logits(_load(folder)(input_ids=torch.tensor([[int(t) for t in token_ids]]), use_cache=False))


@dataclass(frozen=True)
class LayerRouting:
    """One MoE layer's choices for a prefill: ``experts`` [tokens, k] (transformers' order), ``weights``
    [tokens, k] as applied to the expert outputs, ``logits`` [tokens, E] the router GEMM's output, ``counts``
    [E] tokens per expert, ``margin``: the smallest gap, over tokens, between the k-th chosen and the best
    unchosen selection score (logits for softmax routers; sigmoid + correction bias for DeepSeek, where the
    gap between the last chosen and the best unchosen group counts too): how far from a tie the choice was."""
    layer: int
    logits: np.ndarray
    experts: np.ndarray
    weights: np.ndarray
    counts: np.ndarray
    margin: float


def _margin(scores: torch.Tensor, chosen: torch.Tensor) -> float:
    """min over rows of (smallest chosen score - largest unchosen score)."""
    taken = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, chosen, True)
    lo = scores.masked_fill(~taken, float("inf")).min(dim=1).values
    hi = scores.masked_fill(taken, float("-inf")).max(dim=1).values
    return float((lo - hi).min())


def _selection_margin(model_type: str, router, logits: torch.Tensor, chosen: torch.Tensor, inputs=()) -> float:
    """The margin of the router's choice in the space transformers ranks in (``inputs``: the router's; a
    correction bias handed to it is the 2nd, MiniMax's and Hy3's)."""
    logits = logits.double()
    if model_type in ("minimax_m2", "hy_v3"):        # sigmoid + the block's correction bias (its 2nd input)
        return _margin(logits.sigmoid() + inputs[1].double(), chosen)
    if model_type == "ernie4_5_moe":                  # softmax + the correction bias (moe_statics)
        bias = router.moe_statics.e_score_correction_bias.double().reshape(-1)
        return _margin(logits.softmax(dim=-1) + bias, chosen)
    if model_type in ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm_moe_dsa"):      # the same grouped sigmoid routing
        n_group, topk_group = router.num_group, router.topk_group
        s = logits.sigmoid() + router.e_score_correction_bias.double()
        per = s.shape[1] // n_group
        groups = s.view(-1, n_group, per).topk(2, dim=-1).values.sum(-1)
        gchosen = groups.topk(topk_group, dim=-1).indices
        within = s.masked_fill(~torch.zeros_like(groups, dtype=torch.bool).scatter_(1, gchosen, True)
                               .repeat_interleave(per, dim=1), float("-inf"))
        finite = within.clamp(min=-1e9)
        return min(_margin(groups, gchosen), _margin(finite, chosen))
    if model_type == "gpt_oss":                       # top-k of the logits, softmax over the chosen
        return _margin(logits, chosen)
    return _margin(logits, chosen)    # softmax over all, then top-k: the same order as the logits


def routing(folder, token_ids, model_type: str | None = None) -> list:
    """What each MoE layer's router chose in one uncached forward over ``token_ids`` (``LayerRouting`` per MoE
    layer, in layer order), from hooks on transformers' own router modules."""
    seen = []
    with one_thread(), torch.no_grad():
        model = _load(folder)
        model_type = model_type or model.config.model_type
        hooks = []
        for fqn, m in model.named_modules():
            if _is_router(m):
                layer = int(fqn.split("layers.")[1].split(".")[0])
                hooks.append(m.register_forward_hook(
                    lambda mod, inp, out, layer=layer: seen.append((layer, mod, inp, out))))
        try:
            model(input_ids=torch.tensor([[int(t) for t in token_ids]]), use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        out = []
        for layer, mod, inp, (logits, weights, idx) in seen:
            counts = torch.bincount(idx.flatten(), minlength=mod.num_experts).numpy()
            out.append(LayerRouting(layer, logits.float().numpy().copy(), idx.numpy().copy(), weights.float().numpy().copy(), counts,
                                    _selection_margin(model_type, mod, logits, idx, inp)))
    return sorted(out, key=lambda r: r.layer)


def index_margins(folder, token_ids) -> list:
    """DeepSeek Sparse Attention: per indexer layer of one uncached forward over ``token_ids``, the smallest gap,
    over the queries that see more than index_topk keys, between the k-th and the (k+1)-th highest index score
    (how far from a tie transformers' selection was). Read from transformers' own scores: its indexers' topk
    calls, wrapped while each indexer runs."""
    margins = []
    orig = torch.Tensor.topk

    def topk(self, k, dim=-1, *a, **kw):
        v = orig(self, min(k + 1, self.shape[-1]), dim=dim).values
        seen = v[..., -1] > -1e30 if self.shape[-1] > k else torch.zeros(v.shape[:-1], dtype=torch.bool)
        if seen.any():                            # masked (future) keys carry finfo.min, not -inf
            margins.append(float((v[..., k - 1] - v[..., k])[seen].min()))
        return orig(self, k, dim, *a, **kw)

    def wrap(fwd):
        def run(*a, **kw):
            torch.Tensor.topk = topk
            try:
                return fwd(*a, **kw)
            finally:
                torch.Tensor.topk = orig
        return run

    with one_thread(), torch.no_grad():
        model = _load(folder)
        for _, m in model.named_modules():
            if type(m).__name__.endswith("Indexer"):
                m.forward = wrap(m.forward)
        model(input_ids=torch.tensor([[int(t) for t in token_ids]]), use_cache=False)
    return margins


# the session's checkpoints and references (14 given + 6 greedy = 20 positions: past gpt_oss's window of 8)
_FIXTURES = H.SessionFixtures(build_checkpoint, reference_logits, "roofline-hf-tiny-moe-")
checkpoint, reference = _FIXTURES.checkpoint, _FIXTURES.reference
