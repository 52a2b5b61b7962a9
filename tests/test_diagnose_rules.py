"""Each diagnosis rule fires on a fixture built from records, and stays silent on one where it must not."""

from pathlib import Path


from roofline.cost import Cost
from roofline.devices import Device
from roofline.verdicts.diagnosis import diagnose
from roofline.verdicts.latency_rules import stall_evidence
from roofline.latency import RequestTimeline, summarize, timeline_from_stages
from roofline.models import PRESETS
from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
from roofline.writer import ResultWriter

# ridge bf16 = 100e12 / 1e12 = 100 FLOP/B; fp32 ridge 10
DEV = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12)
TINY = PRESETS["tiny"].to_dict()  # n_layers = 2
DATA = Path(__file__).parent / "data"


def meas(op, phase, t, flops, nbytes, batch=1, context=512, dtype="bf16"):
    p = WorkloadPoint(model="tiny", op=op, phase=phase, batch=batch, new_tokens=1, context=context,
                      cost=Cost(flops, nbytes), compute_dtype=dtype)
    return Measurement(point=p, times_s=(t, t, t), device="toy")


def write(tmp_path, name, records, kind="profile", settings=None):
    path = tmp_path / name
    with ResultWriter(path, RunHeader(device=DEV, model=TINY, kind=kind, settings=settings or {})) as w:
        for r in records:
            w.write(r)
    return read_results(path)


def rules(rf):
    return [f.rule for f in diagnose([rf])]


def test_recorded_cpu_latency_fixture_splits_every_configuration():
    rf = read_results(DATA / "latency_sweep_cpu.jsonl")
    found = diagnose([rf])
    splits = [f for f in found if f.rule == "latency-split"]
    configs = {s.config for s in rf.summaries}
    assert len(splits) == len(configs) == 6
    # the recorded run reused the shared prefix only where the cache was on
    prefix = [f for f in found if f.rule == "prefix-reuse"]
    assert prefix and all("prefix-cache=off" in f.claim for f in prefix)
    # each quotes its twin with the cache on: 960 prefilled tokens -> 480 (6 x 160 -> 160 + 5 x 64)
    assert all("prefilled tokens 960 -> 480" in f.evidence for f in prefix)


# decode linear: 2e6 FLOP over 2e6 B, intensity 1; roof 1e12 FLOP/s -> 2 us at the roof
MEM_LINEAR = dict(flops=2e6, nbytes=2e6, t=2.5e-6)          # 80% of roof -> memory
SLOW_LINEAR = dict(flops=2e6, nbytes=2e6, t=2e-5)           # 10% of roof -> overhead
# prefill linear: 2e9 FLOP over 1e7 B, intensity 200 >= 100; roof 100e12 -> 20 us
COMPUTE_LINEAR = dict(flops=2e9, nbytes=1e7, t=2.5e-5)      # 80% -> compute
KV_ATTN = dict(flops=1e6, nbytes=4e6, t=5e-6)               # decode attention: memory, but KV bytes


def test_decode_weight_bound_fires_and_phase_label(tmp_path):
    rf = write(tmp_path, "diagnose_decode_weights.jsonl",
               [meas("q_proj", "decode", **MEM_LINEAR), meas("down_proj", "decode", **MEM_LINEAR),
                meas("attention", "decode", **KV_ATTN)])
    found = diagnose([rf])
    assert [f.rule for f in found] == ["phase-bound", "decode-weight-bound"]
    assert found[0].claim == "Decode is memory-bound at every measured batch and context."
    # 2 layers x (2.5 + 2.5) us linear vs 2 x 5 us attention: linear share = 10 / 20 = 50%
    assert found[1].claim == "Decode is waiting on weight movement at b1/ctx512."
    assert "b1/ctx512 50%" in found[1].evidence and "quantization" in found[1].action


def test_decode_weight_bound_silent_when_kv_dominates(tmp_path):
    rf = write(tmp_path, "diagnose_decode_kv.jsonl",
               [meas("q_proj", "decode", **MEM_LINEAR), meas("attention", "decode", flops=1e6, nbytes=4e7, t=5e-5)])
    assert rules(rf) == ["phase-bound"]


