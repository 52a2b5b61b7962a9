"""A vLLM V1 mixed step of an FP8 Llama-3-8B (W8A8: per-channel fp8 weights, per-token dynamic fp8 activations,
``--enforce-eager``): one 512-token chunk after 1,536 cached tokens and 31 sequences decoding at 2,048 keys, in one
forward of 543 tokens. The trace follows vLLM's sources: the step annotation of ``Worker.annotate_profile``
(``execute_context_1(512)_generation_31(31)``), the ops of ``csrc/torch_bindings.cpp`` with their argument order
(``_C::cutlass_scaled_mm(out, a, b, a_scales, b_scales, bias)``, ``_C::dynamic_per_token_scaled_fp8_quant(out,
input, scale, scale_ub)``, ``_C::rotary_embedding``, ``_C_cache_ops::reshape_and_cache_flash``), attention through
``vllm::unified_attention_with_output`` (FlashAttention 3's kernel). Every kernel's FLOPs and bytes are worked by
hand below from the formulas' conventions (``roofline.formulas``)."""

import pytest

from roofline.models import PRESETS
from roofline.traces.analyze import analyze_trace
from roofline.traces.engine_steps import find_steps, parse_mix
from roofline.traces.events import read_trace

from engine_traces import BF, F32, FP8, I64, EngineTrace

M = PRESETS["llama-3-8b"]
T, H, I, HQ, HKV, D = 543, 4096, 14336, 32, 8, 128
MIX = "prefill=1x512@1536,decode=31x2048"
ANNOTATION = "execute_context_1(512)_generation_31(31)"
FA3 = "void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<>, true>>"
CUTLASS = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass_3x_gemm_fp8_sm90>>"
QUANT = "void vllm::dynamic_per_token_scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>"
US = {"norm": 6, "quant": 4, "qkv": 30, "rope": 4, "cache": 3, "attn": 60, "o": 20, "gate_up": 120, "silu": 10,
      "quant_i": 6, "down": 60}


def _quant(t, k):
    t.op("_C::dynamic_per_token_scaled_fp8_quant", [[T, k], [T, k], [T, 1], []], [FP8, BF, F32, ""],
         kernels=[(QUANT, US["quant_i"] if k == I else US["quant"])])


def _gemm(t, k, n, us):
    t.op("_C::cutlass_scaled_mm", [[T, n], [T, k], [k, n], [T, 1], [n, 1], []], [BF, FP8, FP8, F32, F32, ""],
         kernels=[(CUTLASS, us)])


def build(tmp_path):
    t = EngineTrace()
    with t.step(ANNOTATION):
        t.op("aten::embedding", [[128256, H], [T]], [BF, I64], kernels=[("void at::native::indexSelectLargeIndex", 5)])
        for _ in range(M.n_layers):
            t.op("_C::fused_add_rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"],
                 kernels=[("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>", US["norm"])])
            _quant(t, H)
            _gemm(t, H, 6144, US["qkv"])
            t.op("_C::rotary_embedding", [[T], [T, 4096], [T, 1024], [], [131072, D], []], [I64, BF, BF, "int", BF,
                                                                                        "bool"],
                 ["", "", "", "128", "", "True"], kernels=[("void vllm::rotary_embedding_kernel<c10::BFloat16, true>",
                                                           US["rope"])])
            t.op("_C_cache_ops::reshape_and_cache_flash", [[T, HKV, D], [T, HKV, D], [4096, 16, HKV, D],
                                                            [4096, 16, HKV, D], [T], [], [], []],
                 [BF, BF, BF, BF, I64, "str", F32, F32], ["", "", "", "", "", "auto", "", ""],
                 kernels=[("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16>", US["cache"])])
            t.op("vllm::unified_attention_with_output", [[T, HQ, D], [T, HKV, D], [T, HKV, D], [T, HQ, D], []],
                 [BF, BF, BF, BF, "str"], kernels=[(FA3, US["attn"])])
            _quant(t, H)
            _gemm(t, H, H, US["o"])
            t.op("_C::fused_add_rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"],
                 kernels=[("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>", US["norm"])])
            _quant(t, H)
            _gemm(t, H, 2 * I, US["gate_up"])
            t.op("_C::silu_and_mul", [[T, I], [T, 2 * I]], [BF, BF],
                 kernels=[("void vllm::act_and_mul_kernel<c10::BFloat16, silu_kernel>", US["silu"])])
            _quant(t, I)
            _gemm(t, I, H, US["down"])
        t.op("_C::rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"],
             kernels=[("void vllm::rms_norm_kernel<c10::BFloat16>", 6)])
        t.op("aten::mm", [[32, H], [H, M.vocab]], [BF, BF], kernels=[("nvjet_tst_128x64_64x4_1x2_h_bz_TNT", 180)])
    return read_trace(t.dump(tmp_path / "vllm_fp8_mixed.json")), t.kernel_us


