"""DeepSeek-V3 (``model_type`` deepseek_v3): multi-head latent attention (a query/key head is nope + rope
dims), 256 routed experts chosen by sigmoid scores in groups (noaux_tc), a shared expert, the first layers
dense; YaRN RoPE whose mscale also scales the softmax."""

from __future__ import annotations

import math

from ..config_fields import float_field
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, Tensors, preset, register

DEEPSEEK_TENSORS = Tensors(moe=dict(router="mlp.gate.weight", correction="mlp.gate.e_score_correction_bias",
                                    gate="mlp.experts.{e}.gate_proj.weight", up="mlp.experts.{e}.up_proj.weight",
                                    down="mlp.experts.{e}.down_proj.weight", shared="mlp.shared_experts."))


# DeepseekV3Config (transformers 5.24), and the keys DeepSeek's own configuration_deepseek.py adds (training-only:
# aux_loss_alpha, seq_aux, ep_size); DeepSeek-V3.2's indexer (relabelled deepseek_v3) is refused: families.deepseek_v32
# reads it.
DEEPSEEK_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(129280, 7168, 18432, 61, 128, 128, 4096, 1e-6), "moe_intermediate_size": 2048, "n_shared_experts": 1,
    "n_routed_experts": 256, "num_local_experts": None, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8,
    "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "rope_interleave": True, "attention_bias": False, "num_nextn_predict_layers": 1, "moe_layer_freq": 1,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    refused={k: ("DeepSeek-V3.2's sparse-attention indexer (DSA: model_type deepseek_v32 reads it)", (None,))
             for k in ("index_topk", "index_n_heads", "index_head_dim")},
    irrelevant=("qk_head_dim", "aux_loss_alpha", "seq_aux", "ep_size"))


def _yarn_mscale(r: HFReader) -> float:
    """DeepSeek's YaRN softmax scale factor (0.1 mscale_all_dim ln(factor) + 1), 1 without YaRN."""
    spec = r.get("rope_scaling") or r.get("rope_parameters") or {}
    if not isinstance(spec, dict) or spec.get("rope_type", spec.get("type")) != "yarn":
        return 1.0
    factor, m = float(spec.get("factor", 1.0)), float(spec.get("mscale_all_dim", 0.0) or 0.0)
    return 0.1 * m * math.log(factor) + 1.0 if factor > 1 and m else 1.0


