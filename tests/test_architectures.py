"""Config readers per model_type, the op list they yield, and capacity (issue 20): exact numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roofline import workload as W
from roofline.capacity import capacity
from roofline.devices import find_device
from roofline.errors import RooflineError
from roofline.layer import model_ops, model_params, op_names, op_order
from roofline.models import PRESETS, load_model

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def write(tmp_path, **d):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)


@pytest.mark.parametrize("name,arch,windows,params", [
    ("mistral-7b-v0.1", "mistral", (4096, 4096), None),
    ("qwen2.5-7b", "qwen2", (0, 0), None),
    ("qwen3-8b", "qwen3", (0, 0), None),
    ("phi-3-mini-4k-instruct", "phi3", (2047, 2047), None),
    ("gemma-7b", "gemma", (0, 0), None),
    ("gemma-2-9b", "gemma2", (4096, 0), None),
    ("gemma-3-12b-pt", "gemma3_text", (1024, 1024), None),
    ("llama-3.1-8b", "llama", (0, 0), None),
])
def test_published_configs_read_as_their_family(name, arch, windows, params):
    m = load_model(CONFIGS / f"{name}.json")
    assert m.arch == arch and m.windows == windows and m.n_layers == 2


def test_family_features_become_ops():
    q2 = load_model(CONFIGS / "qwen2.5-7b.json")
    assert model_ops(q2)[2].name == "q_proj" and model_ops(q2)[2].dims["bias"] is True
    assert {o.name: o.dims.get("bias") for o in model_ops(q2) if o.kind == "linear"}["o_proj"] is False
    q3 = load_model(CONFIGS / "qwen3-8b.json")
    assert "q_norm" in op_names(q3) and "k_norm" in op_names(q3) and q3.head_dim == 128
    g2 = load_model(CONFIGS / "gemma-2-9b.json")
    assert op_names(g2) == ("embedding", "embed_scale", "attn_norm", "q_proj", "k_proj", "v_proj", "rope",
                            "kv_append", "attention", "attention_sliding", "o_proj", "post_attn_norm",
                            "attn_residual", "mlp_norm", "gate_proj", "up_proj", "geglu", "down_proj",
                            "post_mlp_norm", "mlp_residual", "final_norm", "lm_head", "final_softcap")
    assert (g2.tie_embeddings, g2.attn_softcap, g2.final_softcap, g2.scale) == (True, 50.0, 30.0, 256 ** -0.5)
    counts = {o.name: o.count for o in model_ops(g2)}
    assert counts["attention"] == 1 and counts["attention_sliding"] == 1 and counts["q_proj"] == 2
    # Gemma-1 ties by default (transformers' default), Llama does not
    assert load_model(CONFIGS / "gemma-7b.json").tie_embeddings is True
    assert load_model(CONFIGS / "llama-3.1-8b.json").tie_embeddings is False
    g3 = load_model(CONFIGS / "gemma-3-12b-pt.json")
    assert (g3.rope_theta, g3.rope_local_theta, g3.qk_norm) == (1e6, 10000.0, True)


def test_params_of_the_presets_match_the_published_counts():
    # the models' own parameter counts (text towers), to the 1e-3
    for name, billions in [("llama-2-7b", 6.738), ("llama-3-8b", 8.030), ("mistral-7b", 7.242),
                           ("qwen2.5-7b", 7.616), ("qwen3-8b", 8.191), ("gemma-2-9b", 9.242),
                           ("phi-3-mini", 3.821), ("gemma-3-12b", 11.766)]:
        assert model_params(PRESETS[name]) / 1e9 == pytest.approx(billions, abs=1e-3), name


def test_window_caps_attention_and_kv():
    m = PRESETS["mistral-7b"]
    ph = W.decode(m, 1, 16384)
    # 4,096 keys x 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    assert ph.kv_cache_read_bytes == 536_870_912
    a = ph.op("attention").cost
    assert a.flops == 4 * 32 * 4096 * 128
    full = W.decode(PRESETS["llama-3-8b"], 1, 8000).op("attention").cost
    assert full.flops == 4 * 32 * 8001 * 128
    # prefill of 64 tokens under a window of 32 (the 1.33x): pairs = 32*32/2 + 32*32 = 1,536 vs 2,048
    tiny = PRESETS["tiny"]
    from dataclasses import replace
    w32 = replace(tiny, sliding_window=32)
    assert (W.prefill(tiny, 1, 64).op("attention").cost.flops
            / W.prefill(w32, 1, 64).op("attention").cost.flops) == pytest.approx(2048 / 1536)


@pytest.mark.parametrize("d,msg", [
    (dict(model_type="falcon"), "model_type \"falcon\" (a string) is not supported: supported are llama, mistral"),
    (dict(model_type="jamba"), "model_type 'jamba' is a mixture of experts (or a hybrid)"),
    (dict(model_type="olmoe"), "model_type 'olmoe' is a mixture of experts"),
    (dict(model_type="mixtral"), "mixtral: the number of experts (num_local_experts or num_experts) is missing"),
    (dict(model_type="gpt_oss", num_local_experts=4, swiglu_limit=5.0), "swiglu_limit = 5.0 is not modelled"),
    (dict(model_type="deepseek_v3", n_routed_experts=4, moe_intermediate_size=32, qk_rope_head_dim=8,
          qk_nope_head_dim=8, kv_lora_rank=16, v_head_dim=8, scoring_func="softmax"), "scoring_func"),
    (dict(model_type="llama", hidden_act="gelu"), "llama: hidden_act = \"gelu\" (a string) is not modelled"),
    (dict(model_type="llama", pretraining_tp=2), "pretraining_tp = 2 is not modelled"),
    (dict(model_type="gemma", attention_bias=True), "gemma: attention_bias = true (a boolean) is not modelled"),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=None,
          layer_types=["sliding_attention"] * 4), "sliding_window is null"),
    (dict(model_type="mistral", layer_types=["full_attention", "chunked_attention", "full_attention",
                                             "full_attention"], sliding_window=8), "layer_types"),
    (dict(model_type="phi3", rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 1.5}),   # 0.5: modelled
     "phi3: rope_parameters.partial_rotary_factor = 1.5 gives 24 rotary dims of head_dim 16, which is not modelled"),
])
def test_unmodelled_is_refused_in_one_line(tmp_path, d, msg):
    with pytest.raises(RooflineError) as e:
        load_model(write(tmp_path, **BASE, **d))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_qwen2_window_from_max_window_layers(tmp_path):
    m = load_model(write(tmp_path, **BASE, model_type="qwen2", use_sliding_window=True, sliding_window=16,
                         max_window_layers=2))
    assert m.windows == (0, 0, 16, 16) and m.qkv_bias and not m.o_bias


def test_with_layers_keeps_the_pattern():
    g = PRESETS["gemma-3-12b"].with_layers(7)
    assert g.windows == (1024,) * 5 + (0, 1024)


def test_op_order_merges_every_family():
    order = op_order()
    assert order.index("q_norm") == order.index("v_proj") + 1
    # a hybrid's mixers run where attention does: its Gated DeltaNet ops between o_proj and the post-attention norm
    assert order.index("o_proj") < order.index("in_proj_qkvz") < order.index("out_proj") < order.index("post_attn_norm")
    assert order[-1] == "final_softcap"


def test_capacity_llama_70b_on_h100():
    h = find_device("h100-sxm")
    one = capacity(PRESETS["llama-3-70b"], h, 1, 1024)
    assert not one.fits and one.weight_bytes == pytest.approx(141.1e9, rel=1e-3)
    assert one.min_tp == 2 and one.min_tp_max_batch == 56
    assert "does not fit; --tp 2 fits at batch <= 56" in one.sentence
    two = capacity(PRESETS["llama-3-70b"], h, 1, 1024, tp=2)
    assert two.fits and two.max_batch == 56 and two.weight_bytes == pytest.approx(70.6e9, rel=1e-3)
    # a window caps the cache: Mistral at 32k holds 4,096 tokens per layer
    m = capacity(PRESETS["mistral-7b"], h, 1, 32000)
    assert m.kv_bytes == 536_870_912 and "full length" not in m.sentence
    # our own model has no ring buffer: latency checks what it allocates, every layer at 32,000 tokens
    full = capacity(PRESETS["mistral-7b"], h, 1, 32000, windowed_kv=False)
    assert full.kv_bytes == 32 * 2 * 8 * 128 * 2 * 32000 == 4_194_304_000
    assert "every layer at full length as our model allocates it" in full.sentence
    assert "full length" not in capacity(PRESETS["llama-3-8b"], h, 1, 32000, windowed_kv=False).sentence


def test_explain_says_it_does_not_fit():
    from click.testing import CliRunner

    from profiler.cli import main

    r = CliRunner().invoke(main, ["explain", "--model", "llama-3-70b", "--device", "h100-sxm", "--batch", "1",
                                  "--context", "1024"])
    assert r.exit_code == 0 and r.output.startswith("DOES NOT FIT: llama-3-70b needs 141 GB of weights")
    r = CliRunner().invoke(main, ["explain", "--model", "llama-3-70b", "--device", "h100-sxm", "--tp", "2",
                                  "--json"])
    d = json.loads(r.output)
    assert d["capacity"]["fits"] is True and d["capacity"]["tp"] == 2


def test_latency_refuses_a_model_that_cannot_fit_before_building_it(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from profiler import sweep
    from profiler.cli import main

    monkeypatch.setattr(sweep, "device_memory_bytes", lambda device: 24e9)   # a 24 GB host
    r = CliRunner().invoke(main, ["latency", "--model", "llama-3-70b", "--requests", "1", "--prompt-tokens", "8",
                                  "--output-tokens", "2", "--out", str(tmp_path / "L")])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "llama-3-70b needs 282 GB of weights" in r.output and "does not fit" in r.output


def test_profile_says_when_the_whole_model_would_not_fit(monkeypatch):
    from profiler import profile_run, sweep

    monkeypatch.setattr(sweep, "device_memory_bytes", lambda device: 80e9)
    plan = sweep.SweepPlan(PRESETS["llama-3-70b"], batches=(1,), contexts=(1024,), dtype="bf16")
    note = profile_run.capacity_note(plan)
    assert note.startswith("note: llama-3-70b needs 141 GB of weights") and "one layer at a time" in note
    assert profile_run.capacity_note(sweep.SweepPlan(PRESETS["llama-3-8b"], dtype="bf16")) == ""


def test_explain_takes_a_measured_expert_load(tmp_path):
    import json as _json

    from click.testing import CliRunner

    from profiler.cli import main

    p = tmp_path / "load.json"
    p.write_text(_json.dumps([[10, 3, 2, 1, 0, 4, 2, 2], [5, 5, 5, 5, 1, 1, 1, 1]]))
    r = CliRunner().invoke(main, ["explain", "--model", "mixtral-8x7b", "--device", "h100", "--context", "16",
                                  "--expert-load", str(p), "--json"])
    c = _json.loads(r.output)["experts"]
    assert c["routing"] == "measured expert load"
    # shares (15, 8, 7, 6, 1, 5, 3, 3)/48, k=2: batch 2 touches sum 1 - (1 - 2 p)^2 = 3.2743 experts per layer
    shares = [15 / 48, 8 / 48, 7 / 48, 6 / 48, 1 / 48, 5 / 48, 3 / 48, 3 / 48]
    assert c["rows"][1]["experts_touched"] == pytest.approx(sum(1 - (1 - 2 * s) ** 2 for s in shares))
    p.write_text("[1, 2]")
    r = CliRunner().invoke(main, ["explain", "--model", "mixtral-8x7b", "--expert-load", str(p)])
    assert r.exit_code != 0 and "must be a list of 8 counts" in r.output and "Traceback" not in r.output