# ---- the hand-worked costs of one layer's kernels (and the step's head and tail), from the formulas' conventions
def q8(k):    # dynamic per-token fp8 quantize of [T, k]: abs-max and scale per element; bf16 read, fp8 written, scales
    return 2 * T * k, T * k * 2 + T * k * 1 + T * 4


def mm8(k, n):   # W8A8: 2MNK; A fp8 + W fp8 with its per-channel fp32 scales + C bf16 + A's per-token fp32 scales
    return 2 * T * k * n, T * k * 1 + (k * n * 1 + n * 4) + T * n * 2 + T * 4


PAIRS = 512 * 1536 + 512 * 512 / 2                    # the chunk's causal pairs (the n*n/2 convention)
HAND = {
    "norm": (5 * T * H, 4 * T * H * 2 + H * 2),            # add + RMSNorm: x, r read, h, y written; the weight
    "quant": q8(H), "quant_i": q8(I),
    "qkv": mm8(H, 6144), "o": mm8(H, H), "gate_up": mm8(H, 2 * I), "down": mm8(I, H),
    "rope": (3 * T * (HQ + HKV) * D, 2 * T * (HQ + HKV) * D * 2 + T * D * 4),
    "cache": (0, 2 * T * HKV * D * (2 + 2)),               # k and v read (bf16), written to the bf16 cache
    "silu": (5 * T * I, 3 * T * I * 2),
    # the chunk over its 1,536 cached keys and itself (q and o; K and V of 2,048 keys once per KV head) + the 31
    # decodes, each over its own 2,048 keys
    "attn": (4 * HQ * D * PAIRS + 4 * 31 * HQ * 2048 * D,
             (2 * 512 * HQ * D * 2 + 2 * 2048 * HKV * D * 2) + (2 * 31 * 2048 * HKV * D * 2 + 2 * 31 * HQ * D * 2)),
}
HEAD_TAIL = {"aten::embedding": (0, T * H * 2 + T * H * 2 + T * 8),
             "_C::rms_norm": (4 * T * H, 2 * T * H * 2 + H * 2),
             "aten::mm": (2 * 32 * H * M.vocab, 32 * H * 2 + H * M.vocab * 2 + 32 * M.vocab * 2)}
ORDER = ["norm", "quant", "qkv", "rope", "cache", "attn", "quant", "o", "norm", "quant", "gate_up", "silu", "quant_i",
         "down"]


def test_the_vllm_annotation_and_the_mix_make_one_mixed_step(tmp_path):
    tr, _ = build(tmp_path)
    steps = find_steps(tr, MIX)
    s, = steps.steps
    assert (s.engine, s.mode, s.prefill_requests, s.prefill_tokens, s.decode_requests, s.decode_tokens) == (
        "vllm", "mixed", 1, 512, 31, 31)
    assert s.mix == parse_mix(MIX) and s.mix.chunks == ((512, 1536),) and s.mix.decodes == ((31, 2048),)
    assert s.tokens == T == 512 + 31                      # every linear runs on the chunk's tokens and one per decode
    other = find_steps(tr, "prefill=1x256@0,decode=31x2048")   # counts the annotation contradicts: not applied
    assert other.steps[0].mix is None and "uncosted" in other.notes[0]


def test_every_kernel_of_the_mixed_step_costs_what_the_hand_says(tmp_path):
    tr, _ = build(tmp_path)
    r = analyze_trace(tr, model=M, mix=MIX)
    inst = [i for i in r.instances]
    head, layers, tail = inst[0], inst[1:-2], inst[-2:]
    assert len(layers) == M.n_layers * len(ORDER)
    for n, i in enumerate(layers):
        want = HAND[ORDER[n % len(ORDER)]]
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(want, rel=1e-12), (n, i.name, i.signature)
    for i in (head, *tail):
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(HEAD_TAIL[i.name], rel=1e-12), i.name
    att = layers[ORDER.index("attn")]
    assert att.category == "attention" and att.name.startswith("void flash::FlashAttnFwdSm90")
    assert att.signature == f"{MIX} h32/8 d128 kv bf16"
    assert layers[ORDER.index("qkv")].detail["weight_format"] == "fp8"
    assert {i.category for i in layers[:len(ORDER)]} == {"norm", "quantize", "gemm", "rope", "kv_write", "attention",
                                                         "activation"}


