"""DeepSeek-V4 (``model_type`` deepseek_v4; transformers 5.24, configuration_deepseek_v4.py / modeling_deepseek_v4.py):
read key by key and refused feature by feature (``registry.Refused``), each feature not modelled yet in its own
line naming its config key, what it does and what costing it needs.

What transformers' model does, per layer (the maths the features below name):
- attention: q = RMSNorm(x W_q_a) W_q_b, then an unweighted RMSNorm per query head; one shared key = value head of
  head_dim (x W_kv, RMSNorm), RoPE on each head's trailing qk_rope_head_dim (interleaved pairs); every layer attends
  over its sliding window (the cache keeps sliding_window - 1 earlier tokens, one tensor read as keys and values)
  with a learned sink per head, the output's RoPE dims rotated back, then a grouped output projection (o_groups
  blocks of n_heads x head_dim / o_groups to o_lora_rank each, block-diagonal, then o_groups x o_lora_rank ->
  hidden);
- a compressed layer (layer_types, or the legacy compress_ratios 0 / 4 / 128) concatenates compressed entries to
  the window's keys: heavily compressed attention (HCA) pools every m' (128) tokens, x W_kv weighted by
  softmax(x W_gate + position_bias) over the window, RMSNorm, RoPE at the window's start, every later query seeing
  every closed entry; compressed sparse attention (CSA) pools every m (4) tokens over an overlapping 2m window (two
  series per token) and a lightning indexer (its own compressor at index_head_dim, index_n_heads queries from the q
  latent, sum_h w_h ReLU(q_h . k)) keeps the top index_topk entries per query;
- manifold-constrained hyper-connections (hc_mult streams of hidden): around attention and around the MLP, an
  unweighted RMSNorm of the hc_mult x hidden streams, one GEMM to (2 + hc_mult) x hc_mult mixing weights (pre and
  post by sigmoid, comb by softmax and hc_sinkhorn_iters Sinkhorn normalisations), the block's input collapsed by
  pre, its output spread by post and added to comb^T x the streams; a hyper head collapses them before the norm;
- the MLP: routed experts (scoring_func, sqrtsoftplus by default: sqrt(softplus(logits)), top-k of score + the
  correction bias, the chosen scores renormalised x routed_scaling_factor) and a shared expert, both SwiGLU with the
  gate clamped at swiglu_limit and up at +-swiglu_limit; the hash layers (mlp_layer_types "hash_moe", the legacy
  num_hash_layers: the first 3) take each token's experts from a fixed token-id table (tid2eid) instead of the
  top-k.

The keys: every key of transformers' DeepseekV4Config, the legacy ones its __post_init__ folds in (compress_ratios,
compress_rate_csa / _hca, num_hash_layers, qk_rope_head_dim, expert_dtype) and two that published configs carry
and transformers' model never reads (topk_method, first_k_dense_replace). "Modelled" here means what a reader
would read: the features refuse the model before any is.
"""

from __future__ import annotations

import json

from ..config_fields import show_value
from .reader import Keys
from .registry import Feature, Refused, register_refused

# transformers' DeepseekV4Config defaults (5.24)
DEEPSEEK_V4_KEYS = Keys(
    {"vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
     "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024,
     "num_experts_per_tok": 6, "n_routed_experts": 256, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
     "norm_topk_prob": True, "routed_scaling_factor": 1.5, "max_position_embeddings": 1048576,
     "rope_theta": 10000.0, "layer_types": None, "compress_rates": None, "compress_rope_theta": 160000.0,
     "hc_mult": 4, "hc_sinkhorn_iters": 20, "mlp_layer_types": None, "swiglu_limit": 10.0, "sliding_window": 128,
     "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
     "num_nextn_predict_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
     "partial_rotary_factor": None, "mlp_bias": False,
     # the legacy keys transformers folds in (published configs spell them so)
     "compress_ratios": None, "compress_rate_csa": None, "compress_rate_hca": None, "num_hash_layers": None,
     "qk_rope_head_dim": None, "expert_dtype": None},
    numerics={"hc_eps": (1e-6, "changes the floor of the hyper-connections' Sinkhorn normalisation")},
    # transformers' attention has no bias whatever attention_bias says; its model reads neither of the last two
    irrelevant=("attention_bias", "topk_method", "first_k_dense_replace"))

# transformers' __post_init__: the legacy per-layer compress_ratios -> layer_types
_RATIO_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"


def layer_kinds(d: dict) -> list:
    """Each layer's attention type as transformers derives it: layer_types, else compress_ratios (0 / 4 / 128),
    else two HCA layers then CSA and HCA in turn; cut to num_hidden_layers."""
    n = d["num_hidden_layers"]
    if isinstance(d.get("layer_types"), list):
        return list(d["layer_types"])[:n]
    if isinstance(d.get("compress_ratios"), list):
        return [_RATIO_TYPES.get(r, f"compress ratio {show_value(r)}") for r in d["compress_ratios"]][:n]
    return ([HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))])[:n]


def compress_rate(d: dict, kind: str) -> int:
    """The compression rate of ``kind`` (compress_rates, the legacy compress_rate_csa / _hca, else 4 / 128)."""
    rates = {CSA: 4, HCA: 128, **(d.get("compress_rates") or {})}
    legacy = d.get({CSA: "compress_rate_csa", HCA: "compress_rate_hca"}[kind])
    return legacy if legacy is not None else rates[kind]


def mlp_kinds(d: dict) -> list:
    """Each layer's MLP type: mlp_layer_types, else the first num_hash_layers (absent: 3) "hash_moe"."""
    n = d["num_hidden_layers"]
    if isinstance(d.get("mlp_layer_types"), list):
        return list(d["mlp_layer_types"])[:n]
    n_hash = d.get("num_hash_layers")
    n_hash = 3 if n_hash is None else n_hash
    return ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)


