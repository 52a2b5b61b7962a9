"""Expert parallelism and MoE tensor parallelism in the cost model (issue 21, "Cost model": --tp / --ep for MoE).

Run: pytest tests/test_expert_parallel.py   (pure: no torch, no processes)
"""

import json

import pytest
from click.testing import CliRunner

from roofline import formulas as F
from roofline import workload as W
from roofline.capacity import capacity, weight_bytes
from roofline.devices import find_device
from roofline.errors import RooflineError
from roofline.interconnect import NVLINK4
from roofline.layer import model_ops
from roofline.models import load_model
from roofline.parallel import ranks, shard, valid_ep

MIX = load_model("mixtral-8x7b")      # E=8, k=2, H=4096, I=14336, 32 MoE layers
DS3 = load_model("deepseek-v3")       # E=256, k=8, H=7168, I=2048, 58 MoE layers of 61, one shared expert
ONE_MIX_EXPERT = 3 * 4096 * 14336 * 2  # 352,321,536 bytes in bf16
ONE_DS3_EXPERT = 3 * 7168 * 2048 * 2   # 88,080,384 bytes in bf16


def _coll(ph):
    return {c.name: c for c in ph.collectives}


# ---------------------------------------------------------------- formulas


def test_all_to_all_bytes_wire_and_nccl_tests_bus_bandwidth_are_exact():
    # Mixtral decode, batch 8, 8 ranks: each rank sends its 1 token's 2 routed copies of 4,096 bf16
    assert F.moe_all_to_all_bytes(8, 2, 4096, 8) == 16_384
    assert F.moe_all_to_all_bytes(8, 8, 7168, 8, act_dtype="fp32") == 8 * 8 * 7168 * 4 / 8
    assert F.collective_bytes("all_to_all", 16_384, 8) == 14_336          # (N-1)/N: 1/8 stays home
    assert F.collective_bytes("alltoall", 16_384, 8) == 14_336            # nccl-tests' / torch's spelling
    assert F.collective_steps("all_to_all", 8) == 7
    algbw, busbw = F.bus_bandwidth("all_to_all", 16_384, 1e-6, 8)          # nccl-tests: busbw = algbw (N-1)/N
    assert algbw == pytest.approx(16_384e6) and busbw == pytest.approx(16_384e6 * 7 / 8)
    # time over NVLink 4: latency 6.6 us + 7 steps x 0.6 us, plus 14,336 bytes / 450 GB/s
    assert NVLINK4.time("all_to_all", 16_384, 8) == pytest.approx(6.6e-6 + 7 * 0.6e-6 + 14_336 / 450e9)
    with pytest.raises(ValueError, match="at least 1 rank"):
        F.moe_all_to_all_bytes(8, 2, 4096, 0)


def test_rank_load_uniform_and_skewed_busiest_rank():
    rows, d = F.moe_rank_load(8, 2, 8, 8)
    assert rows == 2 and d == pytest.approx(1 - 0.75 ** 8)
    rows, d = F.moe_rank_load(256, 8, 8, 8)
    assert rows == 8 and d == pytest.approx(32 * (1 - (1 - 8 / 256) ** 8))
    # skew: experts 0, 1 take half the slots; rank 0 (experts 0-3 of 8 over 2 ranks) is the busiest
    skew = [0.25, 0.25, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]
    rows, d = F.moe_rank_load(8, 2, 4, 2, skew=skew)
    assert rows == pytest.approx(4 * 2 * 0.75)
    assert d == pytest.approx(2 * (1 - 0.5 ** 4) + 2 * (1 - 0.75 ** 4))
    with pytest.raises(ValueError, match="divides the 8 experts"):
        F.moe_rank_load(8, 2, 4, 3)


