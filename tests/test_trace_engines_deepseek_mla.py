"""A vLLM V1 decode step of DeepSeek-V3 on one rank of 8 (tensor parallel, FP8 128x128 weight blocks with 1x128
activation groups, FlashMLA, ``--enforce-eager``): 16 sequences at 8,192 keys. Names and layouts follow vLLM's
sources: ``_C::per_token_group_fp8_quant(input, output_q, output_s, group_size, ...)``, ``_C::cutlass_scaled_mm``
with [K/128, N/128] weight scales, the absorbed MLA (``aten::bmm`` with W_UK and W_UV), ``_C_cache_ops::
concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)``, FlashMLA's
``_flashmla_C::fwd_kvcache_mla`` (``flash_fwd_splitkv_mla_kernel`` then ``flash_fwd_mla_combine_kernel``),
``_moe_C::grouped_topk`` and ``vllm::outplace_fused_experts(hidden, w1 [E, 2I, H], w2 [E, H, I], topk_weights,
topk_ids, ...)`` (``moe_align_block_size``, ``_per_token_group_quant_fp8``, ``fused_moe_kernel`` twice,
``_C::silu_and_mul`` and ``_moe_C::moe_sum`` nested), the custom all-reduce. The first 3 layers are dense. Every
kernel's FLOPs and bytes are worked by hand."""

import math

import pytest

from roofline.models import PRESETS
from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace

from engine_traces import BF, F32, FP8, I32, I64, EngineTrace

M = PRESETS["deepseek-v3"]
TP = 8
T, H, Q, KV, ROPE, NOPE, VD = 16, 7168, 1536, 512, 64, 128, 128
HQ = 128 // TP                                  # heads per rank
E, K, I, S, DENSE = 256, 8, 2048 // TP, 2048 // TP, 18432 // TP
CTX = 8192
MIX = f"decode={T}x{CTX}"
MM = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass_3x_gemm_fp8_blockwise_sm90>>"
QK = "void vllm::per_token_group_quant_8bit_kernel<c10::BFloat16, c10::Float8_e4m3fn>"
FMLA = "void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t>>"
COMBINE = "void flash::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, float, 512, 32>"
AR = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>"
NORM = "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>"


def blocks(n):
    return math.ceil(n / 128)


def quant(t, rows, cols, us=2):
    t.op("_C::per_token_group_fp8_quant", [[rows, cols], [rows, cols], [rows, blocks(cols)], [], [], [], [], []],
         [BF, FP8, F32, "int", "double", "double", "double", "bool"], kernels=[(QK, us)])


def mm8(t, k, n, us):
    t.op("_C::cutlass_scaled_mm", [[T, n], [T, k], [k, n], [T, blocks(k)], [blocks(k), blocks(n)], []],
         [BF, FP8, FP8, F32, F32, ""], kernels=[(MM, us)])