def _layer_key(d: dict) -> str:
    return "layer_types" if d.get("layer_types") is not None else "compress_ratios" \
        if d.get("compress_ratios") is not None else "layer_types (absent: transformers' 2 HCA, then CSA / HCA)"


def _csa(d: dict) -> str:
    m, n = compress_rate(d, CSA), layer_kinds(d).count(CSA)
    return (f"{_layer_key(d)} gives {n} of {d['num_hidden_layers']} layers compressed sparse attention (every {m} "
            f"tokens pooled into one KV entry of width {d['head_dim']} by a softmax gate over an overlapping "
            f"{2 * m}-token window, a lightning indexer of {d['index_n_heads']} heads x {d['index_head_dim']} "
            f"keeping the top {d['index_topk']} entries per query beside the sliding window), which is not modelled "
            "yet: costing it needs compressor and compressed-indexer op kinds and a cache of compressed entries "
            "beside the window's")


def _hca(d: dict) -> str:
    m, n = compress_rate(d, HCA), layer_kinds(d).count(HCA)
    return (f"{_layer_key(d)} gives {n} of {d['num_hidden_layers']} layers heavily compressed attention (every {m} "
            "tokens pooled into one KV entry that every later query attends to beside the sliding window), which is "
            "not modelled yet: costing it needs a compressor op kind and attention over the window plus every "
            "compressed entry")


def _window(d: dict) -> str:
    w = d["sliding_window"]
    return (f"sliding_window = {show_value(w)}: every layer attends over a window of {show_value(w)} keys of one "
            f"shared key = value head of width {d['head_dim']} (one cached tensor read as both) with a sink per "
            "head, an unweighted RMSNorm on each query head and the output's RoPE dims rotated back, which is not "
            "modelled yet: costing it needs a K = V cache layout and the output's inverse RoPE as an op")


def _grouped_o(d: dict) -> str:
    g, r = d["o_groups"], d["o_lora_rank"]
    return (f"o_groups = {show_value(g)}: the attention output is projected in {show_value(g)} groups to "
            f"o_lora_rank {show_value(r)} each (a block-diagonal o_a_proj), then to hidden by o_b_proj, which is "
            "not modelled yet: costing it needs a grouped-matmul op kind")


def _hyper(d: dict) -> str:
    n = d["hc_mult"]
    return (f"hc_mult = {show_value(n)}: manifold-constrained hyper-connections keep {show_value(n)} residual "
            f"streams of hidden, mixed around every attention and MLP block by a learned {show_value(n)} x "
            f"{show_value(n)} matrix made doubly stochastic by {show_value(d['hc_sinkhorn_iters'])} Sinkhorn "
            "iterations and collapsed by a hyper head before the final norm (transformers' DeepSeek-V4 has no "
            "setting without them), which is not modelled yet: costing them needs hyper-connection op kinds and a "
            "residual of hc_mult x hidden per token")


def _hash(d: dict) -> str:
    n = mlp_kinds(d).count("hash_moe")
    key = "mlp_layer_types" if d.get("mlp_layer_types") is not None else \
        f"num_hash_layers = {show_value(d['num_hash_layers'])}" if d.get("num_hash_layers") is not None else \
        "mlp_layer_types (absent: transformers' first 3 layers)"
    return (f"{key} gives {n} layers hash routing (each token's {show_value(d['num_experts_per_tok'])} experts "
            "read from a fixed token-id table, tid2eid, the router's scores only weighing them), which is not "
            "modelled yet: costing it needs a hash router kind (the gate GEMM and a table lookup, no top-k)")


def _scoring(d: dict) -> str:
    f = d["scoring_func"]
    what = "sqrt(softplus(logits))" if f == "sqrtsoftplus" else f"{json.dumps(f)}(logits)"
    return (f"scoring_func = {json.dumps(f)}: the router scores {what}, keeps the top "
            f"{show_value(d['num_experts_per_tok'])} of score + e_score_correction_bias and weighs them by their "
            f"scores renormalised x {show_value(d['routed_scaling_factor'])}, which is not modelled yet: costing it "
            "needs a router kind for it (DeepSeek's sigmoid_group with that score in place of the sigmoid)")


def _clamp(d: dict) -> str:
    lim = show_value(d["swiglu_limit"])
    return (f"swiglu_limit = {lim}: every expert's and the shared expert's SwiGLU clamps the gate at <= {lim} and "
            f"up to +-{lim} before SiLU(gate) x up, which is not modelled yet: costing it needs an expert activation "
            "kind for it (GPT-OSS's swiglu_oai also clamps, but scales by 1.702 and adds 1 to up)")


def _always(d: dict) -> bool:
    return True


FEATURES = (
    Feature("compressed sparse attention", lambda d: CSA in layer_kinds(d), _csa),
    Feature("heavily compressed attention", lambda d: HCA in layer_kinds(d), _hca),
    Feature("shared key-value sliding attention", _always, _window),
    Feature("the grouped output projection", _always, _grouped_o),
    Feature("manifold-constrained hyper-connections", _always, _hyper),
    Feature("hash routing", lambda d: "hash_moe" in mlp_kinds(d), _hash),
    Feature("sqrtsoftplus routing", lambda d: d["scoring_func"] not in ("softmax", "sigmoid"), _scoring),
    Feature("the clamped SwiGLU", _always, _clamp),
)

DEEPSEEK_V4 = register_refused(Refused("deepseek_v4", DEEPSEEK_V4_KEYS, FEATURES))