def test_moe_experts_ep_exact_flops_and_bytes():
    c = F.moe_experts_ep(8, 4096, 14336, 8, 2, 8)        # rows 2, own tokens 1, distinct 1 - 0.75^8
    rows, own, H, I = 2, 1, 4096, 14336
    assert c.flops == 2 * rows * 3 * H * I + 5 * rows * I + rows * H + own * 1 * H
    d = 1 - 0.75 ** 8
    assert c.bytes == pytest.approx(d * ONE_MIX_EXPERT + rows * H * 2 + 2 * rows * I * 2 + rows * H * 2
                                    + own * 2 * H * 2 + own * H * 2 + 12 * rows)
    # the FLOPs of the N ranks add up to one device's (the x gathers differ: bytes do not)
    one = F.moe_experts(8, 4096, 14336, 8, 2)
    assert 8 * c.flops == one.flops


# ---------------------------------------------------------------- sharding


def test_shard_sizes_tp_slices_every_expert_ep_holds_whole_ones():
    t = shard(MIX, 2)
    assert (t.ep, t.n_experts, t.moe_intermediate) == (2 - 1, 8, 7168)
    e = shard(MIX, 8, 8)
    assert (e.tp, e.ep, e.n_experts, e.moe_intermediate, e.n_heads, e.n_kv_heads) == (8, 8, 1, 14336, 4, 1)
    assert list(e.experts(3)) == [3] and list(t.experts(1)) == list(range(8))
    d = shard(DS3, 8, 8)
    assert (d.n_experts, d.moe_intermediate, d.n_heads) == (32, 2048, 16) and list(d.experts(7)) == list(range(224, 256))
    # the op list takes the experts' sizes from the shard
    ex = {o.name: o for o in model_ops(DS3, d)}["experts"]
    assert ex.weights[0].shape == (32, 7168, 2048) and ex.dims["ep"] == 8 and ex.dims["n_experts"] == 256
    ex_tp = {o.name: o for o in model_ops(DS3, shard(DS3, 2))}["experts"]
    assert ex_tp.weights[2].shape == (256, 1024, 7168) and ex_tp.dims["intermediate"] == 1024
    assert ranks(1, 8) == (8, 8) and ranks(8, 8) == (8, 8) and ranks(4, 1) == (4, 1)


def test_refusals_are_one_line_and_name_the_valid_sizes():
    cases = [
        (lambda: shard(MIX, 16, 16), "--ep 16 cannot split mixtral-8x7b's 8 experts", "Valid --ep for it: 1, 2, 4, 8"),
        (lambda: shard(DS3, 3, 3), "--ep 3 cannot split deepseek-v3's 256 experts", "Valid --ep for it: 1, 2, 4, 8"),
        (lambda: shard(load_model("llama-3-8b"), 8, 8), "has no routed experts", "use --tp 8"),
        (lambda: shard(MIX, 4, 8), "--ep must be 1 or equal --tp", "--tp 8 --ep 8"),
        (lambda: W.decode(MIX, 1, 16, tp=2, ep=4), "--ep must be 1 or equal --tp", "--ep 4 alone"),
        (lambda: shard(MIX, 1, 0), "--ep must be a whole number", "at least 1"),
        (lambda: shard(MIX, 1, True), "--ep must be a whole number", "True"),
    ]
    for call, what, hint in cases:
        with pytest.raises(RooflineError) as e:
            call()
        msg = str(e.value)
        assert what in msg and hint in msg and "\n" not in msg, msg
    assert valid_ep(MIX) == [1, 2, 4, 8] and valid_ep(load_model("llama-3-8b")) == [1]
    # DeepSeek-V3's 128 heads allow --ep up to 128 of its 256 experts
    assert valid_ep(DS3)[-1] == 128 and 256 not in valid_ep(DS3)


# ---------------------------------------------------------------- a step's collectives and costs


