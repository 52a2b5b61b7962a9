"""What weight-only int8 / int4 weights and an 8-bit KV cache cost: exact integers, the arithmetic beside each.

Run: pytest tests/test_quant_costs.py
"""

import json

import pytest
from click.testing import CliRunner

from roofline import formulas as F
from roofline import workload as W
from roofline.cost import Cost
from roofline.errors import RooflineError
from roofline.models import PRESETS

TINY = PRESETS["tiny"]   # hidden 64, intermediate 176, 4 heads / 2 KV heads of 16, vocab 256, 2 layers


def test_int8_weights_count_one_scale_per_output_channel():
    # [2, 64] x [64, 48], fp32 activations: FLOPs 2 x 2 x 64 x 48 = 12,288
    # bytes: weights 64 x 48 x 1 = 3,072 + scales 48 x 4 = 192 + x, y 2 x (64 + 48) x 4 = 896 -> 4,160
    assert F.linear(2, 64, 48, weight_dtype="int8", act_dtype="fp32") == Cost(12_288, 4_160)
    assert F.weight_scale_bytes(64, 48, weight_dtype="int8", act_dtype="fp32") == 192
    # float weights carry no scales
    assert F.weight_scale_bytes(64, 48, weight_dtype="bf16") == 0


def test_int4_weights_are_half_a_byte_plus_group_scales():
    # [1, 128] x [128, 64] bf16, group 32: weights 128 x 64 / 2 = 4,096; scales 128 / 32 = 4 groups x 64 x 2 = 512;
    # x, y (128 + 64) x 2 = 384 -> 4,992
    assert F.linear(1, 128, 64, weight_dtype="int4", group_size=32).bytes == 4_096 + 512 + 384 == 4_992
    # group 64 with zero points, K = 256: 256 x 64 / 2 = 8,192; 4 groups x 64 x 2 bytes x 2 (scale, zero) = 1,024;
    # x, y (256 + 64) x 2 = 640 -> 9,856
    assert F.linear(1, 256, 64, weight_dtype="int4", group_size=64, zero_point=True).bytes == 9_856
    # the default group is 128: 4,096 x 4,096 / 2 = 8,388,608 + 32 x 4,096 x 2 = 262,144
    assert F.quantized_weight_bytes(4096, 4096, weight_dtype="int4") == 8_388_608 + 262_144


def test_an_8bit_kv_cache_counts_its_per_token_scales():
    # kv_append T=3, Hkv=2, D=8: read 2 x 3 x 2 x 8 = 96 bf16 (192) + write 96 int8 + scales 2 x 3 x 2 x 4 = 48 -> 336
    assert F.kv_append(3, 2, 8, kv_dtype="int8") == Cost(0, 192 + 96 + 48)
    # decode B=2, S=10, Hq=4, Hkv=2, D=8: FLOPs 4 x 2 x 4 x 10 x 8 = 2,560; K and V 2 x 2 x 10 x 2 x 8 = 640 int8
    # + scales 2 x (2 x 10) x 2 x 4 = 320; q and o 2 x 2 x 4 x 8 x 2 = 256 -> 1,216
    assert F.decode_attention(2, 10, 4, 2, 8, kv_dtype="int8") == Cost(2_560, 1_216)
    # prefill B=1, n=4 after 2 cached, Hq=2, Hkv=1, D=8: S_kv = 6; K, V 2 x 6 x 8 = 96 + scales 2 x 6 x 4 = 48;
    # q, o 2 x 4 x 2 x 8 x 2 = 256 -> 400; FLOPs 4 x 2 x 8 x (4 x 2 + 4 x 4 / 2) = 1,024
    assert F.prefill_attention(1, 4, 2, 1, 8, cached_tokens=2, kv_dtype="int8") == Cost(1_024, 400)
    # the cache itself: 10 tokens, 2 layers, Hkv 2, D 8: 2 x 10 x 2 x 2 x 8 = 640 + 2 layers x 160 of scales = 960
    assert F.kv_cache_bytes(10, 2, 2, 8, kv_dtype="int8") == 960
    # fp8 the same; a framework's per-tensor scales (a trace): none
    assert F.kv_cache_bytes(10, 2, 2, 8, kv_dtype="fp8", kv_scales=False) == 640


def test_the_workload_reads_every_quantized_weight_and_its_scales():
    # tiny, bf16 activations, int8 weights, per layer (K x N + N x 2):
    # wq 64 x 64 + 128 = 4,224; wk, wv 64 x 32 + 64 = 2,112 each; wo 4,224; gate, up 64 x 176 + 352 = 11,616 each;
    # down 176 x 64 + 128 = 11,392 -> 47,296 x 2 layers = 94,592; lm_head 64 x 256 + 512 = 16,896 -> 111,488
    ph = W.decode(TINY, 1, 8, weight_dtype="int8")
    assert ph.weight_bytes == 111_488
    assert ph.op("q_proj").cost.bytes == 4_224 + (64 + 64) * 2
    # int4 g32 on hidden-64 layers: wq 64 x 64 / 2 = 2,048 + 2 groups x 64 x 2 = 256
    ph4 = W.decode(TINY, 1, 8, weight_dtype="int4", group_size=32)
    assert ph4.op("q_proj").cost.bytes == 2_048 + 256 + (64 + 64) * 2
    # KV: decode at context 8 reads 9 tokens: 2 x 9 x 2 x 16 = 576 int8 + 2 x 9 x 2 x 4 = 144 scales; q, o 256
    assert W.decode(TINY, 1, 8, kv_dtype="int8").op("attention").cost.bytes == 576 + 144 + 256
    assert W.decode(TINY, 1, 8, kv_dtype="int8").kv_cache_read_bytes == 2 * (2 * 8 * 2 * 16 + 2 * 8 * 2 * 4)


def test_a_group_size_the_kernels_do_not_run_is_refused():
    with pytest.raises(RooflineError, match="group size must be one of 32, 64, 128, but 48 was given"):
        W.decode(TINY, 1, 8, weight_dtype="int4", group_size=48)


def test_explain_prints_the_scales():
    from profiler.cli import main

    r = CliRunner().invoke(main, ["explain", "linear", "--tokens", "1", "--in", "4096", "--out", "4096", "--dtype",
                                  "int4", "--group-size", "64", "--device", "h100", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    # 64 groups x 4,096 x 2 bytes = 524,288; + 8,388,608 + x, y 16,384
    assert d["scale_bytes"] == 524_288 and d["bytes"] == 8_388_608 + 524_288 + 16_384
    r = CliRunner().invoke(main, ["explain", "--model", "llama-3-8b", "--device", "h100", "--weight-dtype", "int8",
                                  "--kv-dtype", "fp8"])
    assert r.exit_code == 0 and "scales counted" in r.output
    r = CliRunner().invoke(main, ["explain", "--model", "llama-3-8b", "--group-size", "64"])
    assert r.exit_code != 0 and "--group-size and --zero-point describe int4 weights" in r.output
