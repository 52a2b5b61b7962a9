"""roofline.analysis on a recorded file with round numbers (tests/data/reports_exact.jsonl).

The device: bandwidth 1e12 B/s, bf16 peak 1e14 FLOP/s (ridge 100), fp32 1e13 (the
datasheet's), model "tiny" with n_layers = 2. See tests/data/make_fixtures.py.
"""

from pathlib import Path

import pytest

from roofline.analysis import analyze, ceiling_source, ceilings, steps
from roofline.records import read_results
from roofline.workload import op_count

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def exact():
    return read_results(DATA / "reports_exact.jsonl")


@pytest.fixture(scope="module")
def summaries(exact):
    return {(s.phase, s.batch): s for s in steps(exact)}


def test_groups_and_order(exact):
    keys = [(s.phase, s.batch, s.context, s.backend) for s in steps(exact)]
    assert keys == [("prefill", 1, 1000, "torch"), ("decode", 1, 100, "torch"), ("decode", 2, 100, "torch")]


def test_decode_step_sums_ops_times_count_and_leaves_out_layer(summaries):
    s = summaries[("decode", 1)]
    # embedding x1 + q_proj x2 + attention x2 (the layer op and the skipped lm_head are out)
    assert s.cost.flops == pytest.approx(0 + 2 * 2e9 + 2 * 4e8)        # 4.8e9
    assert s.cost.bytes == pytest.approx(4e7 + 2 * 1e9 + 2 * 1.8e8)    # 2.4e9
    assert s.intensity == pytest.approx(2.0)                            # 4.8e9 / 2.4e9
    assert s.time_s == pytest.approx(5e-5 + 2 * 1.25e-3 + 2 * 2.25e-4)  # 3e-3
    # achieved 4.8e9 / 3e-3 = 1.6e12 FLOP/s; attainable 2.0 x 1e12 = 2e12 -> 80%
    assert s.roof_fraction == pytest.approx(0.8)
    # at the roof: 4e7/1e12 + 2 x 1e9/1e12 + 2 x 1.8e8/1e12 = 4e-5 + 2e-3 + 3.6e-4
    assert s.predicted_s == pytest.approx(2.4e-3)
    assert (s.label, s.bound_by_sum, s.bound_by_mix) == ("memory", "memory", "memory")
    assert s.compute_time_share == 0.0
    assert s.skipped_reasons == (("lm_head", "out of memory"),)
    assert s.op_names == ("attention", "embedding", "q_proj") and len(s.missing) == 15 and not s.from_layer
    # every op of the step judged once: q_proj 2e9 / 1.25e-3 = 1.6e12 of min(1e14, 2 x 1e12) = 80%, memory
    q = next(r for r in s.ops if r.op == "q_proj")
    assert (q.count, q.roof_fraction, q.bound, q.label) == (2, pytest.approx(0.8), "memory", "memory")
    assert q.time_s == pytest.approx(2 * 1.25e-3) and q.predicted_s == pytest.approx(1e-3)
    # shares of the step's 3 ms by op label: all memory; linear weights are 2.5 of the 3 ms
    assert s.label_shares == {"memory": pytest.approx(1.0), "compute": 0.0, "overhead": 0.0}
    assert s.weight_memory_share == pytest.approx(2.5e-3 / 3e-3)
    assert s.top.op == "q_proj"
    assert s.sentence == ("Decode at batch 1, context 100 is memory-bound: 80% of the 1 TB/s measured bandwidth "
                          "roof (2.0 FLOP/byte < ridge 100); all of its measured 3 ms is in memory-bound ops "
                          "(3 of 18 ops measured).")


def test_prefill_step_is_compute_bound_by_sum_and_mix(summaries):
    s = summaries[("prefill", 1)]
    assert s.cost.flops == pytest.approx(2 * 2e12)                      # kv_append does no FLOPs
    assert s.cost.bytes == pytest.approx(2 * 1.5e10 + 2 * 1e9)         # 3.2e10
    assert s.intensity == pytest.approx(125.0)                          # >= ridge 100
    assert s.time_s == pytest.approx(2 * 0.045 + 2 * 5e-3)             # 0.1 s
    assert s.roof_fraction == pytest.approx(0.4)                        # 4e12 / 0.1 = 4e13 of 1e14
    assert s.compute_time_share == pytest.approx(0.9)                   # q_proj's 0.09 of 0.1 s
    assert s.predicted_s == pytest.approx(2 * 0.02 + 2 * 1e-3)          # max(2e12/1e14, 1.5e10/1e12) = 0.02
    assert (s.label, s.bound_by_sum, s.bound_by_mix) == ("compute", "compute", "compute")
    assert s.ceiling.kind == "peak" and s.ceiling.value == 1e14 and s.ceiling.source == "measured"
    assert s.sentence.startswith("Prefill of batch 1 x 1,000 tokens is compute-bound: 40% of the 100 TFLOP/s "
                                 "measured bf16 peak (125 FLOP/byte >= ridge 100); 90% of its measured 100 ms")


def test_layer_only_group_far_under_roof_is_overhead_not_memory(summaries):
    s = summaries[("decode", 2)]
    assert s.from_layer
    assert s.cost.flops == pytest.approx(2e9) and s.time_s == pytest.approx(2e-2)   # layer x n_layers (2)
    assert s.roof_fraction == pytest.approx(0.1)   # 2e9 / 0.02 = 1e11 FLOP/s of 1.0 x 1e12
    assert s.label == "overhead" and s.bound_by_sum == "memory"
    assert "overhead-bound" in s.sentence and "not memory" in s.sentence and "10%" in s.sentence


def test_ceiling_sources_per_figure(exact):
    h = exact.header
    assert ceiling_source(h, "bandwidth") == "measured"     # 1e12 vs the datasheet's 2e12
    assert ceiling_source(h, "peak", "bf16") == "measured"  # 1e14 vs 2e14
    assert ceiling_source(h, "peak", "fp32") == "datasheet"  # carried over unchanged
    used, sheet = ceilings(h, ["bf16"])
    assert [(c.kind, c.dtype, c.value, c.source) for c in used] == [
        ("bandwidth", "", 1e12, "measured"), ("peak", "bf16", 1e14, "measured")]
    assert [c.text for c in sheet] == ["2 TB/s datasheet", "200 TFLOP/s bf16 datasheet"]


def test_op_count_and_headline(exact):
    assert op_count("q_proj", 32) == 32
    assert op_count("layer", 32) == 32
    assert op_count("lm_head", 32) == 1 and op_count("embedding", 32) == 1
    picked = [(s.phase, s.batch) for s in analyze(exact).headline()]
    assert picked == [("prefill", 1), ("decode", 1), ("decode", 2)]


def test_gpu_fixture_flags_the_above_roof_point():
    rf = read_results(DATA / "reports_h100.jsonl")
    s = next(s for s in steps(rf) if (s.phase, s.batch, s.context) == ("decode", 8, 128))
    assert s.above_roof == ("attention",)
    assert "attention above the roof" in s.sentence


def test_a_step_above_its_roof_is_not_called_plainly_bound():
    from dataclasses import replace

    from roofline.analysis import _sentence

    s = steps(read_results(DATA / "reports_exact.jsonl"))[0]
    hot = _sentence(replace(s, roof_fraction=1.5))
    assert "runs at 150% of" in hot and "the roof does not bound it here" in hot
    assert "runs at" not in _sentence(replace(s, roof_fraction=0.8))
