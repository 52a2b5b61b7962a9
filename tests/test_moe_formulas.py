"""Issue 21: the MoE cost formulas (roofline.formulas: expected_distinct_experts, routing, router,
moe_expert_weight_bytes, moe_experts), pinned as exact numbers with the arithmetic shown."""

import itertools
import math

import pytest

from roofline import formulas as F


# ---------------------------------------------------------------- distinct experts

def test_distinct_uniform_mixtral():
    assert F.expected_distinct_experts(8, 2, 1) == 2.0                       # one token: its k experts
    assert F.expected_distinct_experts(8, 2, 4) == 5.46875                   # 8 * (1 - 0.75^4) = 8 * 0.68359375
    assert F.expected_distinct_experts(8, 2, 0) == 0.0
    assert F.expected_distinct_experts(8, 8, 3) == 8.0                       # k = E: every expert
    assert F.expected_distinct_experts(8, 2, 64) == pytest.approx(8 * (1 - 0.75 ** 64))
    assert 8 - F.expected_distinct_experts(8, 2, 64) < 1e-7                  # batch 64: all experts


def _exact_by_enumeration(E, k, T):
    """E[distinct] over every way T tokens pick k-subsets uniformly (brute force)."""
    subsets = list(itertools.combinations(range(E), k))
    total = sum(len(set().union(*choice)) for choice in itertools.product(subsets, repeat=T))
    return total / len(subsets) ** T


@pytest.mark.parametrize("E,k,T", [(4, 2, 2), (5, 2, 3), (4, 1, 3), (6, 3, 2)])
def test_distinct_uniform_equals_enumeration(E, k, T):
    assert F.expected_distinct_experts(E, k, T) == pytest.approx(_exact_by_enumeration(E, k, T), rel=1e-12)


def test_distinct_skew():
    # uniform skew reproduces the uniform formula exactly
    assert F.expected_distinct_experts(8, 2, 4, skew=[1 / 8] * 8) == pytest.approx(5.46875, rel=1e-15)
    # E=4, k=1, p = (1/2, 1/4, 1/4, 0), T=2: sum 1 - (1-p)^2 = 0.75 + 0.4375 + 0.4375 + 0 = 1.625
    assert F.expected_distinct_experts(4, 1, 2, skew=[0.5, 0.25, 0.25, 0.0]) == 1.625
    # E=4, k=2, p = (1/2, 1/4, 1/8, 1/8): q = k p = (1, 1/2, 1/4, 1/4); T=2: 1 + 0.75 + 0.4375 + 0.4375 = 2.625
    assert F.expected_distinct_experts(4, 2, 2, skew=[0.5, 0.25, 0.125, 0.125]) == 2.625
    # a skewed router touches fewer experts than a uniform one at the same batch
    assert F.expected_distinct_experts(4, 1, 2, skew=[0.5, 0.25, 0.25, 0.0]) < F.expected_distinct_experts(4, 1, 2)


def test_distinct_skew_matches_enumeration_k1():
    # k = 1: tokens draw expert e with probability p_e; brute force over the 3^3 outcomes
    p = [0.5, 0.3, 0.2]
    exact = sum(math.prod(p[e] for e in picks) * len(set(picks)) for picks in itertools.product(range(3), repeat=3))
    assert F.expected_distinct_experts(3, 1, 3, skew=p) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("kw,match", [(dict(n_experts=8, k=9, tokens=1), "1 <= k <= n_experts"),
                                      (dict(n_experts=4, k=1, tokens=1, skew=[0.5, 0.5]), "4 probabilities"),
                                      (dict(n_experts=2, k=1, tokens=1, skew=[0.7, 0.7]), "summing to 1"),
                                      (dict(n_experts=4, k=2, tokens=1, skew=[0.7, 0.1, 0.1, 0.1]), "1/k")])
def test_distinct_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        F.expected_distinct_experts(**kw)


# ---------------------------------------------------------------- expert GEMM

def test_expert_weight_bytes_mixtral():
    assert F.moe_expert_weight_bytes(4096, 14336) == 3 * 4096 * 14336 * 2 == 352_321_536
    # int4, g128: per [K, N] matrix K*N/2 + (K/128)*N*2 bytes of bf16 scales
    w = 4096 * 14336 // 2 + 4096 // 128 * 14336 * 2
    assert F.moe_expert_weight_bytes(4096, 14336, weight_dtype="int4") == 3 * w
    # GPT-OSS biases: 2I + H more elements per expert
    assert F.moe_expert_weight_bytes(64, 32, bias=True) == 3 * 64 * 32 * 2 + (2 * 32 + 64) * 2


