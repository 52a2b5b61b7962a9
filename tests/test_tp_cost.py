"""Tensor parallelism as a cost model: Megatron sharding, the collectives of a step, bus bandwidth, the verdict.

Run: pytest tests/test_tp_cost.py   (pure: no torch, no processes)
"""

import json

import pytest
from click.testing import CliRunner

from roofline import formulas as F
from roofline import workload as W
from roofline.analysis import analyze
from roofline.bounds import COMMUNICATION, analyze_phase
from roofline.cost import Cost
from roofline.devices import CATALOGUE, Device, custom_link, find_device
from roofline.errors import RooflineError
from roofline.interconnect import NVLINK4, Interconnect
from roofline.models import ModelConfig, load_model
from roofline.parallel import COLLECTIVE_OPS, shard, valid_tp
from roofline.records import Measurement, ResultFile, RunHeader, WorkloadPoint

L2 = load_model("llama-2-7b")       # 32 heads, 32 KV heads, vocab 32,000
L3 = load_model("llama-3-8b")       # 32 heads, 8 KV heads
L70 = load_model("llama-3-70b")     # 64 heads, 8 KV heads, vocab 128,256
SHARDED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "swiglu", "attention",
           "rope", "kv_append", "lm_head")
REPLICATED = ("attn_norm", "mlp_norm", "attn_residual", "mlp_residual", "final_norm")


def phases(cfg, tp):
    kw = dict(tp=tp)
    return {"decode": W.decode(cfg, 4, 1000, **kw), "prefill": W.prefill(cfg, 2, 512, **kw),
            "chunked": W.prefill(cfg, 1, 1000, cached_tokens=100, chunk=256, **kw)}


