"""The checkpoint's own precision, per module: published quantized configs (tests/data/hf_configs/quant/, written
from memory: see its README) costed with no flag, batch 1, context 4,096, decode.

Each model's decode-step weight bytes and resident weight bytes are pinned as exact integers, and beside them an
independent count from the checkpoint's storage layout, by hand here (tensor shapes x element bytes + scales,
summed per module), never through the code under test, within 1%.

What the step reads (``Phase.weight_bytes``): every projection of every layer, the k routed experts a batch-1
token picks, the shared experts, the router's gate, lm_head, the linear and expert biases; not the norms, the
embedding gather (a row), the router's biases, the sinks. What is held (``capacity.weight_bytes``): every tensor
of the checkpoint but the multi-token-prediction layer (not part of a step, not loaded), plus, for latent attention
with a quantized kv_b_proj, decode's copy dequantized to bf16 (``kernels.quant.absorbed_kv_b``); decode reads that
copy, in bf16.

Run: pytest tests/test_checkpoint_precision.py
"""

import json
from math import ceil
from pathlib import Path

import pytest
from click.testing import CliRunner

from roofline import workload as W
from roofline.capacity import weight_bytes
from roofline.errors import RooflineError
from roofline.layer import precision_of
from roofline.models import load_model
from roofline.precision import read_scheme

QUANT = Path(__file__).parent / "data" / "hf_configs" / "quant"
BF16 = 2


def cfg(name: str) -> dict:
    return json.loads((QUANT / name / "config.json").read_text())


# ------------------------------------------------------------------ storage layouts, by hand
def fp8_block(K, N):      # e4m3 weight + an fp32 weight_scale_inv per 128 x 128 block
    return K * N + ceil(K / 128) * ceil(N / 128) * 4


def fp8_tensor(K, N):     # e4m3 weight + fp32 weight_scale + fp32 input_scale (static)
    return K * N + 4 + 4


def mxfp4(K, N):          # *_blocks: two e2m1 per byte; *_scales: one uint8 (e8m0) per 32 input rows
    return K * N // 2 + (K // 32) * N


def int4_g32(K, N):       # compressed-tensors pack-quantized: weight_packed int32 (8 per), bf16 weight_scale per 32
    return K * N // 2 + (K // 32) * N * BF16   # (+ a 2 x int64 weight_shape each: 16 bytes, not counted)


def gptq_g128(K, N):      # qweight int32 (8 per), qzeros int32 (8 per) per group, fp16 scales per group, g_idx int32
    return K * N // 2 + (K // 128) * (N // 8) * 4 + (K // 128) * N * 2 + K * 4


def bf16(K, N=1):
    return K * N * BF16


def dense_layer(c, lin, bias=False):
    """(step, held) bytes of one Llama-style layer: q/k/v/o and gate/up/down in ``lin``, 2 norms (+ qk-norms)."""
    H, I, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    hd = c.get("head_dim", H // nh)
    q, kv = nh * hd, c["num_key_value_heads"] * hd
    step = lin(H, q) + 2 * lin(H, kv) + lin(q, H) + 2 * lin(H, I) + lin(I, H)
    step += bf16(q + 2 * kv) if bias else 0
    norms = bf16(2 * H) + (bf16(2 * hd) if c["model_type"] == "qwen3" else 0)
    return step, step + norms


def dense_model(c, lin, bias=False):
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    step, held = dense_layer(c, lin, bias)
    head = bf16(H, V)
    return L * step + head, L * held + head + bf16(V, H) + bf16(H)


def deepseek_model(c, lin, experts_lin):
    """DeepSeek-V3 / Kimi-K2: MLA projections and dense MLPs and shared experts in ``lin``, routed experts in
    ``experts_lin``; the router's gate bf16, its correction bias fp32; kv_b_proj's bf16 copy when quantized."""
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    nh, qr, kvr = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    rope, nope, v = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    E, k, mi, first = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], \
        c["first_k_dense_replace"]
    S = mi * c["n_shared_experts"]
    kv_b = (kvr, nh * (nope + v))
    attn = lin(H, qr) + lin(qr, nh * (nope + rope)) + lin(H, kvr + rope) + lin(*kv_b) + lin(nh * v, H)
    copy = bf16(*kv_b) if lin(*kv_b) != bf16(*kv_b) else 0
    attn_step = attn - lin(*kv_b) + bf16(*kv_b)          # decode reads kv_b_proj as the bf16 copy
    attn_held = attn + copy + bf16(qr + kvr + 2 * H)     # + q_a / kv_a / the two layer norms
    dense = 2 * lin(H, c["intermediate_size"]) + lin(c["intermediate_size"], H)
    expert = 2 * experts_lin(H, mi) + experts_lin(mi, H)
    shared = 2 * lin(H, S) + lin(S, H)
    router = bf16(H, E)
    moe = L - first
    head = bf16(H, V)
    step = L * attn_step + first * dense + moe * (k * expert + shared + router) + head
    held = (L * attn_held + first * dense + moe * (E * expert + shared + router + E * 4) + head + bf16(V, H)
            + bf16(H))
    return step, held


