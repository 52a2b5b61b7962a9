"""The engine rule files (``roofline.traces.rules.vllm`` / ``sglang`` / ``triton_inductor``) one by one, the step
annotations of each engine version, the mix syntax, and ``roofline trace --mix / --rules`` end to end."""

import json
import math

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline import formulas as F
from roofline.errors import RooflineError
from roofline.precision.formats import weight_bytes, weight_format
from roofline.traces import registry
from roofline.traces.analyze import analyze_trace
from roofline.traces.cost import cost_kernel, cost_op
from roofline.traces.engine_steps import parse_annotation, parse_mix
from roofline.traces.events import read_trace
from roofline.traces.graphs import kernel_category

from cli_errors import one_line_error
from engine_traces import BF, F32, FP8, EngineTrace

U8, I32 = "unsigned char", "int"


def args(dims, types, concrete=None):
    return {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or [""] * len(dims)}


# ---------------------------------------------------------------------------------------------- annotations and mixes
@pytest.mark.parametrize("name, engine, said", [
    ("execute_context_1(512)_generation_31(31)", "vllm",
     {"mode": "mixed", "prefill_requests": 1, "prefill_tokens": 512, "decode_requests": 31, "decode_tokens": 31}),
    ("execute_context_0(0)_generation_64(64)", "vllm",
     {"mode": "decode", "prefill_requests": 0, "prefill_tokens": 0, "decode_requests": 64, "decode_tokens": 64}),
    ("execute_new_2_cached_0", "vllm", {"mode": "prefill", "prefill_requests": 2}),
    ("execute_new_1_cached_30", "vllm", {"mode": "mixed", "prefill_requests": None}),   # a cached one may be a chunk
    ("step[EXTEND bs=3 toks=1500]", "sglang",
     {"mode": "prefill", "prefill_requests": 3, "prefill_tokens": 1500, "decode_requests": 0, "decode_tokens": 0}),
    ("step[DECODE bs=32]", "sglang",
     {"mode": "decode", "prefill_requests": 0, "prefill_tokens": 0, "decode_requests": 32, "decode_tokens": 32}),
    ("step[MIXED bs=9]", "sglang", {"mode": "mixed"}),
    ("step[IDLE bs=0]", "sglang", {"mode": "idle"}),
])
def test_each_engines_step_annotation_says_its_counts(name, engine, said):
    assert parse_annotation(name) == (engine, said)


@pytest.mark.parametrize("name", ["decode", "execute_model", "step[decode bs=3]", "execute_context_1(5)",
                                  "## decoder ##"])
def test_other_names_are_not_engine_steps(name):
    assert parse_annotation(name) is None


def test_a_mix_costs_each_chunk_over_its_prefix_and_each_decode_over_its_context():
    mix = parse_mix("prefill=2x256@1024,decode=3x4096,decode=1x100")
    assert mix.chunks == ((256, 1024), (256, 1024)) and mix.decodes == ((3, 4096), (1, 100))
    assert mix.tokens == 2 * 256 + 4
    assert mix.text() == "prefill=1x256@1024,prefill=1x256@1024,decode=3x4096,decode=1x100"
    # one layer of 32/8 heads of 128 under a 1,024-key window: each chunk 256 x 1,024 pairs (its window is full:
    # 256 * 1024), K/V of min(1280, 256 + 1023) = 1,279 keys; each decode over min(context, 1024) keys
    c = mix.attention(32, 8, 128, window=1024)
    chunk = (4 * 32 * 128 * 256 * 1024, 2 * 256 * 32 * 128 * 2 + 2 * 1279 * 8 * 128 * 2)
    dec = lambda n, s: (4 * n * 32 * s * 128, 2 * n * s * 8 * 128 * 2 + 2 * n * 32 * 128 * 2)
    want = [2 * chunk[0] + dec(3, 1024)[0] + dec(1, 100)[0], 2 * chunk[1] + dec(3, 1024)[1] + dec(1, 100)[1]]
    assert (c.flops, c.bytes) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("spec", ["prefill=512", "decode=3x4096@10", "chunk=1x5", "prefill=0x5", ""])
