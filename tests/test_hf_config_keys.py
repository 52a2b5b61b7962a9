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
from roofline.families.registry import refused, refused_families
from roofline.models import ModelConfig

transformers = pytest.importorskip("transformers")

REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# model_types registered here that transformers names otherwise (none today: each family is a transformers type)
TYPES = tuple(f.model_type for f in families())
# model_types read key by key but refused feature by feature (DeepSeek-V4): their keys are walked too
REFUSED = tuple(f.model_type for f in refused_families())


def _keys(mtype) -> Keys:
    return Keys(dict(SHARED)) + (refused(mtype) or next(f for f in families() if f.model_type == mtype)).keys


def _transformers_config(mtype):
    return transformers.AutoConfig.for_model(mtype)


def _signature_default(cls, key):
    p = inspect.signature(cls.__init__).parameters.get(key)
    return inspect.Parameter.empty if p is None else p.default


@pytest.mark.parametrize("mtype", TYPES + REFUSED)
def test_every_attribute_of_transformers_config_class_is_classified(mtype):
    d = _transformers_config(mtype).to_dict()
    known = _keys(mtype).known()
    unclassified = sorted(k for k in d if k not in known)
    assert not unclassified, f"{mtype}: transformers {transformers.__version__} has {unclassified}: classify them"


@pytest.mark.parametrize("mtype", TYPES + REFUSED)
def test_the_defaults_filled_in_are_transformers(mtype):
    c = _transformers_config(mtype)
    d = c.to_dict()
    keys = _keys(mtype)
    for k, ours in keys.modelled.items():
        if ours is None:
            continue
        if k == "rope_theta":
            rp = d["rope_parameters"]
            theirs = (rp.get("full_attention") or rp.get("main") or rp)["rope_theta"]   # DeepSeek-V4's "main"
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
    for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):   # never filled in
        if k in d:
            sparse_d[k] = d[k]
    if d["hidden_size"] % d["num_attention_heads"]:     # Glm4MoeConfig's 4096 / 96: transformers floors, we refuse
        sparse_d["head_dim"] = d["head_dim"]
    sparse = ModelConfig(**read_hf_config(sparse_d, tmp_path / "config.json"))
    diff = {f: (getattr(full, f), getattr(sparse, f)) for f in full.__dataclass_fields__
            if f not in ("notes", "name") and getattr(full, f) != getattr(sparse, f)}
    assert set(diff) == SPARSE_GAPS.get(mtype, set()), diff


def test_irrelevant_keys_are_not_also_modelled():
    for f in families() + refused_families():
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
# ---- keys inside rope_parameters, per RoPE type --------------------------------------------------------------

def _transformers_rope_keys(kind: str) -> set:
    """The keys transformers' own validation of a ``kind`` RoPE takes (required and optional), caught where it
    checks them (``RotaryEmbeddingConfigMixin._check_received_keys``) on a Llama config."""
    from transformers import modeling_rope_utils as R

    seen = {}

    class Caught(Exception):
        pass

    def catch(rope_type, received_keys, required_keys, optional_keys=None, ignore_keys=None):
        seen["keys"] = set(required_keys) | set(optional_keys or ())
        raise Caught

    config = transformers.LlamaConfig()            # built first: its own (default) RoPE is validated on the way
    mixin = R.RotaryEmbeddingConfigMixin
    original = mixin.__dict__["_check_received_keys"]
    mixin._check_received_keys = staticmethod(catch)
    try:
        with pytest.raises(Caught):
            getattr(config, f"_validate_{kind}_rope_parameters")({"rope_type": kind})
    finally:
        mixin._check_received_keys = original
    return seen["keys"]


def test_each_rope_types_keys_are_transformers():
    from roofline.families.reader import ROPE_COMMON, ROPE_KEYS

    for kind, (modelled, numerics) in ROPE_KEYS.items():
        ours = set(ROPE_COMMON) - {"type"} | set(modelled) | set(numerics)
        # partial_rotary_factor: every type takes it in transformers; here the family's (rotary_dim) where it
        # knows the key
        assert ours == _transformers_rope_keys(kind) - {"partial_rotary_factor"}, kind


LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=8192)


def _load(tmp_path, d, **kw):
    from roofline.models import load_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return load_model(p, **kw)


def _refused(tmp_path, d) -> str:
    from roofline.errors import RooflineError

    with pytest.raises(RooflineError) as e:
        _load(tmp_path, d)
    assert "\n" not in str(e.value)
    return str(e.value)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 2048,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_a_rope_types_own_keys_are_modelled_or_numerics_only(key, tmp_path):
    m = _load(tmp_path, dict(LLAMA, **{key: LLAMA3}, **({"rope_theta": 500000.0} if key == "rope_scaling" else {})))
    assert m.rope_theta == 500000.0 and not m.rope_yarn
    assert any(n.startswith(f'{key} {{"rope_type": "llama3"') and "costs are unaffected" in n for n in m.notes)
    y = _load(tmp_path, dict(LLAMA, **{key: YARN}, **({"rope_theta": 1e6} if key == "rope_scaling" else {})))
    assert y.rope_yarn[:4] == (4.0, 32.0, 1.0, 2048) and y.rope_yarn[5] is False and y.notes == ()   # modelled


@pytest.mark.parametrize("spec, says", [
    (dict(LLAMA3, beta_fast=32.0), 'llama: rope_parameters.beta_fast = 32.0 is not a key roofline knows in a "llama3" '
                                   "RoPE for llama (known: rope_type, type, rope_theta, factor, low_freq_factor"),
    (dict(YARN, short_factor=[1.0]), 'rope_parameters.short_factor = [1.0] (a list) is not a key roofline knows in a '
                                     '"yarn" RoPE for llama'),
    ({"rope_type": "default", "rope_theta": 1e4, "mrope_section": [8, 4, 4]},
     'rope_parameters.mrope_section = [8, 4, 4] (a list) is not a key roofline knows in a "default" RoPE for llama'),
    ({"rope_type": "proportional", "rope_theta": 1e4}, 'rope_parameters.rope_type = "proportional" (a string) is not '
                                                       "a RoPE type roofline knows (known: default, yarn, linear, "
                                                       "dynamic, longrope, llama3)"),
    ({"type": "su", "short_factor": [1.0], "long_factor": [1.0]}, 'rope_parameters.type = "su" (a string) is not a '
                                                                  "RoPE type roofline knows"),
], ids=["llama3+beta_fast", "yarn+short_factor", "mrope-on-llama", "proportional", "su"])
def test_an_unknown_key_inside_rope_parameters_is_refused_naming_it(spec, says, tmp_path):
    msg = _refused(tmp_path, dict(LLAMA, rope_parameters=spec))
    assert says in msg and msg.endswith("pass --allow-unknown-fields to go on without it (the model's notes then "
                                        "list it).")
    m = _load(tmp_path, dict(LLAMA, rope_parameters=spec), allow_unknown_fields=True)
    name = says.split(" = ")[0].split(": ")[-1]
    assert any(n.startswith(f"--allow-unknown-fields: {name} is not known for llama and ignored") for n in m.notes)


