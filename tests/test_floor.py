"""The roofline floor under every latency, pinned to exact numbers with the arithmetic beside them."""

import math

import pytest

from roofline.devices import Device, find_device
from roofline.verdicts.diagnosis import diagnose
from roofline.floor import FloorRatio, StageFloor, decode_floor, latency_floors, prefill_floor, served_shape
from roofline.latency import RequestTimeline, summarize, timeline_from_stages
from roofline.models import load_model
from roofline.records import ResultFile, RunHeader

TINY = load_model("tiny")     # hidden 64, intermediate 176, 2 layers, 4 q heads, 2 kv heads, head_dim 16, vocab 256
# every op memory-bound: 1 GB/s against 1 PFLOP/s (a ridge of 10^6 FLOP/byte)
SLOW_MEMORY = Device(key="m", name="slow memory", kind="gpu", peak_flops={"bf16": 1e15, "fp32": 1e15}, bandwidth=1e9)
# every op compute-bound: 1 GFLOP/s against 10^18 B/s
SLOW_COMPUTE = Device(key="c", name="slow compute", kind="gpu", peak_flops={"bf16": 1e9, "fp32": 1e9}, bandwidth=1e18)


def test_decode_step_floor_is_its_bytes_over_bandwidth_when_every_op_is_memory_bound():
    # tiny, bf16 (2 B), batch 1, context 7: one token row; attention reads 8 keys (7 cached + the new one)
    per_layer = (
        2 * 64 * 2 + 64 * 2              # attn_norm: x read + written, weight read            =    384
        + 64 * 2 + 64 * 64 * 2 + 64 * 2  # q_proj: x, W [64 x 64], y                            =  8,448
        + 2 * (64 * 2 + 64 * 32 * 2 + 32 * 2)  # k_proj, v_proj: W [64 x 32] each              =  8,576
        + 2 * 96 * 2 + 16 * 4            # rope: q and k (6 heads x 16) read + written, cos/sin =    448
        + 64 * 2 + 64 * 2                # kv_append: 2 x 2 heads x 16 values, read + written   =    256
        + 2 * 8 * 2 * 16 * 2 + 2 * 4 * 16 * 2   # attention: K and V of 8 keys x 2 heads, q + o =  1,280
        + 64 * 2 + 64 * 64 * 2 + 64 * 2  # o_proj                                               =  8,448
        + 3 * 64 * 2                     # attn_residual: two inputs, one output                =    384
        + 2 * 64 * 2 + 64 * 2            # mlp_norm                                             =    384
        + 2 * (64 * 2 + 64 * 176 * 2 + 176 * 2)  # gate_proj, up_proj: W [64 x 176] each       = 46,016
        + 3 * 176 * 2                    # swiglu: gate, up read, out written                   =  1,056
        + 176 * 2 + 176 * 64 * 2 + 64 * 2  # down_proj                                          = 23,008
        + 3 * 64 * 2                     # mlp_residual                                         =    384
    )
    assert per_layer == 99_072
    once = (64 * 2 + 64 * 2 + 8             # embedding: a row of the table, the output, the token id =    264
            + 2 * 64 * 2 + 64 * 2           # final_norm                                          =    384
            + 64 * 2 + 64 * 256 * 2 + 256 * 2)  # lm_head: W [64 x 256]                            = 33,408
    assert once == 34_056
    total = 2 * per_layer + once            # 2 layers: 198,144 + 34,056 = 232,200 bytes
    assert total == 232_200
    f = decode_floor(TINY, SLOW_MEMORY, 1, 7, dtype="bf16")
    assert f.bytes == 232_200
    assert f.seconds == pytest.approx(232_200 / 1e9, rel=1e-12)           # 232.2 us at 1 GB/s
    assert f.memory_share == 1.0 and f.roof == "bandwidth"
    assert (f.stage, f.batch, f.tokens, f.shape) == ("decode", 1, 7, "batch 1 (context 7)")