def test_prefill_compute_bound_fires_and_not_on_memory(tmp_path):
    rf = write(tmp_path, "diagnose_prefill_compute.jsonl", [meas("up_proj", "prefill", **COMPUTE_LINEAR)])
    found = diagnose([rf])
    assert [f.rule for f in found] == ["phase-bound", "prefill-compute-bound"]
    assert found[0].claim == "Prefill is compute-bound at every measured batch and context."
    assert "intensity 200.0 FLOP/B vs ridge 100, 80% of its roof" in found[0].evidence
    rf2 = write(tmp_path, "diagnose_prefill_memory.jsonl", [meas("up_proj", "prefill", **MEM_LINEAR)])
    assert "prefill-compute-bound" not in rules(rf2)


def test_far_under_roof_is_overhead_not_memory(tmp_path):
    rf = write(tmp_path, "diagnose_overhead.jsonl", [meas("q_proj", "decode", **SLOW_LINEAR)])
    found = diagnose([rf])
    assert [f.rule for f in found] == ["phase-bound", "overhead-bound"]
    assert found[0].claim == "Decode is overhead-bound at every measured batch and context."
    assert "10% of its roof" in found[0].evidence


def test_labels_are_per_batch_and_context(tmp_path):
    # batch 1: a weight-bound linear; batch 256 at intensity 200 (ridge 100) runs compute-bound
    rf = write(tmp_path, "diagnose_groups.jsonl",
               [meas("q_proj", "decode", batch=1, **MEM_LINEAR),
                meas("q_proj", "decode", 6.4e-6, 512e6, 2.56e6, batch=256)])    # 200 FLOP/B, 5.12 us = 80% of roof
    found = {f.rule: f for f in diagnose([rf])}
    # one point each: the tie goes to the label holding more time (6.4 us > 2.5 us)
    assert found["phase-bound"].claim == "Decode is compute-bound at 1 of 2 measured (batch, context) points."
    assert "memory at b1/ctx512; compute at b256/ctx512" in found["phase-bound"].evidence
    assert found["decode-weight-bound"].claim == "Decode is waiting on weight movement at b1/ctx512."


def test_decode_batch_fires_on_sublinear_step_time_only(tmp_path):
    # batch 1: 20 us per step (2 layers x 10); batch 8: 30 us -> 8 / 1.5 = 5.3x tokens/s
    rf = write(tmp_path, "diagnose_batch.jsonl",
               [meas("layer", "decode", 1e-5, 2e6, 2e6, batch=1), meas("layer", "decode", 1.5e-5, 16e6, 2.1e6, batch=8)])
    f = [f for f in diagnose([rf]) if f.rule == "decode-batch"]
    assert len(f) == 1 and "5.3x tokens/s" in f[0].evidence and "TPOT" in f[0].action
    linear = write(tmp_path, "diagnose_batch_linear.jsonl",
                   [meas("layer", "decode", 1e-5, 2e6, 2e6, batch=1), meas("layer", "decode", 8e-5, 16e6, 2.1e6, batch=8)])
    assert "decode-batch" not in rules(linear)
    # beside a latency run, the finding quotes its TPOT and target
    lat = latency_file(tmp_path, "diagnose_batch_latency.jsonl",
                       [timeline_from_stages(queue=0.02, prefill=0.08, first_delivery=0.005, gaps=(0.025,) * 3)],
                       slo={"tpot": 0.05})
    f = [f for f in diagnose([rf, lat]) if f.rule == "decode-batch"]
    assert "TPOT p90 25.0 ms vs target 50.0 ms" in f[0].evidence
    assert "batch 1 takes 0.020 ms per step, batch 8 takes 0.030 ms" in f[0].evidence
    single = write(tmp_path, "diagnose_batch_single.jsonl", [meas("layer", "decode", 1e-5, 2e6, 2e6, batch=1)])
    assert "decode-batch" not in rules(single)


