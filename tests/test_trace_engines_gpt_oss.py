"""A vLLM V1 decode step of gpt-oss-20b (MXFP4 experts, bf16 attention) as a full CUDA-graph replay with its capture.

27 sequences decode at 2,048 keys; the graph was captured at 32 rows (CUDA-graph padding), so every linear and the
experts run 32 rows while attention runs the 27 sequences of the step. Names and layouts follow vLLM's sources
(``Worker.annotate_profile``: ``execute_context_0(0)_generation_27(27)``; ``vllm::moe_forward(hidden_states,
router_logits, layer_name)`` with triton_kernels' routing (``_topk_forward``, ``_combined_routing_compute``) and its
``_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1[_swiglu]`` launches; the Triton unified attention
``kernel_unified_attention_2d``; gpt-oss's sliding (128 keys) and full layers alternating). The capture trace is an
eager run of the same 32-row step (``--capture-trace``). Every kernel's FLOPs and bytes are worked by hand below."""

import pytest

from roofline.models import PRESETS
from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace

from engine_traces import BF, F32, I64, EngineTrace

M = PRESETS["gpt-oss-20b"]
T, H, HQ, HKV, D, E, K, I, V = 32, 2880, 64, 8, 64, 32, 4, 2880, 201088
B, CTX = 27, 2048
MIX = f"decode={B}x{CTX}"
UP = "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu"
DOWN = "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1"
NVJET = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
ATTN = "kernel_unified_attention_2d"


def layer_ops(sliding: bool):
    """(op, dims, types, concrete, kernels) of one layer at the captured 32 rows."""
    return [
        ("_C::fused_add_rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"],
         [("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>", 3)]),
        ("aten::addmm", [[5120], [T, H], [H, 5120], [], []], [BF, BF, BF, "Scalar", "Scalar"], None, [(NVJET, 8)]),
        ("_C::rotary_embedding", [[T], [T, HQ * D], [T, HKV * D], [], [131072, D], []],
         [I64, BF, BF, "int", BF, "bool"],
         ["", "", "", "64", "", "True"], [("void vllm::rotary_embedding_kernel<c10::BFloat16, true>", 2)]),
        ("_C_cache_ops::reshape_and_cache_flash", [[T, HKV, D], [T, HKV, D], [8192, 16, HKV, D], [8192, 16, HKV, D],
                                                    [T], [], [], []], [BF, BF, BF, BF, I64, "str", F32, F32],
         ["", "", "", "", "", "auto", "", ""], [("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", 2)]),
        ("vllm::unified_attention_with_output", [[T, HQ, D], [T, HKV, D], [T, HKV, D], [T, HQ, D], []],
         [BF, BF, BF, BF, "str"], None, [(ATTN, 9 if sliding else 14)]),
        ("aten::addmm", [[H], [T, HQ * D], [HQ * D, H], [], []], [BF, BF, BF, "Scalar", "Scalar"], None, [(NVJET, 6)]),
        ("_C::fused_add_rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"],
         [("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>", 3)]),
        ("aten::addmm", [[E], [T, H], [H, E], [], []], [BF, BF, BF, "Scalar", "Scalar"], None, [(NVJET, 3)]),
        ("vllm::moe_forward", [[T, H], [T, E], []], [BF, BF, "str"], None,
         [("_topk_forward", 3), ("_combined_routing_compute", 2), (UP, 30), (DOWN, 18)]),
    ]


def step_ops():
    ops = [("aten::embedding", [[V, H], [T]], [BF, I64], None, [("void at::native::indexSelectSmallIndex", 3)])]
    for layer in range(M.n_layers):
        ops += layer_ops(M.windows[layer] > 0)
    ops.append(("_C::rms_norm", [[T, H], [T, H], [H], []], [BF, BF, BF, "double"], ["", "", "", "1e-05"],
                [("void vllm::rms_norm_kernel<c10::BFloat16>", 3)]))
    return ops


LM_HEAD = ("aten::mm", [[B, H], [H, V]], [BF, BF], None, [("nvjet_tst_192x8_64x8_2x1_v_bz_TNT", 45)])


def build(tmp_path):
    cap = EngineTrace()
    for name, dims, types, concrete, kernels in step_ops():   # an eager run of the captured 32-row step
        cap.op(name, dims, types, concrete, kernels)
    rep = EngineTrace()
    with rep.step(f"execute_context_0(0)_generation_{B}({B})"):
        rep.graph([k for *_, kernels in step_ops() for k in kernels])
        rep.op(*LM_HEAD[:4], kernels=LM_HEAD[4])
    return (read_trace(rep.dump(tmp_path / "gpt_oss_replay.json")), read_trace(cap.dump(tmp_path / "gpt_oss_cap.json")),
            rep.kernel_us)


# ---- by hand, at the captured 32 rows (attention: the step's 27 sequences)
def addmm(k, n):     # 2MNK + MN (the bias); x, W, y, the bias once, all bf16
    return 2 * T * k * n + T * n, T * k * 2 + k * n * 2 + T * n * 2 + n * 2


