"""Aliases, multimodal wrappers and the 2026 probes (issue 31).

- ``kimi_k2`` reads as ``deepseek_v3`` exactly (Kimi's deployment notes tell users to change model_type).
- A multimodal wrapper (gemma3, mistral3, qwen3_vl, qwen3_vl_moe, llama4) is read as its text_config, with transformers'
  defaults for what it leaves out and the wrapper's quantization; its parameter count is transformers' text model's
  (the wrapper built on the meta device: its language model and lm_head). The others are refused naming the feature.
- A real 2026 field added to a supported config (gated attention, a Qwen3-MoE shared expert, DeepSeek-V3.2's
  indexer, Gemma's shared KV, Llama-4's chunked attention) is refused in one line; an unknown key too, unless
  --allow-unknown-fields, which goes on and says so in the model's notes.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner

from roofline.errors import RooflineError
from roofline.families import Family, register, registry
from roofline.families.deepseek_v3 import read_deepseek_v3
from roofline.layer import model_params, precision_of
from roofline.models import PRESETS, load_model

DATA = Path(__file__).parent / "data" / "hf_configs"
KIMI = DATA / "quant" / "kimi-k2" / "config.json"
GEMMA3_4B = DATA / "multimodal" / "gemma-3-4b-it.json"


def write(folder: Path, d: dict, name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(json.dumps(d))
    return p


def same_model(a, b) -> list:
    """The fields (all but name and notes) where two ModelConfigs differ."""
    return [f.name for f in fields(a) if f.name not in ("name", "notes") and getattr(a, f.name) != getattr(b, f.name)]


def error(path, **kw) -> str:
    with pytest.raises(RooflineError) as e:
        load_model(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"model config {path}")
    return msg


# ---- aliases ----------------------------------------------------------------------------------------------

def test_kimi_k2_reads_as_deepseek_v3_exactly(tmp_path):
    d = json.loads(KIMI.read_text())
    assert d["model_type"] == "deepseek_v3"            # the pinned copy is written as DeepSeek-V3 (its README)
    as_deepseek = load_model(KIMI)
    kimi = load_model(write(tmp_path / "kimi", dict(d, model_type="kimi_k2")))
    assert kimi.arch == "deepseek_v3" and same_model(kimi, as_deepseek) == []
    assert kimi.n_experts == 384 and kimi.dense_layers == (0,) and kimi.quantization is not None
    assert model_params(kimi) == model_params(as_deepseek)
    assert any(n.startswith("model_type 'kimi_k2' reads as deepseek_v3 (") for n in kimi.notes)
    assert same_model(PRESETS["kimi-k2"], kimi) == []   # the preset is the published config


def test_an_alias_is_one_model_type_of_one_family(monkeypatch):
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    with pytest.raises(ValueError, match="'kimi_k2' is registered twice"):
        register(Family("toy_kimi", read_deepseek_v3, aliases={"kimi_k2": "a second claim"}))
    with pytest.raises(ValueError, match="'deepseek_v3' is registered twice"):
        register(Family("toy_kimi", read_deepseek_v3, aliases={"deepseek_v3": "a family's own name"}))


# ---- multimodal wrappers ----------------------------------------------------------------------------------

def test_gemma3_wrapper_reads_its_text_config_with_transformers_defaults():
    m = load_model(GEMMA3_4B)
    # given: 34 layers of 2560 / 10240, window 1024; left to Gemma3TextConfig: 8 heads / 4 KV of 256, vocab 262208,
    # query_pre_attn_scalar 256, RoPE 1e6 / 1e4, every 6th layer global, tied
    assert (m.arch, m.n_layers, m.hidden, m.intermediate, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab) == (
        "gemma3_text", 34, 2560, 10240, 8, 4, 256, 262208)
    assert (m.sliding_window, m.rope_theta, m.rope_local_theta, m.tie_embeddings) == (1024, 1e6, 1e4, True)
    assert m.query_scale == 256 ** -0.5 and m.layer_types[5] == "full" and m.layer_types[4] == "sliding"
    assert m.name == "gemma-3-4b-it"   # no _name_or_path: the file's own name (a config.json: its folder's)
    assert any("the vision tower is not costed: text prefill and decode are" in n for n in m.notes)
    assert same_model(PRESETS["gemma-3-27b"], load_model(DATA / "multimodal" / "gemma-3-27b-it.json")) == []


def test_the_wrappers_quantization_applies_to_its_text_model(tmp_path):
    d = json.loads(GEMMA3_4B.read_text())
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    m = load_model(write(tmp_path / "fp8", dict(d, quantization_config=fp8)))
    assert m.quantization is not None and m.quantization.method == "fp8"
    assert {k: f.name for k, f in precision_of(m).weights}["attention"].startswith("fp8")
    # ModelOpt's hf_quant_config.json beside a wrapper: the same
    folder = tmp_path / "modelopt"
    write(folder, d)
    write(folder, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                                                                      "exclude_modules": ["lm_head"]}},
          "hf_quant_config.json")
    m = load_model(folder)
    assert m.quantization is not None and m.quantization.source == "hf_quant_config.json"


def _meta_text_params(cfg) -> int:
    """transformers' parameter count of a wrapper's text model: its language model and lm_head (tied: once), built
    on the meta device from the same config."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    return sum(p.numel() for n, p in model.named_parameters()     # Llama-4 nests a causal LM: language_model.
               if n.startswith(("model.language_model.", "lm_head.", "language_model.")))


SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256, head_dim=32, max_position_embeddings=512)
WRAPPERS = {
    "gemma3": ("Gemma3Config", dict(SMALL, sliding_window=16), "gemma3_text"),
    "mistral3": ("Mistral3Config", dict(SMALL, model_type="mistral"), "mistral"),
    "qwen3_vl": ("Qwen3VLConfig", dict(SMALL, rope_scaling={"rope_type": "default", "mrope_section": [8, 4, 4],
                                                             "mrope_interleaved": True}), "qwen3_vl_text"),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", dict(SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48),
                     "qwen3_vl_moe_text"),
    # Maverick's layout: every other layer routed (and a dense one of intermediate_size_mlp), NoPE every 4th
    "llama4": ("Llama4Config", dict(SMALL, num_local_experts=8, intermediate_size_mlp=80, interleave_moe_layer_step=2,
                                    attention_chunk_size=16), "llama4_text"),
}


@pytest.mark.parametrize("outer", sorted(WRAPPERS))
@pytest.mark.parametrize("diff", [True, False], ids=["as-published", "in-full"])
def test_a_wrapper_has_transformers_text_parameter_count(outer, diff, tmp_path):
    transformers = pytest.importorskip("transformers")
    cls, text, mtype = WRAPPERS[outer]
    cfg = getattr(transformers, cls)(text_config=text)
    folder = tmp_path / outer
    folder.mkdir()
    cfg.to_json_file(folder / "config.json", use_diff=diff)    # as save_pretrained writes it (diff) and in full
    m = load_model(folder)
    assert m.arch == mtype and (m.hidden, m.n_layers, m.n_kv_heads) == (64, 4, 2)
    assert model_params(m) == _meta_text_params(cfg)
    if outer == "qwen3_vl_moe":
        assert (m.n_experts, m.n_active, m.norm_topk) == (8, 2, True)   # its router always renormalises
    if outer == "llama4":       # transformers' defaults: top-1, NoPE every 4th layer, the RoPE layers chunked
        assert (m.n_experts, m.n_active, m.moe_layers, m.dense_layers, m.intermediate, m.moe_intermediate) == (
            8, 1, (1, 3), (0, 2), 80, 96)
        assert (m.nope_layers, m.attention_chunk, m.chunks) == ((3,), 16, (16, 16, 16, 0))
        assert (m.qk_l2_norm, m.attn_temperature, m.router, m.routed_input) == (True, (8192, 0.1), "sigmoid_topk",
                                                                                 True)


def test_a_wrapper_is_its_text_config_with_the_sizes_it_leaves_out(tmp_path):
    d = json.loads(GEMMA3_4B.read_text())
    # saved alone, Gemma-3's text_config misses sizes: a config.json of its own must give them
    assert "is missing the key 'num_attention_heads'" in error(write(tmp_path / "alone", d["text_config"]))
    given = dict(d["text_config"], num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=262208)
    assert same_model(load_model(write(tmp_path / "given", given)), load_model(GEMMA3_4B)) == []


@pytest.mark.parametrize("outer, says", [
    ("gemma3n", "needs per-layer input embeddings, KV shared across layers and AltUp"),
    ("gemma4", "needs per-layer input embeddings, KV shared across layers"),
    ("llava", "is a multimodal config (\"llava\" (a string)) whose text model is not read (wrappers read: "),
])
def test_other_wrappers_are_refused_naming_what_they_lack(outer, says, tmp_path):
    p = write(tmp_path, {"model_type": outer, "text_config": dict(SMALL), "vision_config": {}})
    assert says in error(p)


