"""The model-family registry (issue 28): a family registered from outside the package is read, counted and
laid out like the built-in ones, and an unknown model_type is refused in one line naming the supported ones."""

from __future__ import annotations

import json

import pytest

from roofline.errors import RooflineError
from roofline.families import Family, Tensors, family, families, presets, read_hf_config, register, registry
from roofline.families.llama import LLAMA_LIKE_KEYS, llama_like
from roofline.families.reader import Keys
from roofline.layer import model_ops, model_params
from roofline.models import PRESETS, ModelConfig, load_model

BUILT_IN = ("llama, mistral, qwen2, qwen3, qwen3_vl_text, phi3, gemma, gemma2, gemma3_text, mixtral, qwen2_moe, "
            "qwen3_moe, qwen3_vl_moe_text, deepseek_v3, gpt_oss, smollm3, granite, glm4_moe, olmo2, minimax_m2, "
            "qwen3_next, qwen3_5_text, qwen3_5_moe_text, seed_oss, olmo3, exaone4, ernie4_5_moe, hy_v3, "
            "llama4_text, deepseek_v32, glm_moe_dsa, nemotron_h, granitemoehybrid, falcon_h1")

H, I, L, NH, NKV, V = 64, 96, 3, 4, 2, 256
TOY = dict(model_type="toy_llama", hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
           num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=512)


def read_toy(r) -> None:
    """A made-up family: a Llama whose q/k/v biases are switched by its own key."""
    llama_like(r)
    r.arch["qkv_bias"] = r.flag("toy_qkv_bias")


@pytest.fixture
def toy(monkeypatch):
    """Register the toy families for one test (the registry is put back afterwards)."""
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    keys = LLAMA_LIKE_KEYS + Keys({"toy_qkv_bias": False})      # every key it knows (any other is refused)
    register(Family("toy_llama", read_toy, keys=keys))
    register(Family("toy_fused", read_toy, tensors=Tensors(fused_qkv=True), keys=keys))


def write(tmp_path, **d):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


def llama_params(bias: bool) -> int:
    hd = H // NH
    attn = H * NH * hd + 2 * H * NKV * hd + NH * hd * H + ((NH + 2 * NKV) * hd if bias else 0)
    return V * H + L * (2 * H + attn + 3 * H * I) + H + H * V


def test_a_family_registered_from_a_test_file_loads_and_is_counted(toy, tmp_path):
    m = load_model(write(tmp_path, **TOY, toy_qkv_bias=True))
    assert (m.arch, m.hidden, m.n_layers, m.n_kv_heads, m.qkv_bias, m.o_bias) == ("toy_llama", H, L, NKV, True, False)
    assert model_params(m) == llama_params(bias=True)
    assert model_params(load_model(write(tmp_path, **TOY))) == llama_params(bias=False)
    # the same from a parsed config dict
    fields = read_hf_config(dict(TOY, toy_qkv_bias=True), tmp_path / "config.json")
    assert ModelConfig(**fields) == m


def test_the_toy_reader_refuses_like_the_llama_one(toy, tmp_path):
    with pytest.raises(RooflineError) as e:
        load_model(write(tmp_path, **TOY, partial_rotary_factor=0.5))
    msg = str(e.value)
    assert "\n" not in msg
    assert "toy_llama: partial_rotary_factor = 0.5 is not modelled (RoPE rotates every head dimension)" in msg
    with pytest.raises(RooflineError, match="toy_qkv_bias must be true or false"):
        load_model(write(tmp_path, **TOY, toy_qkv_bias="yes"))


def test_the_layer_takes_tensor_names_from_the_family(toy, tmp_path):
    def q_weight(mtype):
        m = load_model(write(tmp_path, **dict(TOY, model_type=mtype)))
        return next(o for o in model_ops(m) if o.name == "q_proj").weights[0]

    assert (q_weight("toy_llama").hf, q_weight("toy_llama").part) == ("self_attn.q_proj.weight", ())
    fused = q_weight("toy_fused")
    assert fused.hf == "self_attn.qkv_proj.weight" and fused.part[0] == 0


def test_an_unknown_model_type_is_refused_in_one_line_naming_the_supported_ones(tmp_path):
    with pytest.raises(RooflineError) as e:
        load_model(write(tmp_path, **dict(TOY, model_type="falcon")))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"model config {tmp_path / 'config.json'}: ")
    assert msg.endswith(f'model_type "falcon" (a string) is not supported: supported are {BUILT_IN}.')
    with pytest.raises(RooflineError) as e:
        family("dbrx", "here")
    assert str(e.value) == ("here: model_type 'dbrx' is a mixture of experts (or a hybrid), which is not modelled "
                            f"yet: supported are {BUILT_IN}.")
    with pytest.raises(RooflineError, match=r'model_type \["llama"\] \(a list\) is not supported'):
        family(["llama"], "here")


def test_a_registered_family_joins_the_supported_list(toy):
    with pytest.raises(RooflineError) as e:
        family("falcon", "here")
    assert str(e.value).endswith(f"supported are {BUILT_IN}, toy_llama, toy_fused.")


def test_a_model_type_registers_once(toy):
    with pytest.raises(ValueError, match="registered twice"):
        register(Family("toy_llama", read_toy))


def test_every_family_preset_is_a_preset_of_its_type_with_a_source():
    assert [f.model_type for f in families()] == BUILT_IN.split(", ")
    for mtype, p in presets():
        assert PRESETS[p.name].arch == mtype, p.name
        assert p.source, p.name
