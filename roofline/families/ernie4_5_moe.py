"""ERNIE-4.5 MoE (``model_type`` ernie4_5_moe): GQA with RoPE on interleaved pairs (each head's dims 2i, 2i+1
rotate together: loaded de-interleaved, ``rope_interleave``), no biases, tied embeddings by default; routed
experts on the layers from moe_layer_start_index to moe_layer_end_index every moe_layer_interval (dense MLPs of
intermediate_size elsewhere), chosen by softmax scores plus a correction bias (moe_statics.e_score_correction_bias,
used to choose, not to weigh), the k chosen softmax scores renormalised; moe_num_shared_experts shared experts
(one MLP of moe_intermediate_size x their number)."""

from __future__ import annotations

from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys
from .registry import Family, Tensors, register

# The hub's layout (save_pretrained writes it; transformers 5.24 fuses the experts at load): per-expert 2-D
# weights, the router's fp32 gate, the correction bias as a [1, E] tensor under moe_statics.
ERNIE_MOE_TENSORS = Tensors(moe=dict(router="mlp.gate.weight", correction="mlp.moe_statics.e_score_correction_bias",
                                     gate="mlp.experts.{e}.gate_proj.weight", up="mlp.experts.{e}.up_proj.weight",
                                     down="mlp.experts.{e}.down_proj.weight", shared="mlp.shared_experts."))

# Ernie4_5_MoeConfig (transformers 5.24; num_experts / num_experts_per_tok are its attribute_map's names for
# moe_num_experts / moe_k: read under either name, so neither is filled in; the experts' count, as every family's,
# must be given; moe_k defaults to 6). Its modelling skips the multi-token-prediction layers ("mtp") at load.
ERNIE_MOE_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(103424, 2560, 12288, 28, 20, 4, 131072, 1e-5, tie=True, theta=500000.0), "moe_intermediate_size": 1536,
    "moe_k": None, "num_experts_per_tok": None, "moe_num_experts": None, "num_experts": None,
    "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1,
    "num_nextn_predict_layers": None},
    numerics={"moe_norm_min": (1e-12, "(the floor of the routing weights' sum; ours divides by the sum itself)")},
    refused={"use_bias": ("biases on every projection, the shared experts and the LM head", (None, False))})


def _moe_layers(r: HFReader) -> tuple:
    """transformers' rule: layer i routes when (i + 1) % moe_layer_interval == 0 and start <= i <= end (end -1:
    the last layer)."""
    n = r.d["num_hidden_layers"]
    start = r.count("moe_layer_start_index", 1, 0)
    end = r.get("moe_layer_end_index", -1)
    end = n - 1 if end == -1 else r.count("moe_layer_end_index", n - 1, 0)
    step = r.count("moe_layer_interval", 1)
    return tuple(i for i in range(n) if (i + 1) % step == 0 and start <= i <= end)


def read_ernie4_5_moe(r: HFReader) -> None:
    llama_like(r)
    n = r.d["num_hidden_layers"]
    inter = r.size("moe_intermediate_size")
    moe = _moe_layers(r)
    if not moe:
        r.refuse("moe_layer_start_index", f"leaves none of the {n} layers with experts (with moe_layer_end_index "
                                          "and moe_layer_interval), which is not modelled as ernie4_5_moe")
    r.arch.update(
        n_experts=r.experts("moe_num_experts", "num_experts"),
        n_active=r.count("moe_k" if r.get("moe_k") is not None else "num_experts_per_tok", 6),
        moe_intermediate=inter, router="softmax_topk", norm_topk=True, router_correction=True, rope_interleave=True,
        shared_intermediate=inter * r.count("moe_num_shared_experts", 2, 0),
        dense_layers=tuple(i for i in range(n) if i not in moe))
    if r.get("num_nextn_predict_layers", 0):
        r.notes.append(f"num_nextn_predict_layers = {r.d['num_nextn_predict_layers']}: the multi-token-prediction "
                       "layer is not part of a step (not costed, not loaded).")


register(Family("ernie4_5_moe", read_ernie4_5_moe, tensors=ERNIE_MOE_TENSORS, keys=ERNIE_MOE_KEYS))