@pytest.mark.parametrize("cfg, tp", [(L2, 2), (L2, 8), (L3, 2), (L3, 8), (L70, 8)])
def test_per_rank_cost_times_ranks_is_the_single_device_cost_exactly(cfg, tp):
    for name, ph in phases(cfg, tp).items():
        one = phases(cfg, 1)[name]
        for op in SHARDED:
            a, b = ph.op(op).cost, one.op(op).cost
            assert a.flops * tp == b.flops, (name, op)                 # exact integers (floats hold them exactly)
        for op in REPLICATED:                                          # every rank does the whole [T, H]
            assert ph.op(op).cost == one.op(op).cost
        # what is split is split exactly: the weights, the KV cache and its writes; the [T, H] activations
        # a linear reads or writes, and rope's cos/sin rows, are every rank's
        assert ph.weight_bytes * tp == one.weight_bytes and ph.kv_cache_read_bytes * tp == one.kv_cache_read_bytes
        assert ph.op("kv_append").cost.bytes * tp == one.op("kv_append").cost.bytes
        if len(ph.chunks) == 1:                                        # (chunked: summed over its chunks)
            T = ph.batch * ph.new_tokens
            assert ph.op("gate_proj").cost == F.linear(T, cfg.hidden, cfg.intermediate // tp)


def test_tp_1_is_exactly_todays_model():
    for cfg in (L2, L3, L70):
        for kind in ("decode", "prefill", "chunked"):
            a, b = phases(cfg, 1)[kind], {"decode": W.decode(cfg, 4, 1000), "prefill": W.prefill(cfg, 2, 512),
                                          "chunked": W.prefill(cfg, 1, 1000, cached_tokens=100, chunk=256)}[kind]
            assert [(o.name, o.cost, o.count) for o in a.ops] == [(o.name, o.cost, o.count) for o in b.ops]
            assert a.collectives == () and a.total == b.total and a.weight_bytes == b.weight_bytes


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    sh = shard(L70, 16)                           # 64 / 16 = 4 query heads per rank, 8 KV heads < 16 ranks
    assert (sh.n_heads, sh.n_kv_heads, sh.kv_replicas) == (4, 1, 2)
    assert [list(sh.kv_heads(r)) for r in (0, 1, 2, 15)] == [[0], [0], [1], [7]]
    one, tp = W.decode(L70, 1, 1000), W.decode(L70, 1, 1000, tp=16)
    # each KV head lives on 2 ranks: k_proj's FLOPs x 16 ranks = 2x the single device's
    assert tp.op("k_proj").cost.flops * 16 == 2 * one.op("k_proj").cost.flops
    assert tp.kv_cache_read_bytes * 8 == one.kv_cache_read_bytes      # one of 8 KV heads per rank


def test_collective_bytes_per_step_equal_the_formula_exactly():
    B, ctx, tp = 4, 1000, 8
    ph = W.decode(L70, B, ctx, tp=tp)
    assert [c.name for c in ph.collectives] == list(COLLECTIVE_OPS)
    msg = B * 8192 * 2                                             # [T=4, 8192] bf16 = 65,536 bytes
    ag = B * 128_256 * 2                                           # [4, 128,256] bf16 logits, gathered
    # ring all-reduce: 2(N-1)/N of the message; all-gather: (N-1)/N of the gathered output
    assert F.collective_bytes("all_reduce", msg, 8) == 114_688
    assert F.collective_bytes("all_gather", ag, 8) == 897_792
    expect = (2 * 80 + 1) * 114_688 + 897_792                      # 2 per layer + the embedding's + the gather
    assert ph.collective_wire_bytes == expect == 19_362_560
    assert ph.collective("attn_allreduce").count == 80 and ph.collective("lm_head_gather").count == 1
    # chunked prefill: one launch per chunk, the same bytes as one message of all new tokens
    ch = W.prefill(L70, 1, 1000, cached_tokens=100, chunk=256, tp=tp)
    c = ch.collective("mlp_allreduce")
    assert c.launches == 4 and c.message_bytes == 900 * 8192 * 2


def test_a_vocabulary_the_ranks_do_not_divide_is_padded():
    cfg = ModelConfig("odd-vocab", 64, 176, 2, 4, 2, 250, 512)
    sh = shard(cfg, 4)
    assert (sh.vocab_padded, sh.vocab) == (252, 63)
    assert W.decode(cfg, 1, 8, tp=4).op("lm_head").cost == F.lm_head(1, 64, 63)


def test_bad_tp_is_one_line_naming_the_valid_sizes():
    with pytest.raises(RooflineError, match=r"--tp 3 cannot split llama-2-7b: its 32 attention heads do not divide "
                                            r"into 3 ranks .* Valid --tp for it: 1, 2, 4, 8, 16, 32\.$"):
        W.decode(L2, 1, 10, tp=3)
    with pytest.raises(RooflineError, match="at least 1, but 0 was given"):
        W.decode(L2, 1, 10, tp=0)
    assert valid_tp(L3) == [1, 2, 4, 8, 16, 32]          # 16 and 32 replicate the 8 KV heads
    with pytest.raises(RooflineError, match="multiple of 8"):
        shard(ModelConfig("x", 768, 2048, 2, 24, 8, 100, 64), 12)


def test_collective_time_is_latency_plus_wire_bytes_over_the_link():
    # NVLink 4: 450 GB/s per direction; NCCL's tuning model: 6.6 us + 0.6 us per ring step
    assert NVLINK4.bandwidth == 450e9
    t = NVLINK4.time("all_reduce", 65_536, 8)               # 14 steps; 114,688 bytes on the wire
    assert t == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 114_688 / 450e9)
    assert NVLINK4.time("all_reduce", 65_536, 1) == 0.0     # one rank moves nothing
    assert F.collective_steps("all_gather", 8) == 7 and F.collective_steps("allreduce", 2) == 2


def test_bus_bandwidth_is_nccl_tests_definition_on_a_worked_example():
    # all_reduce_perf: 64 MiB over 8 ranks in 1 ms: algbw = 67.108864 GB/s, busbw = x 2*7/8 = 117.440512 GB/s
    algbw, busbw = F.bus_bandwidth("all_reduce", 67_108_864, 1e-3, 8)
    assert algbw == pytest.approx(67.108864e9, rel=1e-12) and busbw == pytest.approx(117.440512e9, rel=1e-12)
    # all_gather_perf: the size is the gathered output; busbw = algbw x (n-1)/n
    algbw, busbw = F.bus_bandwidth("all_gather", 4_194_304, 2e-4, 4)
    assert algbw == pytest.approx(20.97152e9) and busbw == pytest.approx(15.72864e9)
    # the row `roofline ceilings --collective` prints from a measured time is the same definition
    from profiler.collectives import row

    r = row("all_reduce", 67_108_864, 1e-3, 8)
    assert (r["algbw"], r["busbw"], r["count"]) == (algbw_ar := 67_108_864 / 1e-3, algbw_ar * 14 / 8, 16_777_216)