def test_a_bad_mix_is_one_line_naming_the_syntax(spec):
    with pytest.raises(RooflineError) as e:
        parse_mix(spec)
    assert "prefill=1x512@1536,decode=31x2048" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- quantized GEMMs
def test_cutlass_scaled_mm_per_tensor_and_block_scales_pick_the_weight_format():
    M_, K_, N_ = 64, 1024, 2048
    t = cost_op("_C::cutlass_scaled_mm", args([[M_, N_], [M_, K_], [K_, N_], [1], [1], []],
                                              [BF, FP8, FP8, F32, F32, ""]))
    # per tensor: the weight's one fp32 scale; the activation's one scale
    assert (t.cost.flops, t.cost.bytes) == (2 * M_ * K_ * N_, M_ * K_ + K_ * N_ + 4 + M_ * N_ * 2 + 4)
    assert t.detail["weight_format"] == "fp8-tensor" and t.compute_dtype == "fp8"
    b = cost_op("_C::cutlass_scaled_mm", args([[M_, N_], [M_, K_], [K_, N_], [M_, 8], [8, 16], []],
                                              [BF, FP8, FP8, F32, F32, ""]))
    assert b.detail["weight_format"] == "fp8-block"
    assert b.cost.bytes == M_ * K_ + (K_ * N_ + 8 * 16 * 4) + M_ * N_ * 2 + M_ * 8 * 4


def test_deepgemm_block_fp8_gemms_as_an_op_and_as_a_kernel_under_the_linear_op():
    m, k, n = 16, 7168, 2112
    scales = math.ceil(k / 128) * math.ceil(n / 128) * 4
    want = (2 * m * k * n, m * k + (k * n + scales) + m * n * 2 + m * math.ceil(k / 128) * 4)
    v = cost_op("vllm::w8a8_block_fp8_matmul_deepgemm", args([[m, k], [n, k], [m, 56], [17, 56], [], []],
                                                             [FP8, FP8, F32, F32, "GenericList", "ScalarType"]))
    sg = cost_op("sglang::deep_gemm_fp8_fp8_bf16_nt", args([[m, k], [m, 56], [n, k], [17, 56], [m, n]],
                                                           [FP8, F32, FP8, F32, BF]))
    lin = {"name": "vllm::apply_w8a8_block_fp8_linear", "args": args([[m, k], [n, k], [], [17, 56]],
                                                                     [BF, FP8, "GenericList", F32])}
    kern = cost_kernel("void deep_gemm::sm90_fp8_gemm_1d2d_impl<>", type("Op", (), lin)())
    for c in (v, sg, kern):
        assert (c.cost.flops, c.cost.bytes) == want and c.detail["weight_format"] == "fp8-block"
    assert kern.category == "gemm" and kernel_category("void deep_gemm::sm90_m_grouped_fp8_gemm_masked<>") == "moe"


def test_marlin_and_machete_int4_by_their_group_scales():
    x, q, s = [16, 4096], [256, 22016], [32, 11008]                 # groups of 4096 / 32 = 128 rows
    m = cost_op("_C::gptq_marlin_gemm", args([x, [], q, s], [BF, "", I32, BF]))
    # 2MNK; x bf16, the int4 weight (K*N/2) and its bf16 group scales (K/128 x N), y bf16
    assert (m.cost.flops, m.cost.bytes) == (2 * 16 * 4096 * 11008,
                                            16 * 4096 * 2 + 4096 * 11008 / 2 + 32 * 11008 * 2 + 16 * 11008 * 2)
    mc = cost_op("_C::machete_mm", args([x, q, [], [], s], [BF, I32, "", "", BF]))
    assert (mc.cost.flops, mc.cost.bytes) == (m.cost.flops, m.cost.bytes)


