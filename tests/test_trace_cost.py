"""The trace cost table: each op from recorded shapes through roofline.formulas, exactly; unknown ops uncosted."""

from roofline import formulas as F
from roofline.cost import Cost
from roofline.traces.cost import FRAMEWORK, cost_op

BF, F32, FP8 = "c10::BFloat16", "float", "c10::Float8_e4m3fn"


def op(name, dims, types, concrete=None, **extra):
    return cost_op(name, {"Input Dims": dims, "Input type": types,
                          "Concrete Inputs": concrete or [""] * len(dims), **extra})


def test_gemm_family():
    # addmm(bias [N], A [M,K], B [K,N]): the bias is read once and added once per output
    c = op("aten::addmm", [[1024], [8, 4096], [4096, 1024]], [BF, BF, BF])
    assert c.cost == F.gemm(8, 4096, 1024, bias=1024) and c.category == "gemm" and c.compute_dtype == "bf16"
    assert c.cost.flops == 2 * 8 * 4096 * 1024 + 8 * 1024
    assert op("aten::bmm", [[16, 1, 128], [16, 128, 9]], [BF, BF]).cost == F.gemm(1, 128, 9, batch=16)
    assert op("aten::baddbmm", [[16, 1, 9], [16, 1, 128], [16, 128, 9]], [BF, BF, BF]).cost == \
        F.gemm(1, 128, 9, batch=16, bias=16 * 9)
    # _scaled_mm(A fp8, B fp8, scale_a, scale_b, bias, scale_result, out_dtype=15 (bf16), fast_accum)
    c = op("aten::_scaled_mm", [[64, 4096], [4096, 4096], [], [], [], [], [], []],
           [FP8, FP8, F32, F32, "", "", "Scalar", "Scalar"], ["", "", "", "", "", "", "15", "False"])
    assert c.cost == F.gemm(64, 4096, 4096, a_dtype="fp8", b_dtype="fp8", out_dtype="bf16") and c.compute_dtype == "fp8"
    # a wrapper's own cost (used only when it launched a kernel with nothing costed below it)
    assert op("aten::linear", [[2, 8, 4096], [1024, 4096], [1024]], [BF, BF, BF]).cost == \
        F.gemm(16, 4096, 1024, bias=1024)


def test_attention_variants():
    pre = F.prefill_attention(2, 128, 32, 8, 128)
    q, k = [2, 32, 128, 128], [2, 8, 128, 128]
    # SDPA(q, k, v, attn_mask, dropout_p, is_causal=True, scale, enable_gqa)
    c = op("aten::scaled_dot_product_attention", [q, k, k, [], [], [], [], []], [BF, BF, BF, "", "Scalar", "Scalar",
                                                                                    "", "Scalar"],
           ["", "", "", "", "0.", "True", "", "True"])
    assert c.cost == pre and c.category == "attention" and "assumed" not in c.signature
    # flash (is_causal at 4), efficient and cudnn (at 6): the same cost
    assert op("aten::_scaled_dot_product_flash_attention", [q, k, k, [], [], [], []], [BF] * 3 + ["Scalar"] * 4,
              ["", "", "", "0.", "True", "False", ""]).cost == pre
    assert op("aten::_scaled_dot_product_efficient_attention", [q, k, k, [], [], [], [], []],
              [BF] * 3 + [""] + ["Scalar"] * 4, ["", "", "", "", "False", "0.", "True", ""]).cost == pre
    # [B, S, H, D] layout: _flash_attention_forward(q, k, v, cum_q, cum_k, max_q, max_k, dropout, is_causal, ...)
    qb, kb = [2, 128, 32, 128], [2, 128, 8, 128]
    assert op("aten::_flash_attention_forward", [qb, kb, kb] + [[]] * 6, [BF] * 3 + [""] * 6,
              ["", "", "", "", "", "128", "128", "0.", "True"]).cost == pre
    # a cached prefix: 32 new queries over 160 keys, causal: n*p + n*n/2 pairs
    c = op("aten::scaled_dot_product_attention", [[1, 32, 32, 128], [1, 8, 160, 128], [1, 8, 160, 128]],
           [BF] * 3, ["", "", "", "", "", "True"])
    assert c.cost == F.prefill_attention(1, 32, 32, 8, 128, cached_tokens=128)
    # an explicit mask and no is_causal: causal assumed for a decoder, and said so
    c = op("aten::scaled_dot_product_attention", [q, k, k, [2, 1, 128, 128]], [BF, BF, BF, "bool"],
           ["", "", "", "", "", "False"])
    assert c.cost == pre and "causal assumed" in c.signature
    # one query per sequence: the decode formula, no halving
    c = op("aten::scaled_dot_product_attention", [[4, 32, 1, 128], [4, 8, 1000, 128], [4, 8, 1000, 128]], [BF] * 3,
           ["", "", "", "", "", "False"])
    assert c.cost == F.decode_attention(4, 1000, 32, 8, 128)