def gpt_oss_model(c):
    """gpt-oss: attention (with biases and sinks), router (+ bias) and embeddings bf16; the experts' gate_up and
    down in MXFP4 with bf16 biases."""
    H, V, L, E, k = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_local_experts"], \
        c["num_experts_per_tok"]
    I, nh, hd, nkv = c["intermediate_size"], c["num_attention_heads"], c["head_dim"], c["num_key_value_heads"]
    q, kv = nh * hd, nkv * hd
    attn = bf16(H, q) + 2 * bf16(H, kv) + bf16(q, H) + bf16(q + 2 * kv) + bf16(H)
    expert = mxfp4(H, 2 * I) + mxfp4(I, H) + bf16(2 * I + H)
    router = bf16(H, E)
    head = bf16(H, V)
    step = L * (attn + router + k * expert) + head
    held = L * (attn + bf16(nh) + router + bf16(E) + E * expert + bf16(2 * H)) + head + bf16(V, H) + bf16(H)
    return step, held


def qwen3_moe_model(c, lin):
    H, V, L, E, k = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_experts"], \
        c["num_experts_per_tok"]
    nh, hd, nkv, mi = c["num_attention_heads"], c["head_dim"], c["num_key_value_heads"], c["moe_intermediate_size"]
    q, kv = nh * hd, nkv * hd
    attn = lin(H, q) + 2 * lin(H, kv) + lin(q, H)
    expert = 2 * lin(H, mi) + lin(mi, H)
    router = bf16(H, E)
    head = bf16(H, V)
    step = L * (attn + router + k * expert) + head
    held = L * (attn + router + E * expert + bf16(2 * H + 2 * hd)) + head + bf16(V, H) + bf16(H)
    return step, held


# The published configs: (folder, independent (step, held), pinned step, pinned held).
CASES = {
    "deepseek-v3": (lambda c: deepseek_model(c, fp8_block, fp8_block), 38_689_562_976, 675_197_402_464),
    "kimi-k2": (lambda c: deepseek_model(c, fp8_block, fp8_block), 33_544_617_824, 1_030_196_613_984),
    "kimi-k2-thinking": (lambda c: deepseek_model(c, bf16, int4_g32), 32_984_399_872, 594_205_305_856),
    "qwen3-32b-fp8": (lambda c: dense_model(c, fp8_block), 32_769_064_960, 34_326_243_328),
    "qwen3-30b-a3b-fp8": (lambda c: qwen3_moe_model(c, fp8_block), 3_366_068_224, 31_174_545_408),
    "llama-3.1-8b-instruct-fp8": (lambda c: dense_model(c, fp8_tensor), 8_029_996_800, 9_081_202_432),
    "llama-3.1-70b-instruct-fp8": (lambda c: dense_model(c, fp8_tensor), 70_552_392_064, 72_656_376_192),
    "gpt-oss-20b": (gpt_oss_model, 3_707_796_480, 13_761_264_768),
    "gpt-oss-120b": (gpt_oss_model, 5_002_467_840, 65_248_815_744),
    "qwen2.5-32b-instruct-gptq-int4": (lambda c: dense_model(c, gptq_g128, bias=True), 17_785_290_752,
                                       19_343_747_072),
}


def no_flag(name):
    """The decode step (batch 1, context 4,096) and the resident bytes of a published config, with no flag."""
    m = load_model(QUANT / name)
    p = precision_of(m)
    ph = W.decode(m, 1, 4096, precision=p if p.kv else p.with_flags(kv="bf16"), weight_dtype="checkpoint")
    return m, ph, weight_bytes(m, precision=p)


@pytest.mark.parametrize("name", sorted(CASES))
def test_published_checkpoints_cost_what_they_store(name):
    count, step_pin, held_pin = CASES[name]
    _, ph, held = no_flag(name)
    step_count, held_count = count(cfg(name))
    assert int(ph.weight_bytes) == step_pin and int(held) == held_pin
    assert ph.weight_bytes == pytest.approx(step_count, rel=0.01)
    assert held == pytest.approx(held_count, rel=0.01)