def test_the_mixed_step_is_costed_to_all_of_its_gpu_time_and_without_the_mix_its_attention_is_not(tmp_path):
    tr, kernel_us = build(tmp_path)
    s = analyze_trace(tr, model=M, mix=MIX).summary
    assert s["attributed_s"] == pytest.approx(kernel_us * 1e-6, rel=1e-9)
    assert s["costed_s"] / s["attributed_s"] == pytest.approx(1.0) and s["uncosted_s"] == 0
    without = analyze_trace(tr, model=M).summary          # no KV lengths: the 32 attention launches are uncosted
    assert without["uncosted_s"] == pytest.approx(32 * US["attn"] * 1e-6, rel=1e-9)
    assert without["uncosted_share"] == pytest.approx(32 * 60 / kernel_us, rel=1e-9)


def test_without_the_mix_the_trace_says_what_to_pass_and_takes_the_batch_from_the_annotation(tmp_path):
    """vLLM's annotation says requests and tokens, not KV lengths: the notes name the --mix to fill in (this
    step's counts), and the phase's batch is the annotation's, not an assumed 1 from the GEMM rows."""
    tr, _ = build(tmp_path)
    r = analyze_trace(tr, model=M)
    assert ("1 vllm step(s) say their requests and tokens but not their KV lengths (the engine's annotations never "
            "do): their attention is costed only where its lengths are known; give them with --mix, e.g. --mix "
            "prefill=1x512@CACHED,decode=31xCONTEXT for 'execute_context_1(512)_generation_31(31)'.") in r.notes
    pre = r.summary["phases"]["prefill"]
    assert (pre["batch"], pre["context"], pre["how"]) == (1, 512 + 31, "batch from its vllm step annotation, "
                                                                      "tokens from its GEMM rows")
    assert not [n for n in analyze_trace(tr, model=M, mix=MIX).notes if "KV lengths" in n]


def test_the_engines_step_is_the_phase_its_ops_are_measured_in(tmp_path):
    """The step annotation places the ops: the mixed step (a chunk beside 31 decodes) counts as prefill, said in the
    method; no op is left in 'forward (phase unknown)'."""
    tr, _ = build(tmp_path)
    r = analyze_trace(tr, model=M, mix=MIX)
    phases = {m.point.phase for m in r.measurements}
    assert phases == {"prefill"}, phases
    assert r.summary["phases"]["prefill"]["method"].startswith("vllm step annotations (a mixed step counts as prefill)")


def test_the_traced_mixed_step_equals_explain_mix_of_the_same_mix(tmp_path):
    """`explain --mix` (``workload.mixed``) prices the same step: its attention equals the trace's attention
    kernel (one layer, FLOPs and bytes), its GEMMs' FLOPs the trace's fused GEMMs (qkv = q + k + v, gate_up =
    gate + up), its lm_head the 32 rows the trace's head ran; the trace's W8A8 bytes are the fp8 ones."""
    from roofline import workload as W
    from roofline.precision import Precision, act_format, lookup

    tr, _ = build(tmp_path)
    inst = analyze_trace(tr, model=M, mix=MIX).instances
    traced = {ORDER[n % len(ORDER)]: i.cost for n, i in enumerate(inst[1:1 + len(ORDER)])}
    mix = parse_mix(MIX)
    fp8 = Precision(tuple((m, lookup("fp8", "weight")) for m in ("mlp", "attention")),
                    tuple((m, act_format("fp8")) for m in ("mlp", "attention")))
    ph = W.mixed(M, mix.chunks, mix.decodes, precision=fp8)
    op = lambda n: ph.op(n).cost  # noqa: E731
    assert (ph.phase, ph.batch, ph.new_tokens) == ("mixed", 32, T)
    assert op("attention") == traced["attn"]                          # per chunk over its prefix + per decode group
    assert (op("q_proj") + op("k_proj") + op("v_proj")).flops == traced["qkv"].flops
    assert (op("gate_proj") + op("up_proj")).flops == traced["gate_up"].flops
    assert op("down_proj").flops == traced["down"].flops and op("o_proj").flops == traced["o"].flops
    assert op("o_proj").bytes - (T * H * 2 + T * H * 2) == H * H + H * 4   # the weight as stored: fp8 + its scales
    assert op("lm_head").flops == inst[-1].cost.flops == 2 * 32 * H * M.vocab
    assert W.mixed(M, mix.chunks, mix.decodes).op("attention").cost == (
        W.prefill(M, 1, 2048, 1536).op("attention").cost + W.decode(M, 31, 2047).op("attention").cost)