def test_a_per_layer_type_rope_parameters_is_checked_layer_type_by_layer_type(tmp_path):
    gemma = dict(LLAMA, model_type="gemma3_text", head_dim=16, sliding_window=16, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    m = _load(tmp_path, gemma)
    assert (m.rope_theta, m.rope_local_theta) == (1e6, 1e4)
    gemma["rope_parameters"]["sliding_attention"]["low_freq_factor"] = 1.0
    assert ('gemma3_text: rope_parameters.sliding_attention.low_freq_factor = 1.0 is not a key roofline knows in a '
            '"default" RoPE') in _refused(tmp_path, gemma)


def test_mrope_sections_are_qwen3_vls_and_partial_rotary_a_family_that_reads_it(tmp_path):
    mrope = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    qwen3_vl = dict(LLAMA, model_type="qwen3_vl_text", head_dim=16, rope_parameters=mrope)
    assert _load(tmp_path, qwen3_vl).rope_theta == 5e5                  # text positions: plain RoPE, exactly
    assert "qwen3: rope_parameters.mrope_section = [4, 2, 2]" in _refused(tmp_path, dict(qwen3_vl, model_type="qwen3"))
    partial = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    phi3 = _load(tmp_path, dict(LLAMA, model_type="phi3", rope_parameters=partial))
    assert phi3.rotary_dim == 8                                          # half of head_dim 16: read
    assert ('gemma2: rope_parameters.partial_rotary_factor = 0.5 is not a key roofline knows in a "default" RoPE for '
            "gemma2") in _refused(tmp_path, dict(LLAMA, model_type="gemma2", head_dim=16, rope_parameters=partial))


@pytest.mark.parametrize("allow_unknown", [False, True])
def test_a_hy3_config_relabelled_qwen3_moe_is_refused(allow_unknown, tmp_path):
    """Hy3's shared expert and scaled routing are not Qwen3-MoE's: refused by name, --allow-unknown-fields or not."""
    import hf_tiny_moe
    from roofline.errors import RooflineError
    from roofline.models import load_model

    hf_tiny_moe.tiny_config("hy_v3").save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert load_model(tmp_path).arch == "hy_v3"
    (tmp_path / "config.json").write_text(json.dumps(dict(d, model_type="qwen3_moe")))
    with pytest.raises(RooflineError, match="qwen3_moe: num_shared_experts = 1 turns on shared experts"):
        load_model(tmp_path, allow_unknown_fields=allow_unknown)
    (tmp_path / "config.json").write_text(json.dumps(dict(d, model_type="qwen3_moe", num_shared_experts=0)))
    with pytest.raises(RooflineError, match="router_scaling_factor = 2.826 turns on scaled routing weights"):
        load_model(tmp_path, allow_unknown_fields=allow_unknown)


REFUSALS = [
    ("ernie4_5_moe", {"use_bias": True}, "use_bias = true (a boolean) turns on biases on every projection"),
    ("ernie4_5_moe", {"moe_layer_start_index": 5}, "moe_layer_start_index = 5 leaves none of the 3 layers"),
    ("hy_v3", {"mlp_bias": True}, "mlp_bias = true (a boolean) turns on biases on the MLPs"),
    ("hy_v3", {"qk_norm": False}, "qk_norm = false (a boolean) turns on attention without qk-norm"),
    ("hy_v3", {"moe_router_use_sigmoid": False}, "turns on softmax routing"),
    ("hy_v3", {"route_norm": False}, "route_norm = false (a boolean) turns on a top-k left unnormalised"),
    ("hy_v3", {"num_shared_experts": 0}, "num_shared_experts = 0 is not modelled"),
    ("hy_v3", {"first_k_dense_replace": 2}, "first_k_dense_replace = 2 disagrees with the dense layers [1]"),
    ("hy_v3", {"expert_hidden_dim": 64}, "expert_hidden_dim = 64 disagrees with moe_intermediate_size 32"),
    ("hy_v3", {"mlp_layer_types": ["dense", "dense"]}, "mlp_layer_types has 2 entries for num_hidden_layers 3"),
]


@pytest.mark.parametrize("mtype, change, says", REFUSALS, ids=[f"{m}:{next(iter(c))}" for m, c, _ in REFUSALS])
def test_what_ernie_and_hy3_cannot_model_is_refused_by_name(mtype, change, says, tmp_path):
    import hf_tiny_moe
    from roofline.errors import RooflineError
    from roofline.models import load_model

    hf_tiny_moe.tiny_config(mtype).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    load_model(tmp_path)                                        # the tiny config reads
    (tmp_path / "config.json").write_text(json.dumps(dict(d, **change)))
    with pytest.raises(RooflineError) as e:
        load_model(tmp_path)
    assert says in str(e.value)