def test_mixtral_decode_ep8_collectives_and_experts_exact():
    ph = W.decode(MIX, 8, 16, ep=8)                        # --ep 8 alone: 8 ranks, attention tp 8
    assert (ph.tp, ph.ep) == (8, 8)
    c = _coll(ph)
    assert list(c) == ["embedding_allreduce", "attn_allreduce", "moe_dispatch", "moe_combine", "lm_head_gather"]
    for name in ("moe_dispatch", "moe_combine"):
        a = c[name]
        assert (a.kind, a.count, a.ranks, a.launches) == ("all_to_all", 32, 8, 1)
        assert a.message_bytes == 16_384 and a.wire_bytes == 14_336       # 8*2*4096*2/8, 7/8 of it
    assert c["attn_allreduce"].count == 32 and c["attn_allreduce"].message_bytes == 8 * 4096 * 2
    ex = ph.op("experts")
    assert ex.count == 32 and ex.cost == F.moe_experts_ep(8, 4096, 14336, 8, 2, 8)
    assert ph.experts_touched == pytest.approx(1 - 0.75 ** 8)
    assert ph.expert_weight_bytes == pytest.approx(32 * (1 - 0.75 ** 8) * ONE_MIX_EXPERT)
    # per step, over all ranks: T*k*H*2 bytes dispatched per MoE layer = 8 ranks x their messages
    assert 8 * c["moe_dispatch"].message_bytes == 8 * 2 * 4096 * 2


def test_mixtral_tp2_slices_every_expert_and_all_reduces():
    ph = W.decode(MIX, 8, 16, tp=2)
    c = _coll(ph)
    assert "moe_dispatch" not in c and c["mlp_allreduce"].count == 32
    assert c["mlp_allreduce"].wire_bytes == 2 * 1 / 2 * 8 * 4096 * 2
    ex = ph.op("experts")
    assert ex.cost == F.moe_experts(8, 4096, 7168, 8, 2, distinct=8 * (1 - 0.75 ** 8))
    assert ph.expert_weight_bytes == pytest.approx(32 * 8 * (1 - 0.75 ** 8) * ONE_MIX_EXPERT / 2)


def test_deepseek_v3_ep8_and_tp2_exact():
    ph = W.decode(DS3, 8, 4096, tp=8, ep=8)
    c = _coll(ph)
    # 58 MoE layers: two all-to-alls each; the shared expert keeps an all-reduce on every layer (3 dense + 58)
    assert c["moe_dispatch"].count == c["moe_combine"].count == 58
    assert c["moe_dispatch"].message_bytes == 8 * 8 * 7168 * 2 / 8 == 114_688
    assert c["moe_dispatch"].wire_bytes == 114_688 * 7 / 8
    assert c["mlp_allreduce"].count == 61 and c["attn_allreduce"].count == 61
    d = 32 * (1 - (1 - 8 / 256) ** 8)
    assert ph.experts_touched == pytest.approx(d)
    assert ph.expert_weight_bytes == pytest.approx(58 * d * ONE_DS3_EXPERT)
    assert ph.op("experts").cost == F.moe_experts_ep(8, 7168, 2048, 256, 8, 8)
    t2 = W.decode(DS3, 8, 4096, tp=2)
    c2 = _coll(t2)
    assert "moe_dispatch" not in c2 and c2["mlp_allreduce"].count == 61
    assert t2.op("experts").cost == F.moe_experts(8, 7168, 1024, 256, 8)
    # the same 4-row routing at both: ep reads 1/4 of tp 2's expert bytes per rank (8 ranks of whole experts
    # against 2 of half experts)
    assert t2.expert_weight_bytes == pytest.approx(4 * ph.expert_weight_bytes)


def test_prefill_in_chunks_sums_the_all_to_alls_over_chunks():
    ph = W.prefill(MIX, 2, 1000, chunk=400, ep=8)           # chunks 400, 400, 200 of 2 sequences
    a = _coll(ph)["moe_dispatch"]
    assert a.launches == 3 and a.message_bytes == 2 * 1000 * 2 * 4096 * 2 / 8 and "in 3 chunks" in a.shape