def test_prefill_floor_is_its_flops_over_peak_when_every_op_is_compute_bound():
    # tiny, bf16, one prompt of 8 tokens (T = 8 rows), nothing cached
    per_layer = (
        4 * 8 * 64                   # attn_norm: 4 FLOPs per element                       =   2,048
        + 2 * 8 * 64 * 64            # q_proj: 2 T K N                                       =  65,536
        + 2 * (2 * 8 * 64 * 32)      # k_proj, v_proj                                        =  65,536
        + 3 * 8 * 6 * 16             # rope: 3 per element of q and k                        =   2,304
        + 4 * 4 * 16 * (8 * 8 // 2)  # attention: 4 Hq D x 32 causal pairs (64 halved)      =   8,192
        + 2 * 8 * 64 * 64            # o_proj                                                =  65,536
        + 8 * 64                     # attn_residual: one add per element                    =     512
        + 4 * 8 * 64                 # mlp_norm                                              =   2,048
        + 2 * (2 * 8 * 64 * 176)     # gate_proj, up_proj                                    = 360,448
        + 5 * 8 * 176                # swiglu: 5 per element                                 =   7,040
        + 2 * 8 * 176 * 64           # down_proj                                             = 180,224
        + 8 * 64                     # mlp_residual                                          =     512
    )                                # (kv_append and the embedding move bytes only)
    assert per_layer == 759_936
    once = 4 * 64 + 2 * 64 * 256     # final_norm and lm_head on the last row only: 256 + 32,768
    total = 2 * per_layer + once     # 1,519,872 + 33,024 = 1,552,896 FLOPs
    assert total == 1_552_896
    f = prefill_floor(TINY, SLOW_COMPUTE, 8, dtype="bf16")
    assert f.flops == 1_552_896
    # 1.552896 ms at 1 GFLOP/s; the two byte-only ops add bytes / 10^18 B/s (under a femtosecond)
    assert f.seconds == pytest.approx(1_552_896 / 1e9, rel=1e-9)
    assert f.roof == "compute" and f.shape == "a 8-token prefill at batch 1"


def test_the_floor_sums_each_ops_own_roof_not_the_step_against_one_roof():
    # on a balanced device (1 GFLOP/s, 1 GB/s) each op pays the larger of its two times, so the step's floor
    # is above both its total FLOPs / peak and its total bytes / bandwidth
    dev = Device(key="b", name="balanced", kind="gpu", peak_flops={"bf16": 1e9, "fp32": 1e9}, bandwidth=1e9)
    f = prefill_floor(TINY, dev, 8, dtype="bf16")
    assert f.seconds > max(f.flops / 1e9, f.bytes / 1e9)
    assert 0 < f.memory_share < 1


def test_llama_3_8b_decode_on_an_h100_is_weight_bandwidth_bound():
    # ~8.0e9 parameters x 2 bytes ~ 16 GB read per step at 3.35 TB/s ~ 4.8 ms (batch 1: weights dominate)
    h100, cfg = find_device("h100"), load_model("llama-3-8b")
    f = decode_floor(cfg, h100, 1, 1024, dtype="bf16")
    assert f.roof == "bandwidth" and f.seconds == pytest.approx(f.bytes / h100.bandwidth, rel=0.01)
    assert 4.5e-3 < f.seconds < 5.2e-3
    # batch 8 reads the weights once for 8 tokens: the step costs far less than 8x
    assert decode_floor(cfg, h100, 8, 1024, dtype="bf16").seconds < 1.5 * f.seconds


def test_served_shape_weighs_batch_and_context_by_output_token():
    a = RequestTimeline(id=0, arrival=0.0, deliveries=(1.00, 1.10, 1.20, 1.30), finish=1.30, prompt_tokens=10)
    b = RequestTimeline(id=1, arrival=0.0, deliveries=(1.12, 1.22), finish=1.22, prompt_tokens=20)
    s = served_shape([a, b])
    # gaps of a: middle 1.05 (a alone), 1.15 (a and b), 1.25 (a alone; b ended at 1.22); gap of b: 1.17 (a, b)
    assert s.batch == pytest.approx((1 + 2 + 1 + 2) / 4)                    # 1.5
    # context: a's steps with 10 + 0, 10 + 1, 10 + 2 tokens cached, b's with 20 + 0
    assert s.context == pytest.approx((10 + 11 + 12 + 20) / 4)             # 13.25
    assert s.prompt == 15 and s.tokens == 4 and s.requests == 2
    # served counts win over the requested ones
    c = RequestTimeline(id=2, arrival=0.0, deliveries=(1.0,), finish=1.0, prompt_tokens=10, served_prompt_tokens=13)
    assert served_shape([c]).prompt == 13


def test_the_sentence_says_measured_floor_batch_roof_and_verdict():
    floor = StageFloor("decode", 0.0041, 1e9, 1e9, 8, 1024, 0, 0.9, "H100")
    r = FloorRatio("TPOT", 0.035, floor)
    assert r.sentence == ("TPOT p50 35.0 ms against a roofline floor of 4.1 ms at batch 8 (context 1024): 12% of "
                          "the bandwidth roof — the server is far from memory-bound; look at scheduling and per-step "
                          "overhead")
    assert r.ratio == pytest.approx(35 / 4.1) and r.fraction == pytest.approx(4.1 / 35)
    near = FloorRatio("TPOT", 0.005, floor)
    assert near.sentence.endswith("82% of the bandwidth roof — memory-bound within 1.2x of the floor")
    assert "quantized" in near.action
    fast = FloorRatio("TTFT", 0.002, StageFloor("prefill", 0.0041, 1e9, 1e9, 1, 512, 0, 0.1, "H100"))
    assert "for a 512-token prefill at batch 1" in fast.sentence and "compute roof" in fast.sentence
    assert "faster than the floor allows" in fast.sentence


def _latency_file(timelines, model=TINY):
    header = RunHeader(device=Device(key="e", name="server", kind="server"), model=model, kind="latency", dtype="bf16")
    return ResultFile(path="lat.jsonl", header=header, requests=list(timelines), summaries=[])


def test_diagnose_puts_a_floor_under_ttft_and_tpot_and_the_split_quotes_it():
    ts = [timeline_from_stages(queue=0.002, prefill=0.010, first_delivery=0.001, gaps=(0.004,) * 4, prompt_tokens=40,
                               arrival=0.05 * i, id=i) for i in range(3)]
    found = diagnose([_latency_file(ts)], device=SLOW_MEMORY)
    floors = [f for f in found if f.rule == "latency-floor"]
    assert [f.data["metric"] for f in floors] == ["TTFT", "TPOT"]
    s = summarize(ts)
    ttft, tpot = latency_floors(s, ts, TINY, SLOW_MEMORY, "bf16")
    assert floors[0].data["floor_s"] == ttft.floor.seconds and floors[0].data["measured_s"] == s.ttft["p50"]
    # requests never overlap: batch 1; context 40 + (0 + 1 + 2 + 3) / 4 = 41.5, rounded (half to even) to 42
    assert tpot.floor.batch == 1 and tpot.floor.tokens == 42
    assert floors[1].claim.startswith("TPOT p50 4.0 ms against a roofline floor of")
    split = next(f for f in found if f.rule == "latency-split")
    assert "the prefill floor on slow memory is" in split.evidence
    # no model, no device ceilings: no floor, and no error
    assert not [f for f in diagnose([_latency_file(ts, model=None)], device=SLOW_MEMORY) if f.rule == "latency-floor"]
    assert not [f for f in diagnose([_latency_file(ts)]) if f.rule == "latency-floor"]


def test_failed_and_empty_runs_have_no_floor():
    failed = RequestTimeline(id=0, arrival=0.0, finish=0.1, status="failed", error="http 500: boom")
    assert served_shape([failed]) is None
    assert latency_floors(summarize([failed]), [failed], TINY, SLOW_MEMORY, "bf16") == []
    one = RequestTimeline(id=1, arrival=0.0, sent=0.0, deliveries=(0.1,), finish=0.1, prompt_tokens=8)
    (ttft,) = latency_floors(summarize([one]), [one], TINY, SLOW_MEMORY, "bf16")   # TPOT undefined for one token
    assert ttft.metric == "TTFT" and not math.isnan(ttft.ratio)