def test_llm_custom_ops():
    assert op("_C::rms_norm", [[16, 4096], [16, 4096], [4096], []], [BF, BF, BF, "double"]).cost == \
        F.rmsnorm(16, 4096)
    assert op("_C::fused_add_rms_norm", [[16, 4096], [16, 4096], [4096], []], [BF, BF, BF, "double"]).cost == \
        F.add_rmsnorm(16, 4096)
    assert op("aten::rms_norm", [[2, 8, 4096], [], [4096], []], [BF, "ScalarList", BF, "double"]).cost == \
        F.rmsnorm(16, 4096)
    assert op("_C::silu_and_mul", [[16, 14336], [16, 28672]], [BF, BF]).cost == F.swiglu(16, 14336)
    # rotary_embedding(positions, query [T, Hq*D], key [T, Hkv*D], head_size, cos_sin_cache, is_neox)
    c = op("_C::rotary_embedding", [[16], [16, 4096], [16, 1024], [], [8192, 128], []],
           ["long int", BF, BF, "Scalar", BF, "Scalar"], ["", "", "", "128", "", "True"])
    assert c.cost == F.rope(16, 32, 8, 128) and c.category == "rope"
    c = op("_C_cache_ops::reshape_and_cache_flash", [[16, 8, 128], [16, 8, 128], [1000, 16, 8, 128],
                                                      [1000, 16, 8, 128], [16], [], [], []],
           [BF, BF, "unsigned char", "unsigned char", "long int", "", F32, F32],
           ["", "", "", "", "", "fp8", "", ""])
    assert c.cost == F.kv_append(16, 8, 128, kv_dtype="fp8", kv_scales=False)   # vLLM: per-tensor k/v scales
    # flash-attn varlen for one sequence (cu_seqlens [2]) is exact; a batch of them is uncosted
    q, k = [100, 32, 128], [100, 8, 128]
    types = [BF] * 3 + ["int"] * 2 + [""] * 5
    one = op("flash_attn::_flash_attn_varlen_forward", [q, k, k, [2], [2]] + [[]] * 5, types,
             ["", "", "", "", "", "100", "100", "0.", "", "True"])
    assert one.cost == F.prefill_attention(1, 100, 32, 8, 128)
    assert op("flash_attn::_flash_attn_varlen_forward", [q, k, k, [5], [5]] + [[]] * 5,
              [BF] * 3 + ["int"] * 2 + [""] * 5) is None
    assert op("_C::paged_attention_v2", [[4, 32, 128], [4, 32, 128]], [BF, BF]) is None


def test_collectives_are_communication_with_wire_bytes():
    meta = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "Group size": 8,
            "dtype": "BFloat16"}
    c = op("record_param_comms", [[1024, 1024]], [BF], **meta)
    assert c.category == "communication" and c.cost == Cost(0, 0)
    # 2 MiB message; ring all-reduce over 8 ranks: 2 x 7/8 of it on the wire
    assert c.detail["message_bytes"] == 2 * (1 << 20) and c.detail["wire_bytes"] == 2 * 7 / 8 * 2 * (1 << 20)


def test_elementwise_reductions_copies_gathers():
    # a Python scalar is a 0-dim "double": an argument, not a tensor read; float + scalar stays float
    c = op("aten::add", [[8, 1], [], []], [F32, "double", "Scalar"], ["", "", "1"])
    assert c.cost == F.elementwise(8, ((8, "fp32"),), out_dtype="fp32")
    # broadcast: [8,64] * [64] reads the row once
    assert op("aten::mul", [[8, 64], [64]], [BF, BF]).cost == F.elementwise(512, ((512, "bf16"), (64, "bf16")))
    # comparisons write bool; rsqrt is not a FLOP; silu is 4
    assert op("aten::lt", [[9], [9]], ["long int", "long int"]).cost == Cost(9, 9 * 8 * 2 + 9)
    assert op("aten::rsqrt", [[8, 1]], [F32]).cost == Cost(0, 64)
    assert op("aten::silu_", [[8, 176]], [BF]).cost == F.elementwise(1408, ((1408, "bf16"),), flops_per_element=4)
    assert op("aten::mean", [[8, 64], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""]).cost \
        == F.reduction(512, 8, in_dtype="fp32")
    # softmax(x, dim, dtype=6 (fp32)): bf16 in, fp32 out
    assert op("aten::softmax", [[4, 9], [], []], [BF, "Scalar", "Scalar"], ["", "-1", "6"]).cost == \
        F.softmax(4, 9, in_dtype="bf16", out_dtype="fp32")
    assert op("aten::copy_", [[4096], [4096], []], [BF, F32, "Scalar"]).cost == F.copy(4096, src_dtype="fp32",
                                                                                       dst_dtype="bf16")
    c = op("aten::cat", [[[8, 8], [8, 8]], []], ["TensorList", "Scalar"], ["", "-1"])
    assert c.cost == F.copy(128, src_dtype="bf16") and "dtype assumed" in c.signature
    assert op("aten::embedding", [[32000, 4096], [1, 7]], [BF, "long int"]).cost == F.embedding(7, 4096)
    assert op("aten::index_put_", [[2, 2, 64, 16], [], [8, 2, 16], []], [BF, "", BF, "Scalar"]).cost == \
        F.copy(256, src_dtype="bf16")
    assert op("aten::arange", [[], [], [], [], [], []], ["Scalar"] * 2 + [""] * 3 + ["Scalar"],
              ["0", "8", "", "", "", "False"]).cost == F.fill(8, dtype="int64")


def test_framework_and_unknown():
    assert op("aten::view", [[8, 64], []], [BF, "ScalarList"]) == FRAMEWORK
    assert op("aten::nonzero", [[8]], ["bool"]) is None               # not in the table: uncosted
    assert op("aten::index", [[256, 64], []], [F32, ""]) is None      # its index tensors are not recorded
    assert cost_op("aten::mm", {}) is None                            # no shapes recorded
    assert op("aten::mm", [[8, 64, 2], [64, 32]], [BF, BF]) is None   # shapes the table does not expect