def test_the_orientation_figures_of_the_issue():
    # DeepSeek-V3 reads ~38.7 GB per step and holds ~673 GB (+ the 1.0 GB bf16 copy of kv_b_proj: 61 x 512 x
    # 32,768 x 2 = 2,046,820,352 held beside its 1,023,410,176 fp8 bytes); gpt-oss-120b ~5.0 / ~65 GB; Qwen3-32B-FP8
    # 32.8 GB; Llama-3.1-70B-Instruct-FP8 70.6 GB with an fp8 KV cache of 80 x 2 x 8 x 128 x 4,096 = 671,088,640.
    assert round(no_flag("deepseek-v3")[1].weight_bytes / 1e9, 1) == 38.7
    assert round((no_flag("deepseek-v3")[2] - 2 * 61 * 512 * 32768) / 1e9) == 673
    _, ph, held = no_flag("gpt-oss-120b")
    assert round(ph.weight_bytes / 1e9, 1) == 5.0 and round(held / 1e9) == 65
    assert round(no_flag("qwen3-32b-fp8")[1].weight_bytes / 1e9, 1) == 32.8
    _, ph, _ = no_flag("llama-3.1-70b-instruct-fp8")
    assert round(ph.weight_bytes / 1e9, 1) == 70.6
    assert ph.kv_cache_read_bytes == 80 * 2 * 8 * 128 * 4096 == 671_088_640


def test_each_module_at_its_own_precision():
    m = load_model(QUANT / "gpt-oss-120b")
    p = precision_of(m)
    assert dict(p.weights)["experts"].name == "mxfp4" and "attention" not in dict(p.weights)
    ds = precision_of(load_model(QUANT / "deepseek-v3"))
    assert {k: f.name for k, f in ds.weights} == {"experts": "fp8-block", "shared_experts": "fp8-block",
                                                  "mlp": "fp8-block", "mla": "fp8-block"}
    assert {k: f.name for k, f in ds.acts}["mla"] == "fp8-group"
    kimi = precision_of(load_model(QUANT / "kimi-k2-thinking"))   # experts only: the ignore list leaves the rest
    assert {k: f.name for k, f in kimi.weights} == {"experts": "int4"} and dict(kimi.weights)["experts"].group_size == 32
    l70 = precision_of(load_model(QUANT / "llama-3.1-70b-instruct-fp8"))
    assert l70.source == "hf_quant_config.json" and l70.kv.name == "fp8-tensor" and not l70.kv_scales


def test_flags_override_the_checkpoint():
    m = load_model(QUANT / "gpt-oss-120b")
    p = precision_of(m)
    # a plain flag: every projection, expert and lm_head in it; the router's gate stays bf16
    b16 = W.decode(m, 1, 4096, precision=p.with_flags("bf16", "bf16"), weight_dtype="bf16")
    plain = W.decode(m, 1, 4096, weight_dtype="bf16")
    assert b16.weight_bytes == plain.weight_bytes
    # per module: experts nvfp4 (blocks of 16, e4m3 scale, fp32 tensor scale), attention fp8 per channel
    q = p.with_flags("experts=nvfp4,attention=fp8", "bf16")
    assert {k: f.name for k, f in q.weights} == {"experts": "nvfp4", "attention": "fp8"}
    # one expert's gate_up [2880, 5760] in nvfp4: 2880 x 5760 / 2 + 180 x 5760 + 4 = 9,331,204
    from roofline.precision import weight_bytes as wb
    assert wb(dict(q.weights)["experts"], 2880, 5760) == 2880 * 5760 // 2 + 180 * 5760 + 4 == 9_331_204


@pytest.mark.parametrize("flag, msg", [
    ("experts=nvfp5", "unknown weight format 'nvfp5'"),
    ("expert=nvfp4", "unknown module class 'expert': choose one of experts, shared_experts, mlp, attention, mla, "
                     "router, lm_head, embedding"),
    ("experts", "unknown weight format 'experts'"),
    ("embedding=int8", r"a quantized embedding table \(int8\) is not modelled"),
])
def test_bad_per_module_flags_are_one_line(flag, msg):
    with pytest.raises(RooflineError, match=msg):
        precision_of(load_model(QUANT / "gpt-oss-20b")).with_flags(flag)


@pytest.mark.parametrize("q, msg", [
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not modelled"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\] is not modelled"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "activation_scheme 'static' is not modelled"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits 3 is not modelled"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version 'gemv' is not modelled"),
    ({"quant_method": "mxfp4", "swizzle": True}, "field 'swizzle' is not modelled"),
    ({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {}}, "format 'marlin-24'"),
])
def test_unmodelled_schemes_are_refused_in_one_line(q, msg):
    with pytest.raises(RooflineError, match=msg):
        read_scheme(q)


