"""DeepSeek-V3.2 (``model_type`` deepseek_v32) and GLM-5 (glm_moe_dsa): DeepSeek-V3's latent attention and routed
experts (``families.deepseek_v3``), every layer's MLA attending to the ``index_topk`` tokens a lightning indexer
selects (DeepSeek Sparse Attention; transformers 5.24, modeling_deepseek_v32.py / modeling_glm_moe_dsa.py).

The indexer (``ModelConfig.index_*``, ``roofline.layer``'s indexer ops, ``roofline.formulas.dsa``): wq_b from the
q latent (index_n_heads x index_head_dim), wk and a LayerNorm (one key per token), RoPE on the first
qk_rope_head_dim of each (half-split for DeepSeek-V3.2, interleaved for GLM-5: numerics only, the same cost), the
weighted ReLU scores over every earlier key and their top-k. GLM-5's ``indexer_types`` (or, absent,
index_topk_pattern / index_topk_freq and index_skip_topk_offset, as transformers derives it) marks "shared"
layers, which run no indexer and attend to the previous indexer's selection (``index_shared``).
``mlp_layer_types`` (dense / sparse per layer) says which layers route, else the first first_k_dense_replace
are dense. transformers' eager and sdpa paths attend densely under a mask that keeps the top-k; the costs are
the gathered top-k's (``formulas.dsa``'s conventions).
"""

from __future__ import annotations

import math

from ..errors import RooflineError
from .deepseek_v3 import DEEPSEEK_KEYS, DEEPSEEK_TENSORS, latent_head_dim, read_deepseek_v3
from .llama import sizes
from .reader import HFReader, Keys
from .registry import Family, preset, register

_INDEX = ("index_topk", "index_n_heads", "index_head_dim")
_DSA_KEYS = Keys({k: v for k, v in DEEPSEEK_KEYS.modelled.items()}, dict(DEEPSEEK_KEYS.numerics),
                 {k: v for k, v in DEEPSEEK_KEYS.refused.items() if k not in _INDEX}, DEEPSEEK_KEYS.irrelevant) + Keys(
    {"index_topk": 2048, "index_head_dim": 128, "mlp_layer_types": None, "layer_types": None},
    refused={"rope_interleave": ("MLA RoPE on half-split dims (transformers' DeepSeek-V3.2 and GLM-5 always "
                                 "interleave)", (None, True))},
    # transformers' MLP of these two has no bias, whatever mlp_bias says
    irrelevant=("mlp_bias",))
# DeepseekV32Config (transformers 5.24)
DEEPSEEK_V32_KEYS = _DSA_KEYS + Keys(
    {**sizes(129280, 7168, 18432, 61, 128, 128, 163840, 1e-6), "index_n_heads": 64},
    numerics={"indexer_rope_interleave": (False, "rotates the indexer's RoPE dims interleaved instead of half-split "
                                                 "(transformers' DeepSeek-V3.2 always half-splits)")})
# GlmMoeDsaConfig (transformers 5.24), and what GLM-5's published configs add: the indexer's schedule (its
# __post_init__ reads index_topk_pattern, index_topk_freq and index_skip_topk_offset from them), its interleaved
# RoPE, MTP's reuse of the selection (not part of a step)
GLM_MOE_DSA_KEYS = _DSA_KEYS + Keys({
    **sizes(154880, 6144, 12288, 78, 64, 64, 202752, 1e-5), "index_n_heads": 32, "q_lora_rank": 2048,
    "qk_nope_head_dim": 192, "v_head_dim": 256, "n_group": 1, "topk_group": 1, "indexer_types": None,
    "index_topk_pattern": None, "index_topk_freq": None, "index_skip_topk_offset": None},
    numerics={"indexer_rope_interleave": (True, "rotates the indexer's RoPE dims half-split instead of interleaved "
                                                "(transformers' GLM-5 always interleaves)")},
    irrelevant=("index_share_for_mtp_iteration",))


def _layer_lists(r: HFReader, key: str, kinds: tuple, v=None) -> list | None:
    """A per-layer list of ``kinds`` under ``key`` (``v`` when given: what it derives to; None when absent), one
    entry per layer, else refused."""
    v = r.d.get(key) if v is None else v
    if v is None:
        return None
    if not isinstance(v, list) or any(t not in kinds for t in v):
        r.refuse(key, f"is not modelled (supported: {', '.join(kinds)} per layer)")
    if len(v) != r.d["num_hidden_layers"]:
        raise RooflineError(f"{r.where}: {key} has {len(v)} entries for num_hidden_layers "
                            f"{r.d['num_hidden_layers']}: give one per layer.")
    return v