def test_no_ceilings_says_so(tmp_path):
    path = tmp_path / "diagnose_cpu.jsonl"
    cpu = Device(key="cpu", name="CPU", kind="cpu")
    with ResultWriter(path, RunHeader(device=cpu, model=TINY)) as w:
        w.write(meas("q_proj", "decode", **MEM_LINEAR))
    found = diagnose([read_results(path)])
    assert len(found) == 1 and "no ceilings" in found[0].claim and "roofline ceilings" in found[0].action


# ------------------------------------------------------------------ latency rules

def latency_file(tmp_path, name, timelines, settings=None, slo=None):
    s = summarize(timelines, slo or {}, timelines[0].config, settings or {})
    return write(tmp_path, name, [t.to_dict() for t in timelines] + [s.to_dict()], kind="latency",
                 settings=settings)


def stream(rid, start, gaps, chunks=((0.0, 0.01, 64),), arrival=None, **kw):
    arrival = start if arrival is None else arrival
    d = [start]
    for g in gaps:
        d.append(d[-1] + g)
    return RequestTimeline(id=rid, arrival=arrival, chunks=tuple(chunks), first_selected=start, deliveries=tuple(d),
                           finish=d[-1], config=kw.pop("config", "c"), prompt_tokens=64, output_tokens=len(d), **kw)


