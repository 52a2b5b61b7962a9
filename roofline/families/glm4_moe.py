"""GLM-4.5 / 4.6 / 4.7 (``model_type`` glm4_moe): GQA with q/k/v biases (attention_bias) and optional qk-norm
(use_qk_norm), RoPE on each head's first partial_rotary_factor of dims, the first first_k_dense_replace layers
dense, then routed experts chosen as DeepSeek-V3's (sigmoid scores, a correction bias, groups, renormalised,
x routed_scaling_factor) plus n_shared_experts shared experts. Its checkpoint keeps the MoE under DeepSeek's
names."""

from __future__ import annotations

from ..config_fields import float_field
from .deepseek_v3 import DEEPSEEK_TENSORS
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys, rotary_dim
from .registry import Family, register

# Glm4MoeConfig (transformers 5.24); the published configs (4.x) say partial_rotary_factor at the top level
GLM4_MOE_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(151552, 4096, 10944, 46, 96, 8, 131072, 1e-5), "attention_bias": False, "use_qk_norm": False,
    "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": None,
    "num_local_experts": None, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": None})


def read_glm4_moe(r: HFReader) -> None:
    llama_like(r, partial_rotary=True)
    n = r.d["num_hidden_layers"]
    hd = r.d.get("head_dim") or r.d["hidden_size"] // r.d["num_attention_heads"]
    inter = r.size("moe_intermediate_size")
    first = r.count("first_k_dense_replace", 1, 0)
    r.arch.update(
        qkv_bias=r.flag("attention_bias"), qk_norm=r.flag("use_qk_norm"), rotary_dim=rotary_dim(r, hd, 0.5),
        n_experts=r.experts("n_routed_experts", "num_local_experts"), n_active=r.count("num_experts_per_tok", 8),
        moe_intermediate=inter, router="sigmoid_group", norm_topk=r.flag("norm_topk_prob", True),
        routed_scale=float_field(r.where, "routed_scaling_factor", r.get("routed_scaling_factor", 1.0)),
        n_group=r.count("n_group", 1), topk_group=r.count("topk_group", 1), router_correction=True,
        shared_intermediate=inter * r.count("n_shared_experts", 1, 0), dense_layers=tuple(range(min(first, n))))
    r.arch["mtp_layers"] = r.count("num_nextn_predict_layers", 0, 0)
    if r.arch["mtp_layers"]:
        r.notes.append(f"num_nextn_predict_layers = {r.arch['mtp_layers']}: the multi-token-prediction layer is not "
                       "part of a step (not loaded; costed only as a draft: explain --spec K --mtp).")


register(Family("glm4_moe", read_glm4_moe, tensors=DEEPSEEK_TENSORS, keys=GLM4_MOE_KEYS))
