"""DeepSeek-V4 (issue 32: ``deepseek_v4``) refused feature by feature: every key read as transformers' config class
knows it (legacy spellings included), the layers' attention and MLP types derived as transformers derives them,
each feature's own one-line refusal, the first one a config turns on raised naming the others, and an unknown key
refused before any feature."""

from __future__ import annotations

import json

import pytest

from roofline.errors import RooflineError
from roofline.families import family, read_hf_config, register
from roofline.families import registry
from roofline.families.deepseek_v4 import DEEPSEEK_V4_KEYS, layer_kinds, mlp_kinds
from roofline.families.reader import SHARED, Keys
from roofline.families.registry import Family, Refused, refused
from roofline.models import load_model

transformers = pytest.importorskip("transformers")

V4 = refused("deepseek_v4")
NAMES = ("compressed sparse attention", "heavily compressed attention", "shared key-value sliding attention",
         "the grouped output projection", "manifold-constrained hyper-connections", "hash routing",
         "sqrtsoftplus routing", "the clamped SwiGLU")
TINY = dict(model_type="deepseek_v4", vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32, n_routed_experts=8,
            num_experts_per_tok=2, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16,
            index_topk=4, hc_mult=2, hc_sinkhorn_iters=3, compress_rates={"compressed_sparse_attention": 2,
                                                                          "heavily_compressed_attention": 8})


def _filled(d: dict) -> dict:
    return (Keys(dict(SHARED)) + DEEPSEEK_V4_KEYS).filled(d)