def test_capacity_counts_each_ranks_experts():
    h = find_device("h100")
    full = weight_bytes(MIX)
    ep8 = weight_bytes(MIX, 8, ep=8)
    tp8 = weight_bytes(MIX, 8)
    experts = 32 * 8 * ONE_MIX_EXPERT
    # tp 8 and ep 8 hold the same bytes of experts per rank (1/8 of every one, or one whole one)
    assert full - experts == pytest.approx(8 * (tp8 - experts / 8), rel=0.01)
    assert ep8 == pytest.approx(tp8) and ep8 - (tp8 - experts / 8) == 32 * ONE_MIX_EXPERT
    ds = capacity(DS3, h, 1, 4096, ep=8)
    assert (ds.tp, ds.ep) == (8, 8) and ds.weight_bytes == weight_bytes(DS3, 8, ep=8)
    one = capacity(DS3, h, 1, 4096, ep=2)      # 1.34 TB of bf16 weights over 2 H100s: does not fit; the --ep hint
    assert one.weight_bytes == weight_bytes(DS3, 2, ep=2) and 6.7e11 < one.weight_bytes < 6.75e11
    assert not one.fits and one.min_tp == 32 and "--ep 32 fits" in one.sentence   # 16 ranks: 84 GB each
    assert one.to_dict()["ep"] == 2


# ---------------------------------------------------------------- explain


def test_explain_ep_prints_the_all_to_alls_and_the_communication_share():
    from profiler.cli import main

    args = ["explain", "--model", "mixtral-8x7b", "--device", "h100", "--phase", "decode", "--batch", "64",
            "--context", "16"]
    r = CliRunner().invoke(main, args + ["--ep", "8"])
    assert r.exit_code == 0, r.output
    assert "expert parallel over 8 ranks" in r.output and "moe_dispatch" in r.output and "moe_combine" in r.output
    assert "per all-to-all (nccl-tests' alltoall" in r.output and "all-to-alls" in r.output
    d = json.loads(CliRunner().invoke(main, args + ["--ep", "8", "--tp", "8", "--json"]).output)
    assert (d["tp"], d["ep"], d["capacity"]["ep"]) == (8, 8, 8)
    coll = {c["name"]: c for c in d["collectives"]}
    assert coll["moe_dispatch"]["message_bytes"] == 64 * 2 * 4096 * 2 / 8 and coll["moe_dispatch"]["count"] == 32
    kinds = d["communication"]["by_kind"]
    assert kinds["all_to_all"]["wire_bytes"] == 2 * 32 * coll["moe_dispatch"]["wire_bytes"]
    assert sum(k["time_s"] for k in kinds.values()) == pytest.approx(d["communication"]["time_s"])
    assert d["experts"]["rank_experts"] == 1 and d["experts"]["all_experts_bytes"] == pytest.approx(
        32 * ONE_MIX_EXPERT)
    bad = CliRunner().invoke(main, args + ["--tp", "2", "--ep", "8"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "--ep must be 1 or equal --tp" in bad.output
    zero = CliRunner().invoke(main, args + ["--ep", "0"])
    assert zero.exit_code == 2 and "expert-parallel ranks, at least 1" in zero.output


def test_an_expert_width_tp_cannot_slice_is_refused_and_ep_holds_it_whole():
    from dataclasses import replace

    odd = replace(load_model("tiny-moe"), name="odd-moe", moe_intermediate=50)     # 50 experts' columns
    with pytest.raises(RooflineError, match=r"expert width 50 does not divide into 4 ranks .*--ep holds whole") as e:
        shard(odd, 4)
    assert "Valid --tp for it: 1, 2." in str(e.value)
    s = shard(odd, 4, 4)
    assert (s.n_experts, s.moe_intermediate) == (2, 50)
    ph = W.decode(odd, 4, 8, ep=4)
    assert ph.op("experts").cost == F.moe_experts_ep(4, 64, 50, 8, 2, 4)