def test_moe_experts_mixtral_layer_bytes():
    e = 352_321_536
    act = lambda T: 2 * T * 4096 * 2 + 2 * 2 * T * 14336 * 2 + 2 * 2 * T * 4096 * 2 + 12 * 2 * T  # noqa: E731
    assert F.moe_experts(1, 4096, 14336, 8, 2).bytes == 2 * e + act(1) == 704_806_936
    assert F.moe_experts(4, 4096, 14336, 8, 2).bytes == 5.46875 * e + act(4) == 1_926_758_400 + 655_456
    assert F.moe_experts(64, 4096, 14336, 8, 2).bytes == pytest.approx(8 * e + act(64), rel=1e-7)   # 7.99999992 experts
    assert F.moe_experts(4, 4096, 14336, 8, 2, distinct=3).bytes == 3 * e + act(4)   # a measured count


def test_moe_experts_flops_and_bytes_small():
    # T=3, H=16, I=8, E=4, k=2, distinct=2, silu, bf16
    c = F.moe_experts(3, 16, 8, 4, 2, distinct=2)
    # 2*6*3*16*8 = 4608 GEMM + 5*6*8 = 240 silu + 6*16 = 96 weight multiply + 3*1*16 = 48 sum
    assert c.flops == 4608 + 240 + 96 + 48 == 4992
    # weights 2 * 3*16*8*2 = 1536; x, y 2*3*16*2 = 192; h 2*6*8*2 = 192; partials 2*6*16*2 = 384; ids/w 12*6 = 72
    assert c.bytes == 1536 + 192 + 192 + 384 + 72 == 2376
    # swiglu_oai with biases: 10 per element, biases 6*(2*8 + 16) = 192 adds, bias bytes 2 * 32 * 2 = 128
    o = F.moe_experts(3, 16, 8, 4, 2, distinct=2, activation="swiglu_oai", bias=True)
    assert o.flops == 4608 + 480 + 96 + 48 + 192 == 5424
    assert o.bytes == 2376 + 128


def test_moe_experts_refusals():
    with pytest.raises(ValueError, match="silu, swiglu_oai"):
        F.moe_experts(1, 16, 8, 4, 2, activation="gelu")
    with pytest.raises(ValueError, match="between 0 and n_experts = 4"):
        F.moe_experts(1, 16, 8, 4, 2, distinct=5)


# ---------------------------------------------------------------- router

def test_routing_kinds():
    # T=2, E=8, k=2, fp32 logits; bytes 2*8*4 = 64 logits + 12*2*2 = 48 weights/ids
    assert F.routing(2, 8, 2, kind="softmax_topk") == F.Cost(2 * (32 + 8 + 3), 112)         # 4E + E + 2k-1
    assert F.routing(2, 8, 2, kind="softmax_topk", renorm=False).flops == 2 * 40
    assert F.routing(2, 8, 2, kind="topk_softmax") == F.Cost(2 * (8 + 8), 112)              # E + 4k
    # 3E + E bias + (E + 2*4) groups + E top-k + 2k renorm + k scale = 24 + 8 + 16 + 8 + 4 + 2 = 62
    ds = F.routing(2, 8, 2, kind="sigmoid_group", n_group=4, score_bias=True)
    assert ds == F.Cost(2 * 62, 112 + 32)
    with pytest.raises(ValueError, match="softmax_topk, topk_softmax, sigmoid_group"):
        F.routing(2, 8, 2, kind="softmax")


def test_router_gate_gemm():
    # Mixtral: T=4, H=4096, E=8, bf16: the gate GEMM 2*4*4096*8 = 262144 + routing 4*(40 + 3) = 172
    c = F.router(4, 4096, 8, 2)
    assert c.flops == 262_144 + 172
    # x 4*4096*2 + W 4096*8*2 + logits (bf16) written 4*8*2, then read 4*8*2 + weights/ids 12*4*2
    assert c.bytes == 32768 + 65536 + 64 + 64 + 96
    # GPT-OSS: a gate bias (T*E adds, E elements read)
    b = F.router(4, 64, 8, 4, kind="topk_softmax", gate_bias=True)
    assert b.flops == 2 * 4 * 64 * 8 + 4 * 8 + 4 * (8 + 16)


def test_a_phases_per_expert_and_dense_equivalent_bytes():
    """Mixtral-8x7B decode, batch 4: one expert over the 32 layers, and the dense equivalent (k = 2 experts read)."""
    from roofline.models import PRESETS
    from roofline.workload import decode

    ph = decode(PRESETS["mixtral-8x7b"], 4, 16)
    one = 3 * 4096 * 14336 * 2 * 32                 # gate, up, down of [4096 x 14336] in bf16, 32 layers
    assert ph.per_expert_bytes == one
    assert ph.expert_weight_bytes == ph.experts_touched * one
    assert ph.dense_equivalent_bytes == ph.weight_bytes - ph.expert_weight_bytes + 2 * one
    assert decode(PRESETS["llama-3-8b"], 4, 16).per_expert_bytes == 0.0