def test_queue_dominates_fires_only_when_queue_is_most_of_ttft(tmp_path):
    seed = timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
    rf = latency_file(tmp_path, "diagnose_seed.jsonl", [seed])
    found = diagnose([rf])
    assert [f.rule for f in found] == ["latency-split"]
    # 20 + 80 + 5 = 105 ms; queue 19%, prefill 76%
    assert "Mean TTFT 105.0 ms = queue 20.0 ms (19%) + prefill 80.0 ms (76%)" in found[0].claim
    queued = timeline_from_stages(queue=0.300, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
    f = [f for f in diagnose([latency_file(tmp_path, "diagnose_queued.jsonl", [queued])]) if f.rule == "queue-dominates"]
    assert len(f) == 1 and "78% of mean TTFT 385.0 ms" in f[0].evidence  # 300 / 385


def test_chunk_stalls_fire_when_spikes_overlap_prefill(tmp_path):
    # request 0 streams at 10 ms; its 6th gap is 100 ms while request 1 prefills 512 tokens in one chunk
    a = stream(0, 0.0, [0.01] * 5 + [0.1] + [0.01] * 4)
    b = stream(1, 0.06, [0.01] * 3, chunks=((0.052, 0.148, 512),), arrival=0.05)
    rf = latency_file(tmp_path, "diagnose_stalls.jsonl", [a, b], settings={"chunk_budget": 512})
    f = [f for f in diagnose([rf]) if f.rule == "chunk-stalls"]
    # 1 overlapping gap (100 ms > 2 x 10 ms), 12 clean gaps, none of them spikes
    assert len(f) == 1 and "1 of 1 gaps" in f[0].evidence and "0 of 12 other gaps" in f[0].evidence
    assert "worst 100.0 ms in request 0, during 512 prefill tokens" in f[0].evidence
    assert "now 512 tokens" in f[0].action


def test_chunk_stalls_silent_on_even_gaps_and_unrelated_spikes(tmp_path):
    a = stream(0, 0.0, [0.01] * 10)
    b = stream(1, 0.06, [0.01] * 3, chunks=((0.052, 0.058, 32), (0.061, 0.066, 32)), arrival=0.05)
    assert "chunk-stalls" not in rules(latency_file(tmp_path, "diagnose_even.jsonl", [a, b]))
    # a spike with no prefill anywhere near it (e.g. a GC pause) is not blamed on chunking
    c = stream(0, 0.0, [0.01] * 5 + [0.1] + [0.01] * 4)
    d = stream(1, 0.5, [0.01] * 3, chunks=((0.4, 0.45, 512),), arrival=0.4)
    e = stall_evidence([c, d])
    assert e["spikes"] == 1 and e["clean_spikes"] == 1 and e["overlapping"] == 0
    assert "chunk-stalls" not in rules(latency_file(tmp_path, "diagnose_gc.jsonl", [c, d]))


def test_chunk_stalls_silent_when_spikes_hit_all_gaps_alike(tmp_path):
    # a noisy machine: every other gap is 50 ms, with or without a prefill chunk in it
    a = stream(0, 0.0, [0.01, 0.05] * 10)
    b = stream(1, 0.1, [0.01] * 3, chunks=((0.0, 0.3, 256),), arrival=0.0)   # overlaps a's first ~10 gaps
    e = stall_evidence([a, b])
    assert e["overlapping"] > 0 and e["rate_overlapping"] < 2 * e["rate_clean"]
    assert "chunk-stalls" not in rules(latency_file(tmp_path, "diagnose_noise.jsonl", [a, b]))


def test_prefix_reuse_fires_when_shared_blocks_were_recomputed(tmp_path):
    a = stream(0, 0.0, [0.01] * 3, block_hashes=("h1", "h2", "h3", "a4"))
    b = stream(1, 0.5, [0.01] * 3, arrival=0.4, block_hashes=("h1", "h2", "h3", "b4"))
    f = [f for f in diagnose([latency_file(tmp_path, "diagnose_prefix.jsonl", [a, b])]) if f.rule == "prefix-reuse"]
    assert len(f) == 1 and "1 of 2 requests" in f[0].evidence and "48 reusable tokens" in f[0].evidence  # 3 x 16
    b_hit = stream(1, 0.5, [0.01] * 3, arrival=0.4, block_hashes=("h1", "h2", "h3", "b4"), cached_tokens=48)
    assert "prefix-reuse" not in rules(latency_file(tmp_path, "diagnose_prefix_hit.jsonl", [a, b_hit]))
    c = stream(1, 0.5, [0.01] * 3, arrival=0.4, block_hashes=("x1", "h2", "h3"))  # chained: no shared first block
    assert "prefix-reuse" not in rules(latency_file(tmp_path, "diagnose_prefix_none.jsonl", [a, c]))


def test_split_and_phase_rules_stay_silent_without_their_evidence(tmp_path):
    failed = RequestTimeline(id=0, arrival=0.0, finish=0.1, status="failed", error="boom", config="c")
    rf = latency_file(tmp_path, "diagnose_all_failed.jsonl", [failed])
    assert rules(rf) == ["requests-failed"]                 # no ok request: nothing to split, only the failure
    seed = timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
    assert "phase-bound" not in rules(latency_file(tmp_path, "diagnose_latency_only.jsonl", [seed]))


def test_chunk_stalls_quote_the_smaller_budget_measured_in_the_same_file(tmp_path):
    a = stream(0, 0.0, [0.01] * 5 + [0.1] + [0.01] * 4)
    b = stream(1, 0.06, [0.01] * 3, chunks=((0.052, 0.148, 512),), arrival=0.05)
    small_a = stream(0, 0.0, [0.01] * 5 + [0.03] * 3 + [0.01] * 4, config="d")
    small_b = stream(1, 0.2, [0.01] * 3, chunks=tuple((0.05 + 0.03 * i, 0.07 + 0.03 * i, 64) for i in range(8)),
                     arrival=0.05, config="d")
    big = summarize([a, b], {}, "c", {"chunk_budget": None, "prefix_cache": True})
    small = summarize([small_a, small_b], {}, "d", {"chunk_budget": 64, "prefix_cache": True})
    rf = write(tmp_path, "diagnose_stalls_sweep.jsonl",
               [t.to_dict() for t in (a, b, small_a, small_b)] + [big.to_dict(), small.to_dict()], kind="latency")
    found = {f.claim.split("]")[0]: f for f in diagnose([rf]) if f.rule == "chunk-stalls"}
    assert "at chunk budget 64 in this file" in found["[c"].evidence
    assert "as measured here" in found["[c"].action
    # budget 64 still stalls (3 of 7 overlapping gaps at 30 ms); being the smallest tried, it says so
    assert "smallest budget tried (now 64 tokens per step)" in found["[d"].action