def rms(t, width, us=2, add=False):
    if add:
        t.op("_C::fused_add_rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], kernels=[(NORM, us)])
    else:
        t.op("_C::rms_norm", [[T, width], [T, width], [width], []], [BF, BF, BF, "double"],
             kernels=[("void vllm::rms_norm_kernel<c10::BFloat16>", us)])


def all_reduce(t):
    t.op("_C_custom_ar::all_reduce", [[], [T, H], [T, H], [], []], ["long int", BF, BF, "long int", "long int"],
         kernels=[(AR, 8)])


def attention(t):
    rms(t, H, 3, add=True)
    quant(t, T, H)
    mm8(t, H, Q + KV + ROPE, 6)                                    # fused q_a + kv_a projection (replicated)
    rms(t, Q)
    rms(t, KV)
    quant(t, T, Q)
    mm8(t, Q, HQ * (NOPE + ROPE), 4)                               # q_b projection (this rank's heads)
    t.op("aten::bmm", [[HQ, T, NOPE], [HQ, NOPE, KV]], [BF, BF], kernels=[("nvjet_bmm_q_absorb", 3)])   # q W_UK
    t.op("_C::rotary_embedding", [[T], [T, HQ * ROPE], [T, ROPE], [], [163840, ROPE], []],
         [I64, BF, BF, "int", BF, "bool"], ["", "", "", "64", "", "False"],
         kernels=[("void vllm::rotary_embedding_kernel<c10::BFloat16, false>", 2)])
    t.op("_C_cache_ops::concat_and_cache_mla", [[T, KV], [T, ROPE], [4096, 64, KV + ROPE], [T], [], []],
         [BF, BF, BF, I64, "str", F32], ["", "", "", "", "auto", ""],
         kernels=[("void vllm::concat_and_cache_mla_kernel<__nv_bfloat16>", 2)])
    t.op("_flashmla_C::fwd_kvcache_mla", [[T, 1, HQ, KV + ROPE], [4096, 64, 1, KV + ROPE], [], [T], [T, 128], [], [],
                                          [132, 8], [T + 1]], [BF, BF, "int", I32, I32, "double", "bool", I32, I32],
         kernels=[(FMLA, 50), (COMBINE, 3)])
    t.op("aten::bmm", [[HQ, T, KV], [HQ, KV, VD]], [BF, BF], kernels=[("nvjet_bmm_o_absorb", 3)])       # o W_UV
    quant(t, T, HQ * VD)
    mm8(t, HQ * VD, H, 6)                                          # o_proj (row parallel)
    all_reduce(t)
    rms(t, H, 3, add=True)


def dense_mlp(t):
    quant(t, T, H)
    mm8(t, H, 2 * DENSE, 12)
    t.op("_C::silu_and_mul", [[T, DENSE], [T, 2 * DENSE]], [BF, BF], kernels=[("void vllm::act_and_mul_kernel", 2)])
    quant(t, T, DENSE)
    mm8(t, DENSE, H, 8)
    all_reduce(t)


def moe(t):
    t.op("aten::mm", [[T, H], [H, E]], [BF, BF], kernels=[("nvjet_tst_router", 4)])
    t.op("_moe_C::grouped_topk", [[T, E], [], [], [], [], [], [E], []], [F32, "int", "int", "int", "bool", "double",
                                                                            F32, "str"],
         kernels=[("void vllm::moe::grouped_topk_fused_kernel<float>", 3)])
    t.op("vllm::outplace_fused_experts", [[T, H], [E, 2 * I, H], [E, H, I], [T, K], [T, K]],
         [BF, FP8, FP8, F32, I32], kernels=[
             ("void moe_align_block_size_kernel<int>", 2), ("_per_token_group_quant_fp8", 2), ("fused_moe_kernel", 40),
             {"op": ("_C::silu_and_mul", [[T * K, I], [T * K, 2 * I]], [BF, BF], None,
                     [("void vllm::act_and_mul_kernel", 2)])},
             ("_per_token_group_quant_fp8", 2), ("fused_moe_kernel", 25),
             {"op": ("_moe_C::moe_sum", [[T, K, H], [T, H]], [BF, BF], None,
                     [("void vllm::moe::moe_sum_kernel<c10::BFloat16, 8>", 2)])}])
    quant(t, T, H)                                                 # the shared expert
    mm8(t, H, 2 * S, 5)
    t.op("_C::silu_and_mul", [[T, S], [T, 2 * S]], [BF, BF], kernels=[("void vllm::act_and_mul_kernel", 2)])
    quant(t, T, S)
    mm8(t, S, H, 4)
    all_reduce(t)


def build(tmp_path):
    t = EngineTrace(world_size=TP)
    with t.step(f"execute_context_0(0)_generation_{T}({T})"):
        t.op("aten::embedding", [[129280 // TP, H], [T]], [BF, I64], kernels=[("void at::native::indexSelect", 2)])
        t.op("_flashmla_C::get_mla_metadata", [[T], [], []], [I32, "int", "int"],
             kernels=[("void get_mla_metadata_kernel<>", 2)])
        for layer in range(M.n_layers):
            attention(t)
            (dense_mlp if layer in M.dense_layers else moe)(t)
        rms(t, H, 3)
        t.op("aten::mm", [[T, H], [H, 129280 // TP]], [BF, BF], kernels=[("nvjet_tst_lm_head", 30)])
    return read_trace(t.dump(tmp_path / "deepseek_mla_decode.json")), t.kernel_us


# ---- by hand
def q8(rows, cols):      # 1x128-group dynamic fp8: abs-max and scale per element; bf16 in, fp8 out, fp32 scales
    return 2 * rows * cols, rows * cols * 2 + rows * cols + rows * blocks(cols) * 4


def w8(k, n):            # a 128x128-block fp8 weight as stored: its elements and one fp32 scale per block
    return k * n + blocks(k) * blocks(n) * 4


def g8(k, n):            # W8A8 block GEMM: A fp8 + the weight + C bf16 + A's group scales
    return 2 * T * k * n, T * k + w8(k, n) + T * n * 2 + T * blocks(k) * 4


def bmm(b, m, k, n):
    return 2 * b * m * k * n, b * (m * k * 2 + k * n * 2 + m * n * 2)


ROWS = T * K
DISTINCT = E * (1 - (1 - K / E) ** T)
HAND = {
    "add_norm": (5 * T * H, 4 * T * H * 2 + H * 2), "q_norm": (4 * T * Q, 2 * T * Q * 2 + Q * 2),
    "kv_norm": (4 * T * KV, 2 * T * KV * 2 + KV * 2),
    "q_h": q8(T, H), "q_q": q8(T, Q), "q_o": q8(T, HQ * VD), "q_d": q8(T, DENSE), "q_s": q8(T, S),
    "qkv_a": g8(H, Q + KV + ROPE), "q_b": g8(Q, HQ * (NOPE + ROPE)), "o": g8(HQ * VD, H),
    "gate_up_d": g8(H, 2 * DENSE), "down_d": g8(DENSE, H), "gate_up_s": g8(H, 2 * S), "down_s": g8(S, H),
    "uk": bmm(HQ, T, NOPE, KV), "uv": bmm(HQ, T, KV, VD),
    "rope": (3 * T * (HQ + 1) * ROPE, 2 * T * (HQ + 1) * ROPE * 2 + T * ROPE * 4),
    "cache": (0, T * (KV + ROPE) * (2 + 2)),
    # absorbed MLA decode: per head per key the latent score (rank + rope) and the latent output (rank); the
    # latent cache read once per sequence, shared by the 16 heads; q (rank + rope) read, o (rank) written
    "mla": (2 * T * HQ * CTX * (KV + ROPE) + 2 * T * HQ * CTX * KV,
            T * CTX * (KV + ROPE) * 2 + T * HQ * (2 * KV + ROPE) * 2),
    "silu_d": (5 * T * DENSE, 3 * T * DENSE * 2), "silu_s": (5 * T * S, 3 * T * S * 2),
    "silu_e": (5 * ROWS * I, 3 * ROWS * I * 2),
    "router": (2 * T * H * E, T * H * 2 + H * E * 2 + T * E * 2),
    # sigmoid 3E + the correction bias E + group scores (E + 2 x 8 groups) + top-k E + renorm 2k + scale k
    "topk": ((3 * E + E + (E + 2 * 8) + E + 2 * K + K) * T, T * E * 4 + 12 * T * K + 4 * E),
    "qe_h": q8(T, H), "qe_i": q8(ROWS, I),
    "up": (2 * ROWS * 2 * H * I + 5 * ROWS * I,
           DISTINCT * 2 * w8(H, I) + T * H * 2 + ROWS * I * 2 + 8 * ROWS),
    "down": (2 * ROWS * H * I + ROWS * H + T * (K - 1) * H,
             DISTINCT * w8(I, H) + ROWS * I * 2 + 2 * ROWS * H * 2 + T * H * 2 + 4 * ROWS),
    "ar": (0, 0),
}
ATTN = ["add_norm", "q_h", "qkv_a", "q_norm", "kv_norm", "q_q", "q_b", "uk", "rope", "cache", "mla", None, "uv", "q_o",
        "o", "ar", "add_norm"]
DENSE_MLP = ["q_h", "gate_up_d", "silu_d", "q_d", "down_d", "ar"]
# the alignment and the sum are one uncosted instance, charged to vllm::outplace_fused_experts (no rule costs it)
MOE = ["router", "topk", None, "qe_h", "up", "silu_e", "qe_i", "down", "q_h", "gate_up_s", "silu_s", "q_s", "down_s",
       "ar"]


def test_every_kernel_of_the_mla_decode_costs_what_the_hand_says(tmp_path):
    tr, _ = build(tmp_path)
    r = analyze_trace(tr, model=M, mix=MIX)
    inst = r.instances                  # in the order their first kernel ran
    body, at = inst[2:-2], 0
    for layer in range(M.n_layers):
        for what in ATTN + (DENSE_MLP if layer in M.dense_layers else MOE):
            i = body[at]
            at += 1
            if what is None:             # FlashMLA's split-KV combine, the MoE's alignment and sum: uncosted
                assert i.cost is None and i.off == "uncosted", (layer, i.name)
                continue
            assert (i.cost.flops, i.cost.bytes) == pytest.approx(HAND[what], rel=1e-12), (layer, what, i.name,
                                                                                          i.signature)
    assert at == len(body)
    bookkeeping = [i for i in inst if i.name == "vllm::outplace_fused_experts"]
    assert len(bookkeeping) == 58 and bookkeeping[0].seconds == pytest.approx(4e-6)   # align 2 + sum 2 us
    mla = next(i for i in inst if i.name == FMLA[:80])
    assert mla.category == "attention" and mla.signature == "decode=16x8192 h16 latent 512+64 kv bf16"
    up = next(i for i in inst if i.name == "fused_moe_kernel")
    assert up.category == "moe" and up.compute_dtype == "fp8"
    assert up.signature == "gate+up T16 E256 top8 H7168 I256 fp8-block"
    ar = next(i for i in inst if i.name == "_C_custom_ar::all_reduce")
    assert ar.category == "communication" and ar.detail["message_bytes"] == T * H * 2


def test_the_mla_decode_is_costed_past_95_percent_of_its_gpu_time(tmp_path):
    tr, kernel_us = build(tmp_path)
    s = analyze_trace(tr, model=M, mix=MIX).summary
    assert s["attributed_s"] == pytest.approx(kernel_us * 1e-6, rel=1e-9)
    moe_layers = M.n_layers - len(M.dense_layers)
    uncosted_us = 2 + M.n_layers * 3 + moe_layers * (2 + 2)   # get_mla_metadata; combine; align and sum per MoE
    assert s["uncosted_s"] == pytest.approx(uncosted_us * 1e-6, rel=1e-9)
    assert 1 - s["uncosted_share"] >= 0.95
    assert s["communication_s"] == pytest.approx(M.n_layers * 2 * 8e-6, rel=1e-9)
