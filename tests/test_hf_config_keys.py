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


_OLMO3 = dict(model_type="olmo3", hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=65536)
_OLMO3_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "beta_fast": 32,
               "beta_slow": 1, "attention_factor": 1.2079441541679836}


def _read(d, tmp_path):
    return ModelConfig(**read_hf_config(json.loads(json.dumps(d)), tmp_path / "config.json"))


def test_olmo3_as_4x_writes_it_reads_as_transformers_5_does(tmp_path):
    """A 4.57 config (rope_theta + rope_scaling at the top, as the published ones): the scaling is the full
    layers' alone, every 4th layer full without layer_types, and the same model as 5.24's own spelling."""
    d = {**_OLMO3, "rope_theta": 500000.0, "rope_scaling": dict(_OLMO3_YARN), "sliding_window": 4096}
    m = _read(d, tmp_path)
    assert m.layer_types == ("sliding", "sliding", "sliding", "full") * 2 and m.sliding_window == 4096
    assert (m.rope_theta, m.rope_local_theta) == (500000.0, 500000.0)
    assert m.rope_yarn == (8.0, 32.0, 1.0, 8192, 1.2079441541679836, True) and m.notes == ()
    theirs = transformers.Olmo3Config(**{k: v for k, v in d.items() if k != "model_type"}).to_dict()
    assert theirs["rope_parameters"]["sliding_attention"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert _read(theirs, tmp_path) == m


def test_olmo3_refuses_what_transformers_and_vllm_read_apart(tmp_path):
    from roofline.errors import RooflineError

    with pytest.raises(RooflineError, match=r"olmo3: rope_theta = 10000.0 with no base for the sliding layers is "
                                            r"not modelled: transformers 5.24 rotates them at 500000"):
        _read({**_OLMO3, "rope_theta": 10000.0}, tmp_path)
    with pytest.raises(RooflineError, match=r"rope_parameters = .* is not keyed by layer type"):
        _read({**_OLMO3, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, tmp_path)
    with pytest.raises(RooflineError, match=r"gives the sliding layers YaRN"):
        _read({**_OLMO3, "rope_parameters": {"full_attention": {"rope_theta": 5e5},
                                             "sliding_attention": {"rope_theta": 5e5, **_OLMO3_YARN}}}, tmp_path)
    m = _read({**_OLMO3, "rope_theta": 10000.0, "rope_parameters": {  # both bases given: read as they are
        "full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding_attention": {"rope_theta": 5e5}}},
        tmp_path)
    assert (m.rope_theta, m.rope_local_theta, m.rope_yarn) == (10000.0, 500000.0, ())
    assert len(m.notes) == 1 and m.notes[0].startswith('rope_parameters.full_attention {"rope_type": "linear"')


_EXAONE4 = dict(model_type="exaone4", hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


@pytest.mark.parametrize("extra, types, window, nope", [
    ({}, ("sliding", "sliding", "sliding", "full", "sliding", "sliding"), 4096, (3,)),   # pattern 4 by default
    ({"sliding_window": 8, "sliding_window_pattern": 2}, ("sliding", "full") * 3, 8, (1, 3, 5)),
    ({"sliding_window_pattern": 1}, (), 0, tuple(range(6))),       # a window but no local layer: all NoPE
    ({"sliding_window": None}, (), 0, ()),                          # no window: all global, every one rotates
    ({"sliding_window": None, "layer_types": ["full_attention"] * 6}, (), 0, ()),
    ({"sliding_window_pattern": "LLLG", "layer_types": ["sliding_attention"] * 6}, (), 4096, ()),
])
def test_exaone4_local_and_global_layers_as_transformers_builds_them(extra, types, window, nope, tmp_path):
    d = {**_EXAONE4, **extra}
    m = _read(d, tmp_path)
    assert (m.layer_types, m.sliding_window, m.nope_layers) == (types, window, nope)
    assert (m.qk_norm, m.qk_norm_whole, m.pre_norms, m.sandwich_norms) == (True, False, False, True)
    if extra.get("sliding_window", 0) is not None:                 # transformers 5.24 cannot build the others
        theirs = transformers.Exaone4Config(**{k: v for k, v in d.items() if k != "model_type"})
        built = tuple(t.split("_")[0] for t in theirs.layer_types)
        assert built == (types or ("sliding" if window else "full",) * 6)


def test_exaone4_pattern_string_without_layer_types_is_refused(tmp_path):
    from roofline.errors import RooflineError

    with pytest.raises(RooflineError, match=r'exaone4: sliding_window_pattern = "LLLG" \(a string\) is not read '
                                            r"without layer_types .*: give layer_types"):
        _read({**_EXAONE4, "sliding_window_pattern": "LLLG"}, tmp_path)