def _dsa(r: HFReader) -> None:
    """DeepSeek-V3's reading, then what DSA adds: the indexer's sizes, every layer indexed, the dense MLPs."""
    read_deepseek_v3(r)
    _layer_lists(r, "layer_types", ("indexed_attention",))
    mlp = _layer_lists(r, "mlp_layer_types", ("dense", "sparse"))
    if mlp is not None:
        r.arch["dense_layers"] = tuple(i for i, t in enumerate(mlp) if t == "dense")
    if not r.arch["q_lora_rank"]:
        r.refuse("q_lora_rank", "is not modelled without a q latent (the indexer's query reads it)")
    r.arch.update(index_topk=r.count("index_topk", 2048), index_n_heads=r.size("index_n_heads"),
                  index_head_dim=r.count("index_head_dim", 128))
    if r.arch["index_head_dim"] < r.arch["qk_rope_dim"]:
        r.refuse("index_head_dim", f"is narrower than qk_rope_head_dim {r.arch['qk_rope_dim']} (the indexer's RoPE "
                                   "dims)")


def read_deepseek_v32(r: HFReader) -> None:
    _dsa(r)


def _indexer_types(r: HFReader) -> list:
    """"full" or "shared" per layer: indexer_types, else index_topk_pattern ("F"/"S" per layer, or a list), else
    every index_topk_freq-th layer from index_skip_topk_offset - 1 on (transformers' GlmMoeDsaConfig)."""
    n = r.d["num_hidden_layers"]
    types = _layer_lists(r, "indexer_types", ("full", "shared"))
    if types is not None:
        return types
    pattern = r.d.get("index_topk_pattern")
    if pattern is not None:
        if isinstance(pattern, str):
            if set(pattern) - set("FS"):
                r.refuse("index_topk_pattern", "is not modelled (supported: F or S per layer)")
            pattern = [{"F": "full", "S": "shared"}[c] for c in pattern]
        return _layer_lists(r, "index_topk_pattern", ("full", "shared"), pattern)
    freq = max(r.count("index_topk_freq", 1), 1)
    offset = r.count("index_skip_topk_offset", 2, 0)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]


def read_glm_moe_dsa(r: HFReader) -> None:
    _dsa(r)
    types = _indexer_types(r)
    if types[0] != "full":
        r.refuse("indexer_types", "starts with a shared layer (transformers needs a full indexer before any shared "
                                  "one)")
    r.arch["index_shared"] = tuple(i for i, t in enumerate(types) if t == "shared")
    r.arch["index_rope_interleave"] = True       # transformers' GlmMoeDsaIndexer: apply_rotary_pos_emb_interleave


_CITED = " (tests/data/hf_configs/hybrid/, its README citing the public copies it was read from)"

register(Family("deepseek_v32", read_deepseek_v32, tensors=DEEPSEEK_TENSORS, head_dim=latent_head_dim,
                keys=DEEPSEEK_V32_KEYS, presets=(
    preset("deepseek-v3.2", 7168, 18432, 61, 128, 128, 129280, 163840, head_dim=192, rms_eps=1e-6, n_experts=256,
           n_active=8, moe_intermediate=2048, router="sigmoid_group", routed_scale=2.5, n_group=8, topk_group=4,
           router_correction=True, shared_intermediate=2048, dense_layers=(0, 1, 2), q_lora_rank=1536,
           kv_lora_rank=512, qk_rope_dim=64, qk_nope_dim=128, v_head_dim=128, rope_interleave=True, mtp_layers=1,
           query_scale=192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rope_yarn=(40.0, 32.0, 1.0, 4096, 1.0, True),
           index_topk=2048, index_n_heads=64, index_head_dim=128,
           quantization={"source": "quantization_config", "config": {
               "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
               "weight_block_size": [128, 128]}},
           source="deepseek-ai/DeepSeek-V3.2's config.json" + _CITED + ": DeepSeek-V3's MLA and experts (FP8 "
                  "128x128 blocks, UE8M0 scales) with a lightning indexer on every layer (64 heads of 128) choosing "
                  "2,048 tokens for MLA; 671.88B parameters (transformers' count), its MTP layer not part of a step"),
)))
register(Family("glm_moe_dsa", read_glm_moe_dsa, tensors=DEEPSEEK_TENSORS, head_dim=latent_head_dim,
                keys=GLM_MOE_DSA_KEYS, presets=(
    preset("glm-5", 6144, 12288, 78, 64, 64, 154880, 202752, head_dim=256, rope_theta=1e6, n_experts=256,
           n_active=8, moe_intermediate=2048, router="sigmoid_group", routed_scale=2.5, router_correction=True,
           shared_intermediate=2048, dense_layers=(0, 1, 2), q_lora_rank=2048, kv_lora_rank=512, qk_rope_dim=64,
           qk_nope_dim=192, v_head_dim=256, rope_interleave=True, mtp_layers=1, query_scale=256 ** -0.5,
           index_topk=2048, index_n_heads=32, index_head_dim=128, index_rope_interleave=True,
           source="zai-org/GLM-5's config.json" + _CITED + ": 78 layers of MLA (64 heads, q rank 2,048, nope 192, "
                  "v 256) each with its indexer (32 heads of 128, every layer full), 2,048 tokens chosen; 256 "
                  "experts of 2,048, top-8 in one group, x2.5, a shared expert, the first 3 layers dense; 743.91B "
                  "parameters (transformers' count), its MTP layer not part of a step"),
)))