def _refusal(d: dict, tmp_path) -> str:
    with pytest.raises(RooflineError) as e:
        read_hf_config(json.loads(json.dumps(d)), tmp_path / "config.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"model config {tmp_path / 'config.json'}: deepseek_v4: ")
    return msg


def test_each_feature_of_the_tiny_config_has_its_own_line():
    lines = V4.refusals(_filled(TINY))
    assert [f.name for f in V4.features] == list(NAMES) and len(lines) == 8
    assert all("\n" not in line and "which is not modelled yet: costing" in line for line in lines)
    csa, hca, window, grouped, hyper, hashed, scoring, clamp = lines
    assert csa.startswith("layer_types (absent: transformers' 2 HCA, then CSA / HCA) gives 2 of 6 layers compressed "
                          "sparse attention (every 2 tokens pooled into one KV entry of width 32 by a softmax gate "
                          "over an overlapping 4-token window, a lightning indexer of 2 heads x 16 keeping the top 4 "
                          "entries per query beside the sliding window)")
    assert hca.startswith("layer_types (absent: transformers' 2 HCA, then CSA / HCA) gives 4 of 6 layers heavily "
                          "compressed attention (every 8 tokens pooled into one KV entry")
    assert window.startswith("sliding_window = 8: every layer attends over a window of 8 keys of one shared key = "
                             "value head of width 32 (one cached tensor read as both) with a sink per head")
    assert grouped.startswith("o_groups = 2: the attention output is projected in 2 groups to o_lora_rank 16 each")
    assert hyper.startswith("hc_mult = 2: manifold-constrained hyper-connections keep 2 residual streams of hidden, "
                            "mixed around every attention and MLP block by a learned 2 x 2 matrix made doubly "
                            "stochastic by 3 Sinkhorn iterations")
    assert hashed.startswith("mlp_layer_types (absent: transformers' first 3 layers) gives 3 layers hash routing "
                             "(each token's 2 experts read from a fixed token-id table, tid2eid")
    assert scoring.startswith('scoring_func = "sqrtsoftplus": the router scores sqrt(softplus(logits)), keeps the '
                              "top 2 of score + e_score_correction_bias and weighs them by their scores renormalised "
                              "x 1.5")
    assert clamp.startswith("swiglu_limit = 10.0: every expert's and the shared expert's SwiGLU clamps the gate at "
                            "<= 10.0 and up to +-10.0")


def test_transformers_full_default_config_is_refused_by_its_first_feature_naming_the_others(tmp_path):
    d = transformers.AutoConfig.for_model("deepseek_v4").to_dict()
    msg = _refusal(d, tmp_path)
    assert "deepseek_v4: layer_types gives 20 of 43 layers compressed sparse attention (every 4 tokens pooled into " \
           "one KV entry of width 512 " in msg
    assert "a lightning indexer of 64 heads x 128 keeping the top 512 entries per query" in msg
    assert msg.endswith("; costs and logits would be wrong, so the model is refused. Also not modelled: "
                        + ", ".join(NAMES[1:]) + ".")
    # the same line from a config that gives only the sizes: what it leaves out is transformers' default
    sizes = {k: d[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
    assert _refusal(sizes, tmp_path) == msg.replace("layer_types gives", "layer_types (absent: transformers' 2 HCA, "
                                                    "then CSA / HCA) gives")


@pytest.mark.parametrize("extra, first, off", [
    ({"layer_types": ["sliding_attention"] * 6}, "sliding_window = 8:", NAMES[:2]),
    ({"layer_types": ["heavily_compressed_attention"] * 6}, "layer_types gives 6 of 6 layers heavily", NAMES[:1]),
    ({"compress_ratios": [0, 0, 128, 0, 128, 0, 4]}, "compress_ratios gives 2 of 6 layers heavily", NAMES[:1]),
    ({"mlp_layer_types": ["moe"] * 6, "scoring_func": "sigmoid"}, "layer_types (absent", NAMES[5:7]),
    ({"num_hash_layers": 0, "scoring_func": "softmax"}, "layer_types (absent", NAMES[5:7]),
])
def test_a_feature_the_config_leaves_off_is_not_said(extra, first, off, tmp_path):
    d = {**TINY, **extra}
    names = [f.name for f in V4.features if f.on(_filled(d))]
    assert set(names) == set(NAMES) - set(off)
    msg = _refusal(d, tmp_path)
    assert msg.split("deepseek_v4: ", 1)[1].startswith(first)
    assert msg.endswith(f"Also not modelled: {', '.join(names[1:])}.")


def test_the_legacy_keys_read_as_transformers_folds_them_in(tmp_path):
    d = {**TINY, "compress_ratios": [0, 4, 128, 4, 4, 0, 4], "compress_rate_csa": 16, "num_hash_layers": 1}
    lines = V4.refusals(_filled(d))
    assert lines[0].startswith("compress_ratios gives 3 of 6 layers compressed sparse attention (every 16 tokens "
                               "pooled into one KV entry of width 32 by a softmax gate over an overlapping 32-token")
    assert next(line for line in lines if "hash routing" in line).startswith("num_hash_layers = 1 gives 1 layers")
    c = transformers.DeepseekV4Config(**{k: v for k, v in d.items() if k != "model_type"})
    assert layer_kinds(_filled(d)) == c.layer_types and mlp_kinds(_filled(d)) == c.mlp_layer_types


@pytest.mark.parametrize("n", [1, 2, 3, 6, 43])
def test_the_layer_types_are_transformers(n):
    d = _filled({"model_type": "deepseek_v4", "num_hidden_layers": n})
    c = transformers.DeepseekV4Config(num_hidden_layers=n)
    assert (layer_kinds(d), mlp_kinds(d)) == (c.layer_types, c.mlp_layer_types)


def test_an_unknown_key_is_refused_before_any_feature(tmp_path):
    msg = _refusal({**TINY, "engram_layer_ids": [1]}, tmp_path)
    assert "deepseek_v4: engram_layer_ids = [1] (a list) is not a field roofline knows for deepseek_v4" in msg
    with pytest.raises(RooflineError, match="num_hidden_layers must be a positive integer"):
        read_hf_config({**TINY, "num_hidden_layers": "6"}, tmp_path / "config.json")


def test_a_published_config_s_spelling_reaches_the_features(tmp_path):
    """What published configs carry (the legacy keys, YaRN in rope_scaling, the two keys transformers never reads)."""
    d = {**TINY, "compress_ratios": [0, 0, 4, 128, 4, 128, 0], "num_hash_layers": 3, "qk_rope_head_dim": 8,
         "topk_method": "noaux_tc", "first_k_dense_replace": 0, "compress_rope_theta": 160000,
         "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256, "beta_fast": 32,
                          "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
         "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}, "expert_dtype": "fp4"}
    assert _refusal(d, tmp_path).split("deepseek_v4: ", 1)[1].startswith("compress_ratios gives 2 of 6 layers "
                                                                          "compressed sparse attention")
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(RooflineError, match=r"deepseek_v4: compress_ratios gives 2 of 6 layers compressed sparse"):
        load_model(tmp_path)


def test_the_type_alone_is_refused_naming_every_feature():
    with pytest.raises(RooflineError) as e:
        family("deepseek_v4", "here")
    assert str(e.value).startswith(f"here: model_type 'deepseek_v4' needs {', '.join(NAMES)}, which are not "
                                   "modelled yet: supported are llama, ")


def test_a_refused_model_type_is_never_also_a_family(monkeypatch):
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    monkeypatch.setattr(registry, "_REFUSED", dict(registry._REFUSED))
    with pytest.raises(ValueError, match="registered twice"):
        register(Family("deepseek_v4", lambda r: None))
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_refused(Refused("llama", Keys(), ()))


# DeepSeek-V4-Flash's config.json (transformers_version 4.57.1), as two public copies of it agree (a Rust crate's
# "OFFICIAL_CONFIG" with its sha256, a planner's V4_BASE_CONFIG trimmed): the legacy spellings, 44 compress_ratios
# for 43 layers (the tail is the MTP layer's), YaRN in rope_scaling
FLASH = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512,
    "hidden_act": "silu", "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512,
    "initializer_range": 0.02, "max_position_embeddings": 1048576, "model_type": "deepseek_v4",
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 64, "num_experts_per_tok": 6, "num_hidden_layers": 43, "num_hash_layers": 3,
    "num_key_value_heads": 1, "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024,
    "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                    "quant_method": "fp8", "scale_fmt": "ue8m0",
                                                    "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                                            "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
    "swiglu_limit": 10.0, "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": True, "vocab_size": 129280, "compress_rope_theta": 160000,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0]}


def test_deepseek_v4_flash_s_published_config_is_refused_by_its_features(tmp_path):
    d = _filled(FLASH)
    c = transformers.DeepseekV4Config(**{k: v for k, v in FLASH.items() if k not in (
        "model_type", "architectures", "torch_dtype", "transformers_version", "quantization_config")})
    assert layer_kinds(d) == c.layer_types and mlp_kinds(d) == c.mlp_layer_types
    assert [layer_kinds(d).count(t) for t in ("sliding_attention", "compressed_sparse_attention",
                                              "heavily_compressed_attention")] == [2, 21, 20]
    msg = _refusal(FLASH, tmp_path)
    assert msg.split("deepseek_v4: ", 1)[1].startswith("compress_ratios gives 21 of 43 layers compressed sparse "
                                                       "attention (every 4 tokens pooled")
    assert msg.endswith("Also not modelled: " + ", ".join(NAMES[1:]) + ".")
    assert "num_hash_layers = 3 gives 3 layers hash routing" in " ".join(V4.refusals(d))
    # its -0731 release adds DSpark's keys: not known here, so refused as such, naming the first
    dspark = {**FLASH, "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [40, 41, 42],
              "dspark_markov_rank": 256}
    assert "deepseek_v4: dspark_block_size = 5 (and 3 more: dspark_noise_token_id, dspark_target_layer_ids, " \
           "dspark_markov_rank) is not a field roofline knows for deepseek_v4" in _refusal(dspark, tmp_path)