def test_a_wrapper_key_that_is_not_the_vision_towers_is_refused(tmp_path):
    d = json.loads(GEMMA3_4B.read_text())
    p = write(tmp_path, dict(d, text_adapter_rank=16))
    assert "gemma3: text_adapter_rank = 16 is not a field roofline knows for the gemma3 wrapper" in error(p)
    m = load_model(p, allow_unknown_fields=True)
    assert any("--allow-unknown-fields: the wrapper's text_adapter_rank ignored" in n for n in m.notes)


# ---- probes: 2026 fields on supported configs -------------------------------------------------------------

def _published(name: str) -> dict:
    return json.loads((DATA / name).read_text())


PROBES = [
    ("qwen3-8b.json", "attn_output_gate", True, "qwen3: attn_output_gate = true (a boolean) turns on gated attention"),
    ("moe/qwen3-30b-a3b.json", "shared_expert_intermediate_size", 4096,
     "qwen3_moe: shared_expert_intermediate_size = 4096 turns on a shared expert"),
    ("moe/deepseek-v3.json", "index_topk", 2048, "deepseek_v3: index_topk = 2048 turns on DeepSeek-V3.2's sparse"),
    ("moe/deepseek-v3.json", "index_n_heads", 64, "deepseek_v3: index_n_heads = 64 turns on DeepSeek-V3.2's"),
    ("moe/deepseek-v3.json", "index_head_dim", 128, "deepseek_v3: index_head_dim = 128 turns on DeepSeek-V3.2's"),
    ("gemma-3-12b-pt.json", "num_kv_shared_layers", 10, "gemma3_text: num_kv_shared_layers = 10 turns on KV shared"),
    ("gemma-3-12b-pt.json", "attention_k_eq_v", True, "gemma3_text: attention_k_eq_v = true (a boolean) turns on keys "
                                                      "used as values"),
    ("gemma-2-9b.json", "num_kv_shared_layers", 4, "gemma2: num_kv_shared_layers = 4 turns on KV shared"),
    ("llama-3.1-8b.json", "attention_chunk_size", 8192, "llama: attention_chunk_size = 8192 turns on chunked local "
                                                       "attention (Llama-4)"),
]


@pytest.mark.parametrize("name, key, value, says", PROBES, ids=[f"{p[0]}:{p[1]}" for p in PROBES])
def test_a_2026_field_on_a_supported_config_is_refused(name, key, value, says, tmp_path):
    d = _published(name)
    load_model(write(tmp_path / "as-published", d))                # loads as published
    msg = error(write(tmp_path / "probe", dict(d, **{key: value})))
    assert says in msg and msg.endswith("costs and logits would be wrong, so the model is refused.")


def test_partial_rotary_inside_rope_parameters_is_refused_where_not_read(tmp_path):
    d = dict(_published("qwen3-8b.json"), rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                          "partial_rotary_factor": 0.25})
    assert "qwen3: rope_parameters = " in error(write(tmp_path, d))


def test_a_probe_left_off_is_accepted(tmp_path):
    d = _published("qwen3-8b.json")
    base = load_model(write(tmp_path / "a", d))
    off = load_model(write(tmp_path / "b", dict(d, attn_output_gate=False)))
    assert same_model(base, off) == []


def test_an_unknown_key_is_refused_in_one_line_or_let_through_with_a_note(tmp_path):
    p = write(tmp_path, dict(_published("qwen3-8b.json"), mtp_layers=2, some_new_thing=True))
    msg = error(p)
    assert "qwen3: mtp_layers = 2 (and 1 more: some_new_thing) is not a field roofline knows for qwen3" in msg
    assert "pass --allow-unknown-fields to go on" in msg
    m = load_model(p, allow_unknown_fields=True)
    note = ("--allow-unknown-fields: mtp_layers, some_new_thing are not known for qwen3 and ignored; costs and "
            "logits assume they change nothing.")
    assert note in m.notes and note in m.to_dict()["notes"]        # a result file's header carries it
    assert same_model(m, load_model(DATA / "qwen3-8b.json")) == []