def test_catalogue_links_are_per_direction_with_sources():
    for d in CATALOGUE.values():
        assert d.link is not None and d.link.bandwidth > 0 and d.link.provenance, d.key
    assert find_device("h100").link.bandwidth == 450e9 and find_device("a100").link.bandwidth == 300e9
    assert find_device("b200").link.bandwidth == 900e9 and find_device("l4").link.name == "PCIe 4.0 x16"
    assert find_device("h100-pcie").link.bandwidth == 64e9
    back = Device.from_dict(find_device("h200").to_dict())
    assert back.link == find_device("h200").link
    assert Device.from_dict({"name": "old header", "bandwidth": 1.0}).link is None   # older files: no link
    assert custom_link(100, 5).time("all_reduce", 1e6, 2) == pytest.approx(5e-6 + 1e6 / 100e9)


def test_explain_70b_tp8_shows_the_comm_share_and_8b_is_communication_bound():
    from profiler.cli import main

    r = CliRunner().invoke(main, ["explain", "--model", "llama-3-70b", "--device", "h100", "--tp", "8",
                                  "--phase", "decode", "--batch", "1"])
    assert r.exit_code == 0, r.output
    assert "collectives per step, per rank, over NVLink 4" in r.output and "communication share: 32%" in r.output
    d = json.loads(CliRunner().invoke(main, ["explain", "--model", "llama-3-8b", "--device", "h100", "--tp", "8",
                                             "--phase", "decode", "--batch", "1", "--json"]).output)
    assert d["bound"] == COMMUNICATION and d["communication"]["share"] > 0.5 and "communication-bound" in d["verdict"]
    # the same step at batch 256 carries more tokens per all-reduce: its ops dominate again
    v = analyze_phase(W.decode(L3, 256, 1024, tp=8), find_device("h100"))
    assert v.bound != COMMUNICATION
    bad = CliRunner().invoke(main, ["explain", "--model", "llama-2-7b", "--tp", "3"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "Valid --tp" in bad.output
    nolink = CliRunner().invoke(main, ["explain", "--tp", "2", "--peak-tflops", "100", "--bandwidth-gbs", "1000"])
    assert nolink.exit_code == 2 and "--link-gbs" in nolink.output


def _m(op, rank, seconds, flags=(), cost=Cost(1e6, 1e6), detail=None):
    p = WorkloadPoint("tiny", op, "decode", 1, 1, 16, cost, dtype="fp32", backend="torch", tp=2,
                      compute_dtype="fp32")
    return Measurement(p, [seconds] * 3, flags=flags, rank=rank, config={"detail": detail} if detail else {})


def test_a_step_reads_the_slowest_rank_and_is_communication_bound_when_collectives_dominate():
    link = Interconnect("test link", 1e9, 1e-4, 0.0, "measured")
    dev = Device("cpu", "CPU", "cpu", {"fp32": 1e11}, 1e10, source="measured", link=link)
    d = {"collective": "all_reduce", "group_size": 2, "message_bytes": 1024, "wire_bytes": 1024}
    ms = [_m("q_proj", 0, 1e-4), _m("q_proj", 1, 3e-4),
          _m("attn_allreduce", 0, 2e-3, ("communication",), Cost(0, 0), d),
          _m("attn_allreduce", 1, 1e-3, ("communication",), Cost(0, 0), d)]
    rf = ResultFile("x.jsonl", RunHeader(device=dev, model=load_model("tiny"), dtype="fp32"), ms)
    (s,) = analyze(rf).steps
    # q_proj: the slower rank's 300 us x 2 layers; the all-reduce: rank 0's 2 ms x 2 layers
    assert s.time_s == pytest.approx(6e-4) and s.communication_s == pytest.approx(4e-3)
    assert s.rank_s == ((0, pytest.approx(4.2e-3)), (1, pytest.approx(2.6e-3)))
    assert s.label == COMMUNICATION and s.comm_share == pytest.approx(4e-3 / 4.6e-3)
    assert s.bus_bandwidth == pytest.approx(2 * 1024 / 4e-3)
    assert "communication-bound" in s.sentence and "rank 0 4.2 ms, rank 1 2.6 ms" in s.sentence
    from roofline.verdicts.diagnosis import profile_findings

    assert any(f.rule == "communication-bound" for f in profile_findings(rf))
