"""Strict config keys against transformers' own config classes (issue 31): every attribute of the config class of
every supported model_type is classified by its family's ``Keys`` (modelled, numerics-only, refused, irrelevant),
the defaults the families fill in are transformers', and a config that leaves every key but the sizes out reads
as transformers' full default config does. A transformers upgrade that adds a field fails here."""

from __future__ import annotations

import inspect
import json

import pytest

from roofline.families import families, read_hf_config
from roofline.families.reader import IRRELEVANT, SHARED, Keys
from roofline.models import ModelConfig

transformers = pytest.importorskip("transformers")

REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# model_types registered here that transformers names otherwise (none today: each family is a transformers type)
TYPES = tuple(f.model_type for f in families())


def _keys(mtype) -> Keys:
    return Keys(dict(SHARED)) + next(f for f in families() if f.model_type == mtype).keys


def _transformers_config(mtype):
    return transformers.AutoConfig.for_model(mtype)


def _signature_default(cls, key):
    p = inspect.signature(cls.__init__).parameters.get(key)
    return inspect.Parameter.empty if p is None else p.default


@pytest.mark.parametrize("mtype", TYPES)
def test_every_attribute_of_transformers_config_class_is_classified(mtype):
    d = _transformers_config(mtype).to_dict()
    known = _keys(mtype).known()
    unclassified = sorted(k for k in d if k not in known)
    assert not unclassified, f"{mtype}: transformers {transformers.__version__} has {unclassified}: classify them"


@pytest.mark.parametrize("mtype", TYPES)
def test_the_defaults_filled_in_are_transformers(mtype):
    c = _transformers_config(mtype)
    d = c.to_dict()
    keys = _keys(mtype)
    for k, ours in keys.modelled.items():
        if ours is None:
            continue
        if k == "rope_theta":
            rp = d["rope_parameters"]
            theirs = (rp.get("full_attention") or rp)["rope_theta"]
        elif k == "rope_parameters":
            theirs = d[k]
        else:
            theirs = _signature_default(type(c), k)
            if theirs is inspect.Parameter.empty:
                theirs = d.get(k, getattr(c, k, inspect.Parameter.empty))
            if theirs is inspect.Parameter.empty:
                continue            # a key of the published configs this class does not have (pretraining_tp)
        assert ours == theirs, f"{mtype}: {k} default {ours!r}, transformers {theirs!r}"
    for k, (default, _) in keys.numerics.items():
        if k in d:
            assert default == d[k], f"{mtype}: {k}"


SPARSE_GAPS: dict = {}       # model_type -> fields a sparse config reads otherwise (none)


@pytest.mark.parametrize("mtype", TYPES)
def test_a_config_of_only_the_sizes_reads_as_transformers_full_default_config(mtype, tmp_path):
    """What a config leaves out is transformers' default: the same model as the one it writes out in full."""
    d = _transformers_config(mtype).to_dict()
    if d["hidden_size"] % d["num_attention_heads"]:     # no head_dim: give one (a multiple of 4) to both
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"] // 4 * 4
    full = ModelConfig(**read_hf_config(json.loads(json.dumps(d)), tmp_path / "config.json"))
    sparse_d = {"model_type": mtype, **{k: d[k] for k in REQUIRED if k in d}}   # Qwen3.5-MoE has no intermediate_size
    for k in ("num_experts", "num_local_experts", "n_routed_experts"):   # the experts' count is never filled in
        if k in d:
            sparse_d[k] = d[k]
    if d["hidden_size"] % d["num_attention_heads"]:     # Glm4MoeConfig's 4096 / 96: transformers floors, we refuse
        sparse_d["head_dim"] = d["head_dim"]
    sparse = ModelConfig(**read_hf_config(sparse_d, tmp_path / "config.json"))
    diff = {f: (getattr(full, f), getattr(sparse, f)) for f in full.__dataclass_fields__
            if f not in ("notes", "name") and getattr(full, f) != getattr(sparse, f)}
    assert set(diff) == SPARSE_GAPS.get(mtype, set()), diff


def test_irrelevant_keys_are_not_also_modelled():
    for f in families():
        assert not set(f.keys.modelled) & set(IRRELEVANT), f.model_type


def _tiny_modules():
    import hf_tiny
    import hf_tiny_moe
    return [(hf_tiny, mt) for mt in hf_tiny.MODEL_TYPES] + [(hf_tiny_moe, mt) for mt in hf_tiny_moe.MODEL_TYPES]


@pytest.mark.parametrize("module, mtype", _tiny_modules(), ids=[mt for _, mt in _tiny_modules()])
def test_parameter_count_equals_transformers_on_the_meta_device(module, mtype, tmp_path):
    """Every supported type (the new ones: smollm3, granite, glm4_moe) counts transformers' parameters exactly."""
    torch = pytest.importorskip("torch")
    from roofline.layer import model_params
    from roofline.models import load_model

    cfg = module.tiny_config(mtype)
    cfg.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    theirs = sum(p.numel() for p in model.parameters()) + sum(  # DeepSeek's / GLM's correction bias: a buffer
        b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert model_params(load_model(tmp_path)) == theirs
