"""Cost formulas pinned to exact integers, arithmetic beside each number."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roofline import formulas as F
from roofline.cost import Cost


def test_seed_weight_bytes_and_intensity():
    # 4,096 x 4,096 x 2 bytes = 33,554,432 bytes
    c1 = F.linear(1, 4096, 4096)
    assert 4096 * 4096 * 2 == 33_554_432
    # 1 token: 2 x 4,096 x 4,096 = 33,554,432 FLOPs
    assert c1.flops == 33_554_432
    assert F.weight_only_intensity(1, 4096, 4096) == 1.0
    # 1,024 tokens: 1,024 x 33,554,432 = 34,359,738,368 FLOPs; / 33,554,432 bytes = 1,024
    c = F.linear(1024, 4096, 4096)
    assert c.flops == 34_359_738_368
    assert F.weight_only_intensity(1024, 4096, 4096) == 1024.0
    # full bytes add x and y: 33,554,432 + 1,024 x (4,096 + 4,096) x 2 = 50,331,648
    assert c.bytes == 50_331_648


def test_quantized_weights_cost_fewer_bytes():
    # int4: 4,096 x 4,096 x 0.5 = 8,388,608 weight bytes; scales: 4,096 / 128 = 32 groups x 4,096 x 2 = 262,144;
    # x and y stay bf16: 2 x 4,096 x 2 = 16,384
    assert F.linear(1, 4096, 4096, weight_dtype="int4").bytes == 8_388_608 + 262_144 + 16_384
    # int8 weights: 16,777,216 + one bf16 scale per output channel 4,096 x 2 = 8,192 + 16,384
    assert F.linear(1, 4096, 4096, weight_dtype="int8").bytes == 16_777_216 + 8_192 + 16_384


def test_elementwise_ops():
    # rmsnorm: 4 FLOPs/elem: 4 x 3 x 8 = 96; bytes 2 x 3 x 8 x 2 + 8 x 2 = 112
    assert F.rmsnorm(3, 8) == Cost(96, 112)
    # fused add+rmsnorm: 5 x 24 = 120 FLOPs; 4 x 24 x 2 + 16 = 208 bytes
    assert F.add_rmsnorm(3, 8) == Cost(120, 208)
    # swiglu: 5 x 2 x 10 = 100 FLOPs; 3 x 20 x 2 = 120 bytes
    assert F.swiglu(2, 10) == Cost(100, 120)
    # residual: 1 x 24 FLOPs; 3 x 24 x 2 = 144 bytes
    assert F.residual_add(3, 8) == Cost(24, 144)
    # rope: elems = 2 x (4 + 2) x 8 = 96; 3 x 96 = 288 FLOPs; 2 x 96 x 2 + 2 x 8 x 4 = 448 bytes
    assert F.rope(2, 4, 2, 8) == Cost(288, 448)
    # embedding: 0 FLOPs; 5 x 16 x 2 (rows) + 5 x 16 x 2 (out) + 5 x 8 (ids) = 360 bytes
    assert F.embedding(5, 16) == Cost(0, 360)
    # kv_append: elems = 2 x 3 x 2 x 8 = 96; read bf16 + write fp8: 96 x 2 + 96 x 1 = 288;
    # + fp32 scales per token per KV head for K and V: 2 x 3 x 2 x 4 = 48
    assert F.kv_append(3, 2, 8, kv_dtype="fp8") == Cost(0, 288 + 48)


def test_prefill_attention_causal_gqa_prefix():
    B, S, Hq, Hkv, D = 2, 16, 8, 2, 64
    # non-causal: 4 x B x Hq x S x S x D = 4 x 2 x 8 x 16 x 16 x 64 = 1,048,576
    nc = F.prefill_attention(B, S, Hq, Hkv, D, causal=False)
    assert nc.flops == 1_048_576
    # causal: halved: 524,288
    assert F.prefill_attention(B, S, Hq, Hkv, D).flops == 524_288
    # bytes: q,o: 2 x 2 x 16 x 8 x 64 x 2 = 65,536; K,V once per KV head: 2 x 2 x 16 x 2 x 64 x 2 = 16,384
    assert nc.bytes == 65_536 + 16_384
    # cached prefix p=32: pairs = 16 x 32 + 16 x 16 / 2 = 640; flops = 4 x 2 x 8 x 64 x 640 = 2,621,440
    c = F.prefill_attention(B, S, Hq, Hkv, D, cached_tokens=32)
    assert c.flops == 2_621_440
    # K,V for 48 tokens: 2 x 2 x 48 x 2 x 64 x 2 = 49,152
    assert c.bytes == 65_536 + 49_152


def test_decode_attention():
    # 4 x B x Hq x S x D = 4 x 1 x 32 x 1,024 x 128 = 16,777,216
    c = F.decode_attention(1, 1024, 32, 32, 128)
    assert c.flops == 16_777_216
    # KV: 2 x 1 x 1,024 x 32 x 128 x 2 = 16,777,216; q,o: 2 x 32 x 128 x 2 = 16,384
    assert c.bytes == 16_777_216 + 16_384


def test_gqa_kv_bytes_are_a_quarter():
    # llama-3-8b: 8 KV heads of 128 vs 32: a quarter of the bytes per token
    gqa = F.kv_cache_bytes(1, 32, 8, 128)
    mha = F.kv_cache_bytes(1, 32, 32, 128)
    assert gqa == 2 * 32 * 8 * 128 * 2 == 131_072
    assert gqa * 4 == mha


def test_cost_adds_and_scales():
    a, b = Cost(10, 4), Cost(6, 4)
    assert a + b == Cost(16, 8)
    assert sum([a, b]) == Cost(16, 8)
    assert 3 * a == Cost(30, 12) == a * 3
    assert (a + b).intensity == 2.0
    assert Cost(5, 0).intensity == math.inf
    with pytest.raises(ValueError):
        Cost(-1, 0)


sizes = st.integers(min_value=1, max_value=8192)


@given(t=sizes, k=sizes, n=sizes)
def test_linear_flops_linear_in_tokens(t, k, n):
    assert F.linear(2 * t, k, n).flops == 2 * F.linear(t, k, n).flops


@given(t1=sizes, t2=sizes, k=sizes, n=sizes)
def test_weight_bytes_independent_of_tokens(t1, t2, k, n):
    # bytes minus activation traffic = weight bytes, the same for any token count
    w = lambda t: F.linear(t, k, n).bytes - t * (k + n) * 2  # noqa: E731
    assert w(t1) == w(t2) == k * n * 2


@given(b=st.integers(1, 4096), k=sizes, n=sizes)
def test_decode_linear_intensity_grows_with_batch(b, k, n):
    assert F.linear(b + 1, k, n).intensity > F.linear(b, k, n).intensity


@given(s=st.integers(1, 100_000), hq=st.sampled_from([8, 32, 64]), g=st.sampled_from([1, 4, 8]))
def test_decode_attention_intensity_does_not_grow_with_context(s, hq, g):
    hkv = hq // g
    i1 = F.decode_attention(1, s, hq, hkv, 128).intensity
    i2 = F.decode_attention(1, 2 * s, hq, hkv, 128).intensity
    assert i2 <= i1 * (1 + 1e-9) or i2 < hq / hkv + 1e-9
    # bounded by Hq/Hkv FLOP per KV byte-pair: 4 x Hq x D per token / (2 x Hkv x D x 2 bytes) = Hq/Hkv
    assert i2 <= hq / hkv


def test_trace_formulas_exact():
    """The generic ops a profiler trace costs (roofline.traces.cost), arithmetic beside each number."""
    # gemm [8,4096]x[4096,4096] bf16: 2 x 8 x 4096 x 4096 = 268,435,456 FLOPs;
    # bytes A 8 x 4096 x 2 = 65,536 + B 4096 x 4096 x 2 = 33,554,432 + C 65,536 = 33,685,504: linear's exactly
    assert F.gemm(8, 4096, 4096) == Cost(268_435_456, 33_685_504) == F.linear(8, 4096, 4096)
    # batched with a bias row [N]: FLOPs 3 x (2 x 4 x 5 x 6) + 3 x 4 x 5 = 780; bytes 3 x (24 + 30 + 20) x 2 + 5 x 2 = 454
    assert F.gemm(4, 6, 5, batch=3, bias=5) == Cost(780, 454)
    # fp8 A and B, bf16 out (_scaled_mm): FLOPs 2 x 16 x 32 x 64 = 65,536; bytes 16 x 64 + 64 x 32 (fp8) + 16 x 32 x 2 = 4,096
    assert F.gemm(16, 64, 32, a_dtype="fp8", b_dtype="fp8", out_dtype="bf16") == Cost(65_536, 4_096)
    # elementwise add [8,4096] + a broadcast row [4096] in fp32: 32,768 FLOPs;
    # bytes 32,768 x 4 + 4,096 x 4 + 32,768 x 4 = 278,528
    assert F.elementwise(32_768, ((32_768, "fp32"), (4_096, "fp32")), out_dtype="fp32") == Cost(32_768, 278_528)
    # SiLU at 4 FLOPs per element (swiglu's count without the multiply): 4 x 100 = 400; bytes 100 x 2 x 2 = 400
    assert F.elementwise(100, ((100, "bf16"),), out_dtype="bf16", flops_per_element=4) == Cost(400, 400)
    # residual_add is elementwise with two inputs: 24 FLOPs, 3 x 24 x 2 = 144 bytes (unchanged)
    assert F.residual_add(3, 8) == F.elementwise(24, ((24, "bf16"), (24, "bf16"))) == Cost(24, 144)
    # mean over the last dim of [8,64] fp32: 512 FLOPs; bytes 512 x 4 + 8 x 4 = 2,080
    assert F.reduction(512, 8, in_dtype="fp32") == Cost(512, 2_080)
    # softmax [4, 9] fp32: 4 x 36 = 144 FLOPs; 36 x 4 x 2 = 288 bytes
    assert F.softmax(4, 9, in_dtype="fp32") == Cost(144, 288)
    # a cast of 4,096 fp32 to bf16: 0 FLOPs, 4,096 x 4 + 4,096 x 2 = 24,576 bytes
    assert F.copy(4_096, src_dtype="fp32", dst_dtype="bf16") == Cost(0, 24_576)
    # kv_append is a copy of the K and V rows: 2 x 3 x 2 x 8 = 96 elements, 96 x 2 + 96 x 1 = 288, plus our 8-bit
    # cache's per-token scales (2 x 3 x 2 x 4 = 48; a trace's framework keeps per-tensor ones: kv_scales=False)
    assert F.kv_append(3, 2, 8, kv_dtype="fp8", kv_scales=False) == F.copy(96, src_dtype="bf16", dst_dtype="fp8") \
        == Cost(0, 288)
    assert F.kv_append(3, 2, 8, kv_dtype="fp8") == Cost(0, 288 + 48)
    # fill 8 int64 (arange): 64 bytes; storage-only types have sizes too
    assert F.fill(8, dtype="int64") == Cost(0, 64)
    # all-reduce of 65,536 bytes over 2 ranks: 2 x 1/2 x 65,536 = 65,536 on the wire; over 8: 2 x 7/8 = 114,688
    assert F.collective_bytes("allreduce", 65_536, 2) == 65_536
    assert F.collective_bytes("all_reduce", 65_536, 8) == 114_688
    # all-gather of a 65,536-byte output over 4 ranks: 3/4 = 49,152; broadcast: the message
    assert F.collective_bytes("_allgather_base", 65_536, 4) == 49_152
    assert F.collective_bytes("broadcast", 1_000, 8) == 1_000


def test_linear_bias_adds_one_add_per_output_and_the_bias_read():
    # 3 tokens, 8 -> 5: 2 x 3 x 8 x 5 = 240 FLOPs + 3 x 5 = 15 adds = 255
    c = F.linear(3, 8, 5, bias=True)
    assert c.flops == 240 + 15 == 255
    # bytes: w 8 x 5 x 2 = 80; x 3 x 8 x 2 = 48; y 3 x 5 x 2 = 30; bias 5 x 2 = 10
    assert c.bytes == 80 + 48 + 30 + 10 == 168
    assert F.linear(3, 8, 5) == Cost(240, 158)
    # int8 weights keep their scale bytes: 40 + 5 x 2 (scales) + 48 + 30 + 10 (bias in bf16)
    assert F.linear(3, 8, 5, weight_dtype="int8", bias=True).bytes == 40 + 10 + 48 + 30 + 10


def test_geglu_counts_nine_flops_per_element():
    # 9 x 2 x 10 = 180 FLOPs; bytes as swiglu: 3 x 20 x 2 = 120
    assert F.geglu(2, 10) == Cost(180, 120)
    assert F.geglu(2, 10, act_dtype="fp32").bytes == F.swiglu(2, 10, act_dtype="fp32").bytes == 240


def test_window_pairs_three_pieces():
    # no window, or a window not yet full: n x p + n^2 / 2
    assert F.window_pairs(16, 32, None) == F.causal_pairs(16, 32) == 16 * 32 + 128 == 640
    assert F.window_pairs(16, 32, 48) == 640
    # p >= W: every query sees W keys: 16 x 40 = 640 ... with W = 32: 16 x 32 = 512
    assert F.window_pairs(16, 32, 32) == 512
    # between: p = 8, n = 40, W = 32: fill = 24: 24 x 8 + 24^2 / 2 = 192 + 288 = 480; then 16 x 32 = 512
    assert F.window_pairs(40, 8, 32) == 480 + 512 == 992
    # p = 0, n = 64, W = 32: 32^2 / 2 = 512, then 32 x 32 = 1,024
    assert F.window_pairs(64, 0, 32) == 1536
    with pytest.raises(ValueError, match="window must be"):
        F.window_pairs(64, 0, 0)


def test_prefill_attention_under_a_window():
    B, n, Hq, Hkv, D = 2, 64, 8, 2, 64
    c = F.prefill_attention(B, n, Hq, Hkv, D, window=32)
    # pairs 1,536 (above): 4 x 2 x 8 x 64 x 1,536 = 6,291,456
    assert c.flops == 6_291_456
    # q,o: 2 x 2 x 64 x 8 x 64 x 2 = 262,144; keys read min(0 + 64, 64 + 31) = 64: 2 x 2 x 64 x 2 x 64 x 2 = 65,536
    assert c.bytes == 262_144 + 65_536
    # a long cached prefix: p = 1,000, n = 64, W = 32: keys min(1,064, 64 + 31 = 95) = 95
    c = F.prefill_attention(B, n, Hq, Hkv, D, cached_tokens=1000, window=32)
    assert c.flops == 4 * 2 * 8 * 64 * (64 * 32) == 8_388_608
    assert c.bytes == 262_144 + 2 * 2 * 95 * 2 * 64 * 2 == 262_144 + 97_280
    # no window = today's numbers
    assert F.prefill_attention(B, n, Hq, Hkv, D, window=4096) == F.prefill_attention(B, n, Hq, Hkv, D)
    # an 8-bit cache's scales follow the keys read: 2 x (2 x 95) x 2 x 4 = 3,040
    q8 = F.prefill_attention(B, n, Hq, Hkv, D, cached_tokens=1000, window=32, kv_dtype="int8")
    assert q8.bytes == 262_144 + 2 * 2 * 95 * 2 * 64 + 3_040
    with pytest.raises(ValueError, match="causal"):
        F.prefill_attention(B, n, Hq, Hkv, D, window=32, causal=False)


def test_decode_attention_and_cache_under_a_window():
    # Mistral-7B (32 layers, 8 KV heads of 128, window 4,096), batch 1, context 16,384:
    # the KV read is 2 x 4,096 x 8 x 128 x 2 = 16,777,216 bytes a layer; x 32 = 536,870,912
    per_layer = F.decode_attention(1, 16384, 32, 8, 128, window=4096)
    assert per_layer.bytes - 2 * 32 * 128 * 2 == 16_777_216
    assert 32 * (per_layer.bytes - 16_384) == 536_870_912
    # FLOPs: 4 x 32 x 4,096 x 128 = 67,108,864 (not 4x that)
    assert per_layer.flops == 67_108_864
    # a length inside the window is unchanged
    assert F.decode_attention(2, 100, 32, 8, 128, window=4096) == F.decode_attention(2, 100, 32, 8, 128)
    # the cache holds at most W tokens: 2 x 4,096 x 32 x 8 x 128 x 2 = 536,870,912 for 16,384 tokens
    assert F.kv_cache_bytes(16384, 32, 8, 128, window=4096) == 536_870_912
    assert F.kv_cache_bytes(100, 32, 8, 128, window=4096) == F.kv_cache_bytes(100, 32, 8, 128) == 100 * 131_072
