"""MLA cost formulas (issue 21) pinned to exact integers, arithmetic beside each number."""

import pytest

from roofline import formulas as F
from roofline.cost import Cost

# DeepSeek-V3: 61 layers, 128 heads, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128
L, H, R, P, NOPE, V = 61, 128, 512, 64, 128, 128


def test_deepseek_v3_cache_bytes_exact():
    # 4,096 tokens x 61 layers x (512 + 64) x 2 bytes = 287,834,112
    assert F.mla_cache_bytes(4096, L, R, P, kv_dtype="bf16") == 287_834_112
    # fp8 latent: half; one token: 61 x 576 x 1 = 35,136
    assert F.mla_cache_bytes(1, L, R, P, kv_dtype="fp8") == 35_136


def test_mla_cache_is_far_below_the_dense_reading():
    # read as a dense Llama (128 KV heads x 192 dims for K and 128 for V, roughly 2 x 128 x 128 per token):
    # 2 x 4,096 x 61 x 128 x 128 x 2 = 16,374,562,816 bytes, ~57x the latent
    dense = F.kv_cache_bytes(4096, L, H, 128)
    assert dense == 16_374_562_816
    assert dense / F.mla_cache_bytes(4096, L, R, P) == pytest.approx(56.89, abs=0.01)


def test_absorbed_decode_deepseek_v3():
    c = F.mla_decode_attention(1, 4096, H, R, P, act_dtype="bf16", kv_dtype="bf16")
    # scores 2 x 128 x 4,096 x 576 = 603,979,776 + output 2 x 128 x 4,096 x 512 = 536,870,912
    assert c.flops == 1_140_850_688
    # latent read once per sequence (not per head): 4,096 x 576 x 2 = 4,718,592;
    # q (512 + 64) and o_latent (512) per head: 128 x 1,088 x 2 = 278,528
    assert c.bytes == 4_718_592 + 278_528
    # one layer's share of the model-wide cache figure: 287,834,112 / 61 = 4,718,592
    assert F.mla_cache_bytes(4096, L, R, P) / L == 4_718_592


def test_absorbed_decode_batch_and_dtypes():
    # B=3, S=10, H=2, R=8, P=4: flops 2 x 3 x 2 x 10 x 12 + 2 x 3 x 2 x 10 x 8 = 1,440 + 960 = 2,400
    # bytes: fp8 cache 3 x 10 x 12 x 1 = 360; fp32 q/o 3 x 2 x (16 + 4) x 4 = 480
    assert F.mla_decode_attention(3, 10, 2, 8, 4, act_dtype="fp32", kv_dtype="fp8") == Cost(2_400, 840)


def test_naive_prefill_no_prefix():
    # B=2, n=16, H=4, nope 8, rope 4, v 8; causal pairs 16 x 16 / 2 = 128
    c = F.mla_prefill_attention(2, 16, 4, 8, 4, 8)
    # 2 x 2 x 4 x 128 x 12 = 24,576 (q.k) + 2 x 2 x 4 x 128 x 8 = 16,384 (p.v)
    assert c.flops == 40_960
    # q + o: 2 x 4 x 16 x (12 + 8) x 2 = 5,120; k + v: the same over S_kv = 16 = 5,120
    assert c.bytes == 10_240


def test_naive_prefill_with_cached_prefix_reads_the_latent():
    # cached 32: pairs 16 x 32 + 128 = 640; flops 2 x 2 x 4 x 640 x 20 = 204,800
    c = F.mla_prefill_attention(2, 16, 4, 8, 4, 8, cached_tokens=32, kv_lora_rank=16)
    assert c.flops == 204_800
    # q + o 5,120; k + v over 48 tokens 2 x 4 x 48 x 20 x 2 = 15,360; latent prefix 2 x 32 x (16 + 4) x 2 = 2,560
    assert c.bytes == 5_120 + 15_360 + 2_560
    with pytest.raises(ValueError, match="kv_lora_rank"):
        F.mla_prefill_attention(2, 16, 4, 8, 4, 8, cached_tokens=32)


def test_naive_decode_vs_absorbed_deepseek_v3():
    # naive decode: one query (causal=False) over 4,096 expanded keys:
    # 2 x 128 x 4,096 x 192 + 2 x 128 x 4,096 x 128 = 335,544,320 FLOPs ...
    naive = F.mla_prefill_attention(1, 1, H, NOPE, P, V, cached_tokens=4095, kv_lora_rank=R, causal=False)
    assert naive.flops == 335_544_320
    # ... plus re-expanding the whole cache every step (kv_b_proj over 4,096 tokens): 2 x 4,096 x 128 x 512 x 256
    assert F.mla_absorb_flops(4096, H, NOPE, V, R) == 137_438_953_472
    # absorbed: 1,140,850,688 attention FLOPs + the absorption of one token 2 x 128 x 512 x 256 = 33,554,432
    assert F.mla_absorb_flops(1, H, NOPE, V, R) == 33_554_432
    absorbed = F.mla_decode_attention(1, 4096, H, R, P).flops + F.mla_absorb_flops(1, H, NOPE, V, R)
    assert absorbed == 1_174_405_120
    # K, V expanded (bf16): 4,096 x 128 x 320 x 2 = 335,544,320 bytes vs the latent's 4,718,592
    assert naive.bytes == 1 * 128 * (192 + 128) * 2 + 335_544_320 + 4095 * 576 * 2