def latent_head_dim(r: HFReader) -> int:
    """Latent attention: a query/key head is nope + rope dims (the config's "head_dim" is rope's)."""
    return sum(r.size(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim"))


def _routing(r: HFReader) -> None:
    if r.get("moe_layer_freq", 1) != 1:
        r.refuse("moe_layer_freq", "is not modelled (only 1: every layer after the first dense ones)")
    if r.get("topk_method", "noaux_tc") not in ("noaux_tc",) or r.get("scoring_func", "sigmoid") != "sigmoid":
        r.refuse("topk_method" if r.get("topk_method", "noaux_tc") != "noaux_tc" else "scoring_func",
                 "is not modelled (DeepSeek-V3's sigmoid scores with noaux_tc group routing only)")


def read_deepseek_v3(r: HFReader) -> None:
    llama_like(r)
    if r.flag("attention_bias"):
        r.refuse("attention_bias")
    _routing(r)
    n = r.d["num_hidden_layers"]
    first = r.count("first_k_dense_replace", 0, 0)
    E = r.experts("n_routed_experts", "num_local_experts")
    inter = r.size("moe_intermediate_size")
    rope = r.size("qk_rope_head_dim")
    nope = r.size("qk_nope_head_dim")
    r.arch.update(
        n_experts=E, n_active=r.count("num_experts_per_tok", 8), moe_intermediate=inter, router="sigmoid_group",
        norm_topk=r.flag("norm_topk_prob", True),
        routed_scale=float_field(r.where, "routed_scaling_factor", r.get("routed_scaling_factor", 1.0)),
        n_group=r.count("n_group", 1), topk_group=r.count("topk_group", 1), router_correction=True,
        shared_intermediate=inter * r.count("n_shared_experts", 0, 0), dense_layers=tuple(range(min(first, n))),
        q_lora_rank=r.count("q_lora_rank", 0, 0), kv_lora_rank=r.size("kv_lora_rank"),
        qk_rope_dim=rope, qk_nope_dim=nope, v_head_dim=r.size("v_head_dim"),
        query_scale=(nope + rope) ** -0.5 * _yarn_mscale(r) ** 2, rope_interleave=r.flag("rope_interleave", True))
    r.arch["mtp_layers"] = r.count("num_nextn_predict_layers", 0, 0)
    if r.arch["mtp_layers"]:
        r.notes.append(f"num_nextn_predict_layers = {r.arch['mtp_layers']}: the multi-token-prediction layer is not "
                       "part of a step (not loaded; costed only as a draft: explain --spec K --mtp).")


register(Family("deepseek_v3", read_deepseek_v3, tensors=DEEPSEEK_TENSORS, head_dim=latent_head_dim, keys=DEEPSEEK_KEYS,
                aliases={"kimi_k2": "Kimi-K2 and K2-Thinking declare DeepseekV3ForCausalLM, and Kimi's deployment "
                                    "guide has vLLM and SGLang read them as deepseek_v3: the same architecture"},
                wrappers={"kimi_k25": {"what": "Kimi-K2.5, KimiK25ForConditionalGeneration",
                                       "tie_word_embeddings": False, "vision": (
                                           "image_token_id", "video_token_id", "vision_start_token_id",
                                           "vision_end_token_id", "projection_hidden_size",
                                           "projection_layer_norm_eps")}}, presets=(
    preset("deepseek-v3", 7168, 18432, 61, 128, 128, 129280, 163840, head_dim=192, rms_eps=1e-6, n_experts=256,
           n_active=8, moe_intermediate=2048, router="sigmoid_group", norm_topk=True, routed_scale=2.5, n_group=8,
           topk_group=4, router_correction=True, shared_intermediate=2048, dense_layers=(0, 1, 2), q_lora_rank=1536,
           kv_lora_rank=512, qk_rope_dim=64, qk_nope_dim=128, v_head_dim=128, rope_interleave=True, mtp_layers=1,
           query_scale=192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rope_yarn=(40.0, 32.0, 1.0, 4096, 1.0, True),
           quantization={"source": "quantization_config", "config": {
               "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}},
           source="deepseek-ai/DeepSeek-V3 (its only release: FP8, 128x128 weight blocks, 1x128 dynamic activation "
                  "groups; lm_head, router and embeddings bf16): MLA (q rank 1,536, kv rank 512, rope 64, nope 128, v 128); 256 routed "
                  "experts of 2,048, top-8 by sigmoid scores in 4 of 8 groups, x2.5, one shared expert; the first 3 "
                  "layers dense (18,432); one multi-token-prediction layer (num_nextn_predict_layers 1). YaRN RoPE "
                  "(x40; the softmax scale carries its mscale^2). Cost model only here: it fits no single GPU (671B)"),
    preset("kimi-k2", 7168, 18432, 61, 64, 64, 163840, 131072, head_dim=192, rope_theta=50000.0, rms_eps=1e-6,
           n_experts=384, n_active=8, moe_intermediate=2048, router="sigmoid_group", norm_topk=True,
           routed_scale=2.827, n_group=1, topk_group=1, router_correction=True, shared_intermediate=2048,
           dense_layers=(0,), q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64, qk_nope_dim=128, v_head_dim=128,
           rope_interleave=True, query_scale=192 ** -0.5 * (0.1 * math.log(32) + 1) ** 2,
           rope_yarn=(32.0, 1.0, 1.0, 4096, 1.0, True),
           quantization={"source": "quantization_config", "config": {
               "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}},
           source="moonshotai/Kimi-K2-Instruct (model_type kimi_k2: DeepSeek-V3's architecture; FP8 128x128 blocks): "
                  "64 heads of MLA, 384 routed experts of 2,048, top-8 in 1 group, x2.827, one shared expert, the "
                  "first layer dense; YaRN x32 (beta 1 / 1) over 4,096, RoPE base 50,000; vocab 163,840 (1.03T)"),
)))
