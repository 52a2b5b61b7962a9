"""Hy3 (Tencent HunYuan v3, ``model_type`` hy_v3): GQA with qk-norm (RMSNorm over each head's q and k before
RoPE, as Qwen3) and attention_bias on q/k/v/o; a dense MLP on the layers mlp_layer_types calls "dense" (the first
by default), routed experts elsewhere, chosen as DeepSeek-V3 without groups (sigmoid scores + a correction bias
to choose, the chosen sigmoid scores renormalised, x router_scaling_factor), plus num_shared_experts shared
experts (one MLP of moe_intermediate_size x their number). Its checkpoint keeps the router under mlp.router.gate,
the correction bias as mlp.expert_bias and the shared experts under mlp.shared_mlp."""

from __future__ import annotations

from ..config_fields import float_field
from ..errors import RooflineError
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .qwen3 import qwen3_attention
from .reader import HFReader, Keys
from .registry import Family, Tensors, register

# The hub's layout (save_pretrained writes it back from transformers' fused experts; vLLM's hy_v3 reads the same)
HY_V3_TENSORS = Tensors(moe=dict(router="mlp.router.gate.weight", correction="mlp.expert_bias",
                                 gate="mlp.experts.{e}.gate_proj.weight", up="mlp.experts.{e}.up_proj.weight",
                                 down="mlp.experts.{e}.down_proj.weight", shared="mlp.shared_mlp."))

# HYV3Config (transformers 5.24; num_local_experts is its attribute_map's name for num_experts), and the keys
# Tencent's own configs add, which transformers' model never reads (it always has qk-norm, sigmoid routing with
# the bias, renormalised top-k, and takes its dense layers from mlp_layer_types): each is refused where it says
# otherwise. enable_moe_fp32_combine (routed + shared summed in fp32, then cast) is the rounding a torch add of
# two bf16 tensors does anyway.
HY_V3_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(120832, 4096, 13312, 80, 64, 8, 131072, 1e-5, head_dim=128, theta=11158840.0), "attention_bias": False,
    "num_experts": None, "num_local_experts": None, "num_experts_per_tok": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 1536, "router_scaling_factor": 2.826, "mlp_layer_types": None,
    "first_k_dense_replace": None, "expert_hidden_dim": None, "num_nextn_predict_layers": None},
    numerics={"enable_lm_head_fp32": (False, "(the LM head in fp32, as Tencent's runtime; transformers' model and "
                                             "ours run it in the activation dtype)")},
    refused={"mlp_bias": ("biases on the MLPs (the shared experts' included)", (None, False)),
             "qk_norm": ("attention without qk-norm (transformers' Hy3 always normalises q and k)", (None, True)),
             "moe_router_use_sigmoid": ("softmax routing (transformers' Hy3 routes by sigmoid scores)", (None, True)),
             "moe_router_enable_expert_bias": ("routing without the correction bias (transformers' Hy3 always adds "
                                               "it)", (None, True)),
             "route_norm": ("a top-k left unnormalised (transformers' Hy3 always renormalises)", (None, True))},
    irrelevant=("enable_moe_fp32_combine", "enable_attention_fp32_softmax", "use_grouped_mm", "eod_token_id"))


def _dense_layers(r: HFReader) -> tuple:
    """The layers mlp_layer_types calls "dense" (absent: the first, as HYV3Config's default); Tencent's
    first_k_dense_replace, when given, must say the same."""
    n = r.d["num_hidden_layers"]
    kinds = r.get("mlp_layer_types", ["dense"] * min(n, 1) + ["sparse"] * max(n - 1, 0))
    if not isinstance(kinds, list) or any(k not in ("dense", "sparse") for k in kinds):
        r.refuse("mlp_layer_types", "is not modelled (a list of \"dense\" or \"sparse\", one per layer)")
    if len(kinds) != n:
        raise RooflineError(f"{r.where}: mlp_layer_types has {len(kinds)} entries for num_hidden_layers {n}: give "
                            "one per layer.")
    dense = tuple(i for i, k in enumerate(kinds) if k == "dense")
    first = r.d.get("first_k_dense_replace")
    if first is not None and dense != tuple(range(min(r.count("first_k_dense_replace", 1, 0), n))):
        r.refuse("first_k_dense_replace", f"disagrees with the dense layers {list(dense)} transformers builds "
                                          "from mlp_layer_types (absent: the first layer; it reads only those)")
    if len(dense) == n:
        r.refuse("mlp_layer_types", "has no sparse layer, which is not modelled as hy_v3")
    return dense


def read_hy_v3(r: HFReader) -> None:
    llama_like(r)
    qwen3_attention(r)
    inter = r.size("moe_intermediate_size")
    if r.get("expert_hidden_dim") not in (None, inter):
        r.refuse("expert_hidden_dim", f"disagrees with moe_intermediate_size {inter} (its legacy name)")
    shared = r.count("num_shared_experts", 1, 0)
    if not shared:
        r.refuse("num_shared_experts", "is not modelled (transformers 5.24 then builds a shared MLP of "
                                       "intermediate_size, HYV3MLP's fallback for a width of 0)")
    r.arch.update(
        n_experts=r.experts("num_experts", "num_local_experts"), n_active=r.count("num_experts_per_tok", 8),
        moe_intermediate=inter, router="sigmoid_group", norm_topk=True, router_correction=True,
        routed_scale=float_field(r.where, "router_scaling_factor", r.get("router_scaling_factor", 2.826)),
        shared_intermediate=inter * shared, dense_layers=_dense_layers(r))
    if r.get("num_nextn_predict_layers", 0):
        r.notes.append(f"num_nextn_predict_layers = {r.d['num_nextn_predict_layers']}: the multi-token-prediction "
                       "layer is not part of a step (not costed, not loaded).")


register(Family("hy_v3", read_hy_v3, tensors=HY_V3_TENSORS, keys=HY_V3_KEYS))