def test_a_numerics_only_key_is_a_note(tmp_path):
    m = load_model(write(tmp_path, dict(_published("phi-3-mini-4k-instruct.json"),
                                        original_max_position_embeddings=8192)))
    assert any(n.startswith("original_max_position_embeddings = 8192 sets where LongRoPE's scaling starts; costs "
                            "are unaffected") for n in m.notes)


def test_the_cli_takes_allow_unknown_fields_and_says_it(tmp_path):
    from profiler.cli import main

    p = write(tmp_path, dict(_published("qwen3-8b.json"), mtp_layers=2))
    args = ["explain", "--model", str(p), "--device", "h100", "--phase", "decode", "--batch", "1", "--context", "64"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0 and "mtp_layers = 2 is not a field roofline knows" in refused.output
    ok = CliRunner().invoke(main, args + ["--allow-unknown-fields"])
    assert ok.exit_code == 0, ok.output
    assert "--allow-unknown-fields: mtp_layers is not known for qwen3 and ignored" in ok.output


def test_every_pinned_published_config_loads_strictly():
    """Every published config.json kept in tests/data loads without --allow-unknown-fields."""
    paths = [p for p in DATA.rglob("*.json") if p.name != "hf_quant_config.json"]
    assert len(paths) >= 20
    for p in paths:
        assert load_model(p).hidden > 0, p


def test_olmo2_whole_projection_qk_norm_is_not_split_under_tp(tmp_path):
    from roofline.parallel import shard

    d = dict(model_type="olmo2", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256)
    m = load_model(write(tmp_path, d))
    assert (m.pre_norms, m.sandwich_norms, m.qk_norm, m.qk_norm_whole) == (False, True, True, True)
    assert shard(m, 1).tp == 1
    with pytest.raises(RooflineError, match=r"--tp 2 cannot split .*qk-norm is over the whole q / k projection"):
        shard(m, 2)


# ---- a wrapper's ignore list, written against its own module names ------------------------------------------

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
FP8_CHANNEL = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}


def _quantized_wrapper(tmp_path, outer: str, quant: dict, name: str):
    transformers = pytest.importorskip("transformers")
    cls, text, _ = WRAPPERS[outer]
    d = dict(getattr(transformers, cls)(text_config=text).to_dict(), quantization_config=quant)
    return load_model(write(tmp_path / name, d))


def _formats(m) -> dict:
    """Each weight-reading op's stored format name (None: unquantized, the activation dtype) and its K x N bytes."""
    from roofline.layer import model_ops

    p = precision_of(m)
    return {o.name: (p.weight(o).name if p.quantized(o) else None, p.weight_bytes(o, 64, 96, "bf16"))
            for o in model_ops(m) if any(w.role == "linear" for w in o.weights)}


# Qwen3-VL (transformers 5's names: model.language_model.*, model.visual.*), Qwen's own FP8 layout
QWEN3_VL_IGNORE = ["lm_head", "model.visual.blocks.0.attn.qkv", "model.visual.blocks.0.mlp.linear_fc1",
                   "model.visual.merger.linear_fc1", "model.visual.deepstack_merger_list.0.linear_fc2",
                   *[f"model.language_model.layers.{i}.mlp.down_proj" for i in range(4)]]
# Gemma-3 (transformers 4.x's names: language_model.model.*, vision_tower.*, multi_modal_projector.*), llm-compressor
GEMMA3_IGNORE = ["language_model.lm_head", "re:vision_tower.*", "re:multi_modal_projector.*",
                 "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj",
                 *[f"language_model.model.layers.{i}.self_attn.o_proj" for i in range(4)],
                 r"re:language_model\.model\.layers\.\d+\.mlp\.up_proj"]


@pytest.mark.parametrize("outer, quant, ignore, key, kept", [
    ("qwen3_vl", FP8_BLOCK, QWEN3_VL_IGNORE, "modules_to_not_convert", {"down_proj", "lm_head"}),
    ("gemma3", FP8_CHANNEL, GEMMA3_IGNORE, "ignore", {"o_proj", "up_proj"}),
], ids=["qwen3_vl", "gemma3"])
def test_a_wrappers_ignore_list_names_its_text_models_modules(outer, quant, ignore, key, kept, tmp_path):
    m = _quantized_wrapper(tmp_path, outer, dict(quant, **{key: ignore}), "listed")
    got = _formats(m)
    assert {n for n, (f, _) in got.items() if f is None} == kept          # run and priced unquantized
    assert all(b == 64 * 96 * 2 for n, (_, b) in got.items() if n in kept)   # bf16 bytes, no scales
    assert {got[n][0] for n in got if n not in kept} == {"fp8-block" if outer == "qwen3_vl" else "fp8"}
    assert all(b < 64 * 96 * 2 for n, (_, b) in got.items() if n not in kept)
    # the vision tower's entries alone change nothing on the text model
    vision = [p for p in ignore if "vis" in p or "multi_modal" in p]
    only_vision = _formats(_quantized_wrapper(tmp_path, outer, dict(quant, **{key: vision}), "vision"))
    bare = _formats(_quantized_wrapper(tmp_path, outer, dict(quant, **{key: []}), "bare"))
    assert only_vision == bare
    assert {n for n, (f, _) in bare.items() if f is None} == ({"lm_head"} if outer == "qwen3_vl" else set())