D_EXPERTS = E * (1 - (1 - K / E) ** T)           # distinct experts 32 tokens touch under uniform top-4 routing
MX = H * I * 4 / 8 + (H // 32) * I * 1           # an [H, I] MXFP4 weight: e2m1 elements + one e8m0 scale per 32
ROWS = T * K
HAND = {
    "norm": (5 * T * H, 4 * T * H * 2 + H * 2),
    "qkv": addmm(H, 5120), "o": addmm(HQ * D, H), "router": addmm(H, E),
    "rope": (3 * T * (HQ + HKV) * D, 2 * T * (HQ + HKV) * D * 2 + T * D * 4),
    "cache": (0, 2 * T * HKV * D * (2 + 2)),
    # decode: 27 sequences, one query each over min(2048, window) keys; K, V once per KV head; q and o
    "attn_sliding": (4 * B * HQ * 128 * D, 2 * B * 128 * HKV * D * 2 + 2 * B * HQ * D * 2),
    "attn_full": (4 * B * HQ * CTX * D, 2 * B * CTX * HKV * D * 2 + 2 * B * HQ * D * 2),
    # top-k of the 32 logits, then a softmax over the 4 chosen (GPT-OSS): E + 4k per token; logits read (bf16),
    # the fp32 weights and int64 ids written
    "topk": ((E + 4 * K) * T, T * E * 2 + 12 * T * K),
    # gate+up: 2 x rows x 2HI, swiglu_oai's 10 per element, the 2I bias adds; the distinct experts' gate and up
    # weights with their biases, x read, h written, the ids
    "up": (2 * ROWS * 2 * H * I + 10 * ROWS * I + ROWS * 2 * I,
           D_EXPERTS * (2 * MX + 2 * I * 2) + T * H * 2 + ROWS * I * 2 + 8 * ROWS),
    # down: 2 x rows x HI, the routing weight multiply, the sum of each token's 4 outputs, the H bias adds; down
    # weights and biases, h read, the partial outputs written and read, y written, the weights
    "down": (2 * ROWS * H * I + ROWS * H + T * (K - 1) * H + ROWS * H,
             D_EXPERTS * (MX + H * 2) + ROWS * I * 2 + 2 * ROWS * H * 2 + T * H * 2 + 4 * ROWS),
}
LAYER = ["norm", "qkv", "rope", "cache", "attn", "o", "norm", "router", "topk", "routing", "up", "down"]


def test_every_replayed_kernel_costs_what_the_hand_says(tmp_path):
    rep, cap, _ = build(tmp_path)
    r = analyze_trace(rep, model=M, captures=[cap], mix=MIX)
    inst = sorted(r.instances, key=lambda i: i.t)
    layers = inst[1:1 + M.n_layers * len(LAYER)]
    for n, i in enumerate(layers):
        what = LAYER[n % len(LAYER)]
        if what == "routing":           # the routing's compute of sizes and offsets: tensor values, uncosted
            assert i.cost is None and i.category == "moe" and i.off == "uncosted"
            continue
        if what == "attn":
            what = "attn_sliding" if M.windows[n // len(LAYER)] else "attn_full"
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(HAND[what], rel=1e-12), (n, what, i.name, i.signature)
    up = layers[LAYER.index("up")]
    assert up.category == "moe" and up.name == UP and up.compute_dtype == "bf16"   # bf16 x mxfp4: dequantized
    assert up.signature == "gate+up T32 E32 top4 H2880 I2880 mxfp4" and "uniform routing" in up.note
    assert layers[LAYER.index("attn")].signature == "decode=27x2048 h64/8 d64 window 128 kv bf16"
    assert layers[len(LAYER) + LAYER.index("attn")].signature == "decode=27x2048 h64/8 d64 kv bf16"


def test_the_experts_are_moe_not_reduction_or_attention_and_the_step_is_costed_past_95_percent(tmp_path):
    rep, cap, kernel_us = build(tmp_path)
    s = analyze_trace(rep, model=M, captures=[cap], mix=MIX).summary
    assert s["attributed_s"] == pytest.approx(kernel_us * 1e-6, rel=1e-9)
    assert s["by_category_s"]["moe"] == pytest.approx(M.n_layers * (3 + 2 + 30 + 18) * 1e-6, rel=1e-9)
    assert s["uncosted_s"] == pytest.approx(M.n_layers * 2 * 1e-6, rel=1e-9)     # _combined_routing_compute only
    share = 1 - s["uncosted_share"]
    assert share == pytest.approx(1 - 24 * 2 / kernel_us, rel=1e-9) and share >= 0.95
    step, = s["engine_steps"]["steps"]
    assert step["mix"] == MIX and step["mode"] == "decode" and step["decode_requests"] == B
    # the 27 sequences ran as the graph captured at 32 rows: 5 rows of every linear's work wasted
    assert step["gemm_rows"] == T and step["padding_tokens"] == T - B
    assert step["costed_share"] == pytest.approx(share, rel=1e-9) and step["gpu_s"] == pytest.approx(kernel_us * 1e-6)
    assert "27 tokens as the captured 32" in s["engine_steps"]["notes"][0]
    # without --model the experts, routing and attention have no sizes: uncosted, their time counted
    bare = analyze_trace(rep, captures=[cap], mix=MIX).summary
    moe_and_attention = sum(3 + 2 + 30 + 18 + (9 if M.windows[n] else 14) for n in range(M.n_layers))
    assert bare["uncosted_s"] == pytest.approx(moe_and_attention * 1e-6, rel=1e-9)


def test_a_replay_without_its_capture_takes_the_decode_batch_from_the_annotation(tmp_path):
    """No attention op with its lengths (a replay, no capture): the decode's batch is the vLLM annotation's 27
    sequences, not the GEMM rows' guess; its context is said to be unknown."""
    replay = build(tmp_path)[0]
    dec = analyze_trace(replay).summary["phases"]["decode"]
    assert (dec["batch"], dec["context"]) == (27, 0)
    assert dec["how"] == "batch from its vllm step annotation (context unknown: no attention op with its lengths)"
