"""MiniMax-M2 / M2.5 (issue 31): the published M2.5 config reads as the ``minimax-m2.5`` preset with
transformers' parameter count, and each field its reader cannot model exactly is refused in one line.

``PUBLISHED`` is MiniMaxAI/MiniMax-M2.5's config.json as two public copies give it (an Ascend msmodelslim
guide quoting it without its quantization_config; a Rust loader's pinned exact-M2.5 fixture with it: the
same values), ``auto_map`` left out (remote code: transformers has MiniMaxM2). The tiny real checkpoint's
parity, FLOPs and routing are in the MoE tests (tests/hf_tiny_moe.py)."""

from __future__ import annotations

import json

import pytest

from roofline.errors import RooflineError
from roofline.layer import model_params, op_names
from roofline.models import PRESETS, load_model

LAYERS = 62
PUBLISHED = {
    "architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1] * LAYERS, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 1536, "max_position_embeddings": 196608, "model_type": "minimax_m2",
    "mtp_transformer_layers": 1, "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": LAYERS,
    "num_key_value_heads": 8, "num_local_experts": 256, "num_mtp_modules": 3, "qk_norm_type": "per_layer",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                            "weight_block_size": [128, 128],
                            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]},
    "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid",
    "shared_intermediate_size": 0, "tie_word_embeddings": False, "transformers_version": "4.46.1", "use_cache": True,
    "use_mtp": True, "use_qk_norm": True, "use_routing_bias": True, "vocab_size": 200064, "torch_dtype": "bfloat16"}
PARAMS = 228_689_764_864     # transformers 5.24's MiniMaxM2ForCausalLM on the meta device (+ the correction biases)


def write(tmp_path, d: dict):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


def small(**over) -> dict:
    d = dict(PUBLISHED, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, rotary_dim=16, num_local_experts=8, num_experts_per_tok=2,
             vocab_size=256, max_position_embeddings=256, attn_type_list=[1, 1])
    d.pop("quantization_config")
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def test_the_published_config_reads_as_the_preset(tmp_path):
    m, p = load_model(write(tmp_path, PUBLISHED)), PRESETS["minimax-m2.5"]
    differ = [f for f in p.__dataclass_fields__ if f not in ("name", "notes") and getattr(p, f) != getattr(m, f)]
    assert differ == []
    assert (m.rotary_dim, m.qk_norm_whole, m.router, m.n_group, m.routed_scale, m.dense_layers) == \
        (64, True, "sigmoid_group", 1, 1.0, ())
    assert m.quantization.method == "fp8" and "e_score_correction_bias" in m.quantization.ignore
    assert any("num_mtp_modules = 3" in n for n in m.notes)
    assert model_params(m) == model_params(p) == PARAMS
    assert "shared_gate_proj" not in op_names(m) and "gate_proj" not in op_names(m)   # no shared / dense MLP


def test_the_parameter_count_is_transformers_on_the_meta_device():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "MiniMaxM2Config"):
        pytest.skip(f"transformers {transformers.__version__} has no MiniMaxM2Config")
    d = {k: v for k, v in PUBLISHED.items() if k != "quantization_config"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.MiniMaxM2Config(**d))
    theirs = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert theirs == PARAMS


@pytest.mark.parametrize("over, says", [
    (dict(attn_type_list=[0, 1]), r"attn_type_list = .* is not modelled .*lightning attention"),
    (dict(attn_type_list=[1]), r"attn_type_list = .* 1 for each of the 2 layers"),
    (dict(scoring_func="softmax"), r"scoring_func = \"softmax\" .*turns on softmax expert scores"),
    (dict(qk_norm_type="per_head"), r"qk_norm_type = \"per_head\" .*turns on a per-head qk-norm"),
    (dict(use_qk_norm=False), r"use_qk_norm = false .*turns on attention without qk-norm"),
    (dict(shared_intermediate_size=512), r"shared_intermediate_size = 512 .*turns on a shared expert"),
    (dict(rotary_dim=15), r"rotary_dim = 15 is not modelled \(an even number of dims"),
    (dict(rotary_dim=16, partial_rotary_factor=0.25), r"rotary_dim = 16 and partial_rotary_factor .* = 8\) disagree"),
    (dict(swa_rope_theta=10000.0), r"swa_rope_theta = 10000.0 is not a field roofline knows for minimax_m2"),
])
def test_what_is_not_modelled_is_refused_in_one_line(over, says, tmp_path):
    with pytest.raises(RooflineError, match=says) as e:
        load_model(write(tmp_path, small(**over)))
    assert "\n" not in str(e.value)


def test_partial_rotary_is_read_from_rotary_dim_or_the_factor(tmp_path):
    assert load_model(write(tmp_path, small())).rotary_dim == 16
    assert load_model(write(tmp_path, small(rotary_dim=None, partial_rotary_factor=0.5))).rotary_dim == 16
    assert load_model(write(tmp_path, small(rotary_dim=None, rope_parameters={
        "rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.25}))).rotary_dim == 8
    assert load_model(write(tmp_path, small(rotary_dim=32))).rotary_dim == 0          # every dim: 0
    assert load_model(write(tmp_path, small(rotary_dim=None))).rotary_dim == 0        # transformers' default


def test_no_routing_bias_and_no_mtp(tmp_path):
    m = load_model(write(tmp_path, small(use_routing_bias=False, use_mtp=False)))
    assert not m.router_correction and not any("mtp" in n for n in m.notes)


def test_whole_projection_qk_norm_is_not_split_under_tp(tmp_path):
    from roofline.parallel import shard

    m = load_model(write(tmp_path, small()))
    assert shard(m, 1).tp == 1
    with pytest.raises(RooflineError, match=r"--tp 2 cannot split .*qk-norm is over the whole q / k projection"):
        shard(m, 2)