def test_one_layers_entry_of_a_wrappers_ignore_list_is_a_layer_of_ours(tmp_path):
    ignore = ["model.language_model.layers.1.mlp.down_proj"]
    with pytest.raises(RooflineError, match=r"op 'down_proj' would be stored as fp8-block \(model\.layers\.0\.mlp"
                                            r"\.down_proj\) and unquantized \(model\.layers\.1\.mlp\.down_proj\)"):
        precision_of(_quantized_wrapper(tmp_path, "qwen3_vl", dict(FP8_BLOCK, modules_to_not_convert=ignore), "one"))


def test_a_config_without_name_or_path_is_named_by_its_file_or_its_folder(tmp_path):
    d = {k: v for k, v in _published("qwen3-8b.json").items() if k != "_name_or_path"}
    assert load_model(write(tmp_path / "models", d, "qwen3-8b-local.json")).name == "qwen3-8b-local"
    assert load_model(write(tmp_path / "Qwen3-8B", d)).name == "Qwen3-8B"             # its config.json: the folder
    assert load_model(tmp_path / "Qwen3-8B").name == "Qwen3-8B"                       # the folder itself
    assert load_model(write(tmp_path / "named", dict(d, _name_or_path="Qwen/Qwen3-8B"), "x.json")).name == \
        "Qwen/Qwen3-8B"


QWEN3_VL_235B = DATA / "multimodal" / "qwen3-vl-235b-a22b-instruct.json"
QWEN3_VL_235B_CHECKPOINT = 235_670_022_896   # the published checkpoint's tensors, summed (the report beside it)


QWEN3_VL_30B = DATA / "multimodal" / "qwen3-vl-30b-a3b-instruct.json"
QWEN3_VL_30B_CHECKPOINT = 31_070_754_032


def _published_wrapper(path: Path):
    """transformers' Qwen3-VL-MoE wrapper built on the meta device from a pinned config: (all its parameters, its
    text model's: language model and lm_head)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = {k: v for k, v in json.loads(path.read_text()).items()
         if k not in ("architectures", "transformers_version", "model_type")}
    with torch.device("meta"):
        wrapper = transformers.AutoModelForImageTextToText.from_config(transformers.Qwen3VLMoeConfig(**d))
    text = sum(p.numel() for n, p in wrapper.named_parameters()
               if n.startswith("model.language_model.") or n.startswith("lm_head."))
    return sum(p.numel() for p in wrapper.parameters()), text


def test_the_qwen3_vl_235b_preset_is_its_config_and_transformers_count():
    m = load_model(QWEN3_VL_235B)
    assert same_model(PRESETS["qwen3-vl-235b-a22b"], m) == []
    total, text = _published_wrapper(QWEN3_VL_235B)
    assert total == QWEN3_VL_235B_CHECKPOINT   # the config is the checkpoint's: its parameter count, to the one
    assert model_params(PRESETS["qwen3-vl-235b-a22b"]) == model_params(m) == text == 235_093_634_560


def test_the_raw_qwen3_vl_30b_config_reads_strictly_with_transformers_count():
    """The raw file (4.57's rope_scaling with mrope keys beside rope_theta) reads without --allow-unknown-fields."""
    m = load_model(QWEN3_VL_30B)
    assert (m.arch, m.n_layers, m.hidden, m.n_experts, m.n_active, m.moe_intermediate, m.rope_theta) == (
        "qwen3_vl_moe_text", 48, 2048, 128, 8, 768, 5e6)
    total, text = _published_wrapper(QWEN3_VL_30B)
    assert total == QWEN3_VL_30B_CHECKPOINT and model_params(m) == text
