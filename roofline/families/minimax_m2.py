"""MiniMax-M2 / M2.1 / M2.5 (``model_type`` minimax_m2): GQA without biases, qk-norm over the whole q and k
projections (one RMSNorm over all heads' features, before the split into heads: ``qk_norm_type`` "per_layer"),
RoPE on each head's first ``rotary_dim`` dims, and in every layer routed experts (no shared one, no dense layer)
chosen as DeepSeek-V3's with one group: sigmoid scores, the top-k of scores + e_score_correction_bias, weighted
by the un-biased scores renormalised to sum 1 (no scaling). Its checkpoint keeps the MoE under Mixtral's names
(block_sparse_moe.gate, block_sparse_moe.experts.N.w1 / w3 / w2: gate / up / down) plus
block_sparse_moe.e_score_correction_bias. Not split under --tp (its whole-projection qk-norm).

The routing is ``sigmoid_group`` with n_group 1, topk_group 1, norm_topk, routed_scale 1.0: the same choice and
weights as transformers' MiniMaxM2TopKRouter (one difference: the renormalisation's +1e-20, below fp32's
resolution for any sum of k sigmoids above 1e-13); ``formulas.routing`` counts the +1e-20 and the x1.0 (k + 1
FLOPs a token of the routing's, none of the GEMMs')."""

from __future__ import annotations

from ..errors import RooflineError
from .llama import LLAMA_LIKE_KEYS, llama_like, sizes
from .reader import HFReader, Keys, rotary_dim
from .registry import Family, Tensors, preset, register

MINIMAX_M2_TENSORS = Tensors(moe=dict(router="block_sparse_moe.gate.weight",
                                      correction="block_sparse_moe.e_score_correction_bias",
                                      gate="block_sparse_moe.experts.{e}.w1.weight",
                                      up="block_sparse_moe.experts.{e}.w3.weight",
                                      down="block_sparse_moe.experts.{e}.w2.weight"))

# MiniMaxM2Config (transformers 5.24: no attention bias, qk-norm always, its rotary_dim read as
# partial_rotary_factor = rotary_dim / head_dim), and the keys the published configs add (MiniMax's own
# configuration_minimax_m2.py: attn_type_list, qk_norm_type, scoring_func, use_routing_bias, the MTP modules),
# which transformers' model ignores; the experts' count (num_local_experts or num_experts) is not filled in.
MINIMAX_M2_KEYS = LLAMA_LIKE_KEYS + Keys({
    **sizes(200064, 3072, 1536, 62, 48, 8, 196608, 1e-6, head_dim=128, theta=5000000.0), "num_experts_per_tok": 8,
    "num_local_experts": None, "num_experts": None, "rotary_dim": None, "use_routing_bias": True,
    "attn_type_list": None, "use_mtp": None, "num_mtp_modules": None, "mtp_transformer_layers": None},
    refused={"use_qk_norm": ("attention without qk-norm (transformers' MiniMaxM2 always normalises q and k)",
                             (True, None)),
             "qk_norm_type": ("a per-head qk-norm (transformers' MiniMaxM2 normalises the whole projection)",
                              ("per_layer", None)),
             "scoring_func": ("softmax expert scores (MiniMax-M2 scores by sigmoid)", ("sigmoid", None)),
             "shared_intermediate_size": ("a shared expert (transformers' MiniMaxM2 has none)", (0, None))})


def _rotary_dim(r: HFReader, head_dim: int) -> int:
    """rotary_dim (the published configs), or partial_rotary_factor x head_dim (transformers writes both); the two
    must agree. Absent: every dim (transformers' default factor 1.0). 0 when RoPE rotates all of head_dim."""
    params = r.d.get("rope_parameters") if isinstance(r.d.get("rope_parameters"), dict) else {}
    factor = r.d.get("partial_rotary_factor") is not None or params.get("partial_rotary_factor") is not None
    rd = r.d.get("rotary_dim")
    if rd is None:
        return rotary_dim(r, head_dim, 1.0)
    rd = r.count("rotary_dim", head_dim)
    if rd % 2 or rd > head_dim:
        r.refuse("rotary_dim", f"is not modelled (an even number of dims, at most head_dim {head_dim}): fix it")
    from_factor = (rotary_dim(r, head_dim, 1.0) or head_dim) if factor else rd
    if from_factor != rd:
        raise RooflineError(f"{r.where}: minimax_m2: rotary_dim = {rd} and partial_rotary_factor (x head_dim "
                            f"{head_dim} = {from_factor}) disagree: give one, or make them agree.")
    return 0 if rd == head_dim else rd


def read_minimax_m2(r: HFReader) -> None:
    llama_like(r, partial_rotary=True)
    n = r.d["num_hidden_layers"]
    kinds = r.d.get("attn_type_list")
    if kinds is not None and (not isinstance(kinds, list) or len(kinds) != n or any(k != 1 for k in kinds)):
        r.refuse("attn_type_list", f"is not modelled (only softmax attention in every layer: 1 for each of the {n} "
                                   "layers; 0 is MiniMax-M1's lightning attention)")
    hd = r.d.get("head_dim") or r.d["hidden_size"] // r.d["num_attention_heads"]
    r.arch.update(
        qk_norm=True, qk_norm_whole=True, rotary_dim=_rotary_dim(r, hd),
        n_experts=r.experts("num_local_experts", "num_experts"), n_active=r.count("num_experts_per_tok", 8),
        moe_intermediate=r.d["intermediate_size"], router="sigmoid_group", norm_topk=True, routed_scale=1.0,
        n_group=1, topk_group=1, router_correction=r.flag("use_routing_bias", True))
    mtp = r.get("num_mtp_modules", 0) if r.flag("use_mtp", bool(r.get("num_mtp_modules", 0))) else 0
    if mtp:
        r.notes.append(f"num_mtp_modules = {mtp} (use_mtp): the multi-token-prediction modules are not part of a "
                       "step (not costed, not loaded).")


# The published checkpoint's quantization_config: FP8 e4m3 in 128x128 blocks, dynamic activations; the router,
# its correction bias and lm_head stay as stored (bf16 / fp32).
_FP8 = {"source": "quantization_config", "config": {
    "activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}}

register(Family("minimax_m2", read_minimax_m2, tensors=MINIMAX_M2_TENSORS, keys=MINIMAX_M2_KEYS, presets=(
    preset("minimax-m2.5", 3072, 1536, 62, 48, 8, 200064, 196608, head_dim=128, rope_theta=5000000.0,
           rms_eps=1e-6, qk_norm=True, qk_norm_whole=True, rotary_dim=64, n_experts=256, n_active=8,
           moe_intermediate=1536, router="sigmoid_group", norm_topk=True, n_group=1, topk_group=1,
           router_correction=True, quantization=_FP8,
           source="MiniMaxAI/MiniMax-M2.5's config.json (read in two public copies that agree: an Ascend "
                  "msmodelslim W8A8C16 guide quoting it without its quantization_config, and a Rust loader's "
                  "pinned exact-M2.5 fixture with it; the hub file itself not read): 62 layers, 48 heads / 8 KV "
                  "of 128 (q 6,144 wide on hidden 3,072), qk-norm over the whole projections, rotary_dim 64, "
                  "256 experts of 1,536, top-8, sigmoid + correction bias, no shared expert; FP8 e4m3 128x128 "
                  "blocks (228.7B parameters, transformers' count on the meta device); its 3 MTP modules are "
                  "not part of a step (not costed)"),
)))