def test_cutlass_fp4_gemm_at_nvfp4():
    m, k, n = 32, 4096, 8192
    c = cost_op("_C::cutlass_scaled_fp4_mm", args([[m, n], [m, k // 2], [n, k // 2], [m, k // 16], [n, k // 16], []],
                                                  [BF, U8, U8, FP8, FP8, F32]))
    w = k * n / 2 + (k // 16) * n * 1 + 4                          # e2m1, an e4m3 scale per 16, the fp32 tensor scale
    x = m * k / 2 + m * (k // 16) * 1 + 4                          # the activations in the same format
    assert (c.cost.flops, c.cost.bytes) == (2 * m * k * n, x + w + m * n * 2)
    assert c.compute_dtype == "fp4"


def test_fp8_quantize_ops_read_bf16_write_fp8_and_their_scales():
    st = cost_op("_C::static_scaled_fp8_quant", args([[8, 4096], [8, 4096], [1]], [FP8, BF, F32]))
    assert (st.cost.flops, st.cost.bytes) == (8 * 4096, 8 * 4096 * 3)   # static: the scale is given, not written
    g = cost_op("sgl_kernel::sgl_per_token_group_quant_fp8", args([[8, 4096], [8, 4096], [8, 32], []],
                                                                  [BF, FP8, F32, I32]))
    assert (g.cost.flops, g.cost.bytes) == (2 * 8 * 4096, 8 * 4096 * 3 + 8 * 32 * 4) and g.category == "quantize"


def test_moe_expert_launches_add_up_to_moe_experts():
    T, H, I_, E, k = 48, 2048, 768, 128, 8
    gu, dn = 2 * weight_bytes(weight_format("bf16"), H, I_), weight_bytes(weight_format("bf16"), I_, H)
    up, down = F.moe_expert_launches(T, H, I_, E, k, gate_up_bytes=gu, down_bytes=dn)
    whole = F.moe_experts(T, H, I_, E, k)
    assert (up.flops + down.flops, up.bytes + down.bytes) == pytest.approx((whole.flops, whole.bytes), rel=1e-12)


@pytest.mark.parametrize("kernel, category", [
    ("_p_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", "moe"), ("fused_moe_kernel", "moe"),
    ("void deep_gemm::sm90_m_grouped_fp8_gemm_contiguous_1d1d_impl<>", "moe"),
    ("bmm_E2m1E2m1E2m1_Fp32_t128x8x512u2_s3_et128x8_m128x8x64_cga1x1x1_16dp256b_TN_transOut_schedS_sm100f", "moe"),
    ("void vllm::moe::topkGatingSoftmax<float, 8, 32>", "moe"), ("moe_align_block_size_kernel", "moe"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<>", "attention"),
    ("kernel_unified_attention_3d", "attention"), ("void vllm::paged_attention_v2_kernel<>", "attention"),
    ("void flash::flash_fwd_splitkv_mla_kernel<>", "attention"),
    ("_fwd_grouped_kernel_stage1", "attention"), ("_fwd_kernel", "attention"),
    ("_per_token_group_quant_fp8", "quantize"), ("triton_red_fused_add_rms_norm_0", "reduction"),
    ("triton_poi_fused_mul_silu_1", "elementwise"), ("triton_tem_fused_mm_2", "gemm"),
    ("void vllm::cross_device_reduce_2stage<>", "communication"),
])
def test_each_engine_kernel_has_the_category_its_rule_declares(kernel, category):
    assert kernel_category(kernel) == category


def test_a_paged_attention_kernel_with_no_step_mix_or_no_model_is_uncosted():
    from roofline.models import PRESETS
    assert cost_kernel("kernel_unified_attention_2d", model=PRESETS["llama-3-8b"]) is None
    assert cost_kernel("void flashinfer::BatchDecodeWithPagedKVCacheKernel<>") is None


# ---------------------------------------------------------------------------------------------- Triton / Inductor
def test_an_inductor_kernel_by_its_recorded_num_gb_else_by_its_buffers_and_a_bare_triton_kernel_uncosted(tmp_path):
    t = EngineTrace()
    with t.step("execute_context_0(0)_generation_4(4)"):
        t.op("triton_red_fused_add_rms_norm_0", [[4, 4096], [4, 4096], [4096], [4, 4096]], [BF, BF, BF, BF],
             kernels=[("triton_red_fused_add_rms_norm_0", 5)])
        t.events[-1]["args"].update({"kernel_num_gb": 0.0001, "kernel_flop": 81920})
        t.op("triton_poi_fused_mul_silu_1", [[4, 28672], [4, 14336]], [BF, BF],
             kernels=[("triton_poi_fused_mul_silu_1", 3)])
        t.bare("_my_triton_kernel", 2)
    s = analyze_trace(read_trace(t.dump(tmp_path / "inductor.json")))
    red, poi, bare = s.instances
    assert (red.cost.flops, red.cost.bytes, red.category) == (81920, 0.0001e9, "reduction")
    assert (poi.cost.flops, poi.cost.bytes, poi.category) == (0, (4 * 28672 + 4 * 14336) * 2, "elementwise")
    assert "FLOPs not recorded" in poi.note
    assert bare.cost is None and s.summary["uncosted_s"] == pytest.approx(2e-6)


# ---------------------------------------------------------------------------------------------- the CLI
def _toy_trace(tmp_path):
    t = EngineTrace()
    with t.step("step[DECODE bs=4]"):
        t.op("aten::mm", [[4, 256], [256, 256]], [BF, BF], kernels=[("nvjet_tst_small", 6)])
        t.bare("my_lab_decode_kernel", 4)
    return t.dump(tmp_path / "toy.json")


RULES = '''
from roofline.cost import Cost
from roofline.traces.registry import rule

@rule(kernels=r"my_lab_decode_kernel", category="lab-attention")
def lab(a):      # one layer's decode of the step's sequences: 1 MFLOP and 1 MB per sequence
    n = a.step.decode_requests
    return a.op(Cost(1e6 * n, 1e6 * n), "bf16", f"lab decode of {n}")
'''


def test_trace_rules_file_costs_a_kernel_of_the_users_and_mix_is_checked(tmp_path):
    f = tmp_path / "my_rules.py"
    f.write_text(RULES)
    try:
        res = CliRunner().invoke(main, ["trace", str(_toy_trace(tmp_path)), "--rules", str(f), "--out",
                                        str(tmp_path / "o"), "--json", "--no-report", "--mix", "decode=4x512"])
        assert res.exit_code == 0, res.output
        rank, = json.loads(res.stdout)["ranks"]
        assert rank["uncosted_s"] == 0 and rank["by_category_s"]["lab-attention"] == pytest.approx(4e-6)
        assert rank["engine_steps"]["steps"][0]["mix"] == "decode=4x512"
    finally:
        for r in [r for r in registry.RULES if r.label.endswith(".lab")]:
            registry.unregister(r.cost)
    bad = CliRunner().invoke(main, ["trace", str(tmp_path / "toy.json"), "--mix", "decode=4", "--out",
                                    str(tmp_path / "o2")])
    one_line_error(bad, "--mix: 'decode=4' is not a mix item", "prefill=1x512@1536,decode=31x2048")


def test_kernels_no_op_launched_are_costed_from_the_step_and_the_model():
    """What a graph replay without its capture can cost (its kernels carry no op): the experts at the step's tokens
    (no padding known), attention from its mix; a GEMM kernel with no shapes stays uncosted."""
    from roofline.models import PRESETS
    from roofline.traces.engine_steps import EngineStep
    m = PRESETS["gpt-oss-20b"]
    step = EngineStep("vllm", "execute_context_0(0)_generation_27(27)", 0, 10, None, "decode", 0, 0, 27, 27,
                      parse_mix("decode=27x2048"))
    up = cost_kernel("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", step=step, model=m)
    assert up.detail["tokens"] == 27 and "engine step's tokens" in up.note
    att = cost_kernel("kernel_unified_attention_2d", step=step, model=m, nth=1)     # layer 1: full attention
    assert att.detail == {"layer": 1, "window": 0, "tokens": 27, "batch": 27, "s_q": 1, "s_kv": 2048}
    assert cost_kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", step=step, model=m) is None