def test_modelopt_w4a8_is_refused(tmp_path):
    (tmp_path / "config.json").write_text((QUANT / "llama-3.1-70b-instruct-fp8" / "config.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(RooflineError, match="hf_quant_config.json: quant_algo 'W4A8_AWQ' is not modelled"):
        load_model(tmp_path)


def test_a_precision_that_differs_across_layers_is_refused(tmp_path):
    c = cfg("qwen3-32b-fp8")
    c["quantization_config"] = {**c["quantization_config"], "modules_to_not_convert": ["model.layers.0.mlp"]}
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(RooflineError, match="op 'gate_proj' would be stored as unquantized .* and fp8-block .*: a "
                                            "different precision across the layers"):
        precision_of(load_model(tmp_path))


def test_the_quantization_survives_a_result_file_header():
    from roofline.models import ModelConfig

    m = load_model(QUANT / "deepseek-v3")
    back = ModelConfig.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m and precision_of(back) == precision_of(m)


def explain(*args):
    from profiler.cli import main

    return CliRunner().invoke(main, ["explain", *args])


def stdout_lines(r) -> list:
    """What explain prints on stdout (its notes go to stderr)."""
    return [ln for ln in r.output.splitlines() if not ln.startswith("note: ")]


def test_explain_gpt_oss_120b_fits_one_h100_and_names_each_module():
    r = explain("--model", str(QUANT / "gpt-oss-120b"), "--device", "h100", "--context", "4096")
    assert r.exit_code == 0, r.output
    top = stdout_lines(r)[0]
    assert top == ("weights from quantization_config: experts mxfp4 (blocks of 32, e8m0 scales), attention bf16, "
                   "router bf16, lm_head bf16")
    assert "capacity: openai/gpt-oss-120b needs 65.2 GB of weights (experts mxfp4 (blocks of 32, e8m0 scales), " \
           "attention bf16, router bf16, lm_head bf16)" in r.output
    assert "DOES NOT FIT" not in r.output
    d = json.loads(explain("--model", str(QUANT / "gpt-oss-120b"), "--device", "h100", "--context", "4096",
                           "--json").stdout)
    assert d["capacity"]["fits"] and d["precision"]["modules"]["experts"]["weight"] == "mxfp4"
    assert d["precision"]["line"] == top


def test_explain_deepseek_v3_fp8_fits_at_tp_8_on_h200():
    r = explain("--model", str(QUANT / "deepseek-v3"), "--device", "h200", "--context", "4096")
    assert r.exit_code == 0, r.output
    assert "DOES NOT FIT" in r.output and "--tp 8 fits" in r.output
    assert stdout_lines(r)[0].startswith("weights from quantization_config: experts fp8 e4m3 (128x128 blocks) "
                                               "with fp8-group activations, shared_experts fp8 e4m3")
    r8 = explain("--model", str(QUANT / "deepseek-v3"), "--device", "h200", "--context", "4096", "--tp", "8")
    assert r8.exit_code == 0 and "DOES NOT FIT" not in r8.output and "mla fp8 e4m3 (128x128 blocks)" in r8.output


@pytest.mark.parametrize("preset,folder", [("gpt-oss-120b", "gpt-oss-120b"), ("gpt-oss-20b", "gpt-oss-20b"),
                                           ("deepseek-v3", "deepseek-v3")])
def test_a_preset_of_a_model_released_quantized_is_priced_as_released(preset, folder):
    """`--model gpt-oss-120b` is the MXFP4 release (the issue's first line: it said DOES NOT FIT, 234 GB)."""
    by_name, pinned = load_model(preset), load_model(str(QUANT / folder))
    assert precision_of(by_name) == precision_of(pinned)
    kw = dict(weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16")
    assert W.decode(by_name, 1, 4096, precision=precision_of(by_name), **kw).weight_bytes == \
        W.decode(pinned, 1, 4096, precision=precision_of(pinned), **kw).weight_bytes
    r = explain("--model", preset, "--device", "h100" if preset.startswith("gpt") else "h200", "--context", "4096")
    assert r.exit_code == 0, r.output
    assert ("DOES NOT FIT" in r.output) == (preset == "deepseek-v3")
    assert stdout_lines(r)[0] == stdout_lines(explain("--model", str(QUANT / folder), "--device", "h100" if
                                                      preset.startswith("gpt") else "h200", "--context", "4096"))[0]


def test_modelopt_nvfp4_counts_the_activations_global_scale_it_stores():
    from roofline.layer import op_spec
    from roofline.precision import Precision, act_format, lookup

    op = op_spec(load_model("tiny"), "down_proj")                       # module "mlp"
    w4a4 = Precision((("mlp", lookup("nvfp4", "weight")),), (("mlp", act_format("nvfp4")),))
    # [4096, 4096] e2m1 + an e4m3 scale per 16 + the weight's fp32 tensor scale + the fp32 input_scale
    assert w4a4.weight_bytes(op, 4096, 4096, "bf16") == 4096 * 4096 / 2 + 256 * 4096 + 4 + 4
    assert Precision((("mlp", lookup("nvfp4", "weight")),)).weight_bytes(op, 4096, 4096, "bf16") == \
        4096 * 4096 / 2 + 256 * 4096 + 4                                  # weight-only: no activation scale
