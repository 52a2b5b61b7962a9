"""Issue 25: Nsight Compute CSVs read into per-launch records, joined with the model, on the roofline.

Expected figures are hand-computed from tests/data/ncu/make_ncu_fixtures.py (values as ncu prints them,
SI prefixes by powers of 1000)."""

import json
import math
from pathlib import Path

import pytest

from roofline import workload as W
from roofline.counters import read_counters, to_si
from roofline.verdicts.counters_join import counter_measurements, join, ratio, ratio_line
from roofline.errors import RooflineError
from roofline.models import load_model

NCU = Path(__file__).parent / "data" / "ncu"
LLAMA = load_model("llama-3-8b")


def point(op, phase, batch, context):
    from roofline.records import WorkloadPoint

    ph = W.prefill(LLAMA, batch, context) if phase == "prefill" else W.decode(LLAMA, batch, context)
    o = ph.op(op)
    return WorkloadPoint(model=LLAMA.name, op=op, phase=phase, batch=batch, new_tokens=context if phase == "prefill"
                         else 1, context=context, cost=o.cost, backend="triton", compute_dtype=o.compute_dtype)


H100_POINTS = [point("q_proj", "decode", 1, 512), point("attention", "decode", 64, 4096),
               point("mlp_residual", "decode", 16, 512)]
A100_POINTS = [point("q_proj", "prefill", 1, 512), point("attention", "decode", 8, 2048),
               point("swiglu", "decode", 16, 512)]


def manifest(tmp_path, points, name="manifest.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"points": [x.to_dict() for x in points]}))
    return p


@pytest.mark.parametrize("layout", ["long", "raw"])
def test_h100_launches_hand_computed(layout):
    cf = read_counters(NCU / f"h100_{layout}.csv")
    assert cf.layout == layout and cf.device == "NVIDIA H100 80GB HBM3" and cf.cc == "9.0"
    assert [l.short_name for l in cf.launches] == ["_linear_kernel", "_decode_split_kernel", "_decode_merge_kernel",
                                                   "_add_kernel"]
    gemm, split, merge, add = cf.launches
    assert gemm.duration_s == pytest.approx(14.30e-6)
    assert gemm.dram_bytes == pytest.approx(34.08e6 + 8.19e3)          # 34,088,190
    assert gemm.level_bytes() == pytest.approx({"DRAM": 34_088_190, "L2": 35.65e6, "L1": 68.16e6})
    assert gemm.flops_by["tensor"] == 536_870_912 and gemm.flops_by["fp32"] == 4096
    assert gemm.flops == 536_875_008
    assert split.flops_by["fp32"] == 2 * 33_554_432 + 16_777_216 + 16_777_216   # FMA counted twice
    assert split.duration_s == pytest.approx(1.10e-3)
    assert add.flops == 65_536 and add.dram_bytes == pytest.approx(393_210)
    assert add.flops / add.dram_bytes == pytest.approx(0.16667, rel=1e-3)      # intensity by hand
    assert all(not l.missing for l in cf.launches)


@pytest.mark.parametrize("layout", ["long", "raw"])
def test_a100_hmma_estimate_and_ncu_peak(layout):
    cf = read_counters(NCU / f"a100_{layout}.csv")
    gemm = cf.launches[0]
    assert gemm.flops_by["tensor"] == 4_194_304 * 4096 == 2 * 512 * 4096 * 4096   # m16n8k16 per HMMA
    assert "estimated" in gemm.tensor_method
    assert cf.launches[2].dram_write == pytest.approx(65.54e3)                    # Kbyte value in an Mbyte column
    assert cf.peaks["bandwidth"] == pytest.approx(1280 * 1.59e9)                   # byte/cycle x cycle/nsecond


def test_units_and_bad_files(tmp_path):
    assert to_si(1.5, "Gbyte", "x") == 1.5e9 and to_si(2, "usecond", "x") == 2e-6 and to_si(3, "", "x") == 3
    with pytest.raises(RooflineError, match="unknown unit 'furlong'") as e:
        read_counters(NCU / "bad_unknown_unit.csv")
    assert "\n" not in str(e.value)
    with pytest.raises(RooflineError, match="no Nsight Compute CSV header") as e:
        read_counters(NCU / "bad_no_header.csv")
    assert "\n" not in str(e.value)
    with pytest.raises(RooflineError, match="does not exist"):
        read_counters(tmp_path / "nope.csv")
    cf = read_counters(NCU / "half_metrics.csv")
    half = cf.launches[3]
    assert half.dram_bytes is None and half.flops is None and half.l2_bytes == pytest.approx(393_220)
    assert len(half.missing) == 3 and cf.notices and "missing for them, not zero" in cf.notices[0]


def test_join_sums_a_points_kernels_and_states_ratios():
    cf = read_counters(NCU / "h100_long.csv")
    joined, notes = join(cf.launches, H100_POINTS)
    assert not notes and [len(j.launches) for j in joined] == [1, 2, 1]
    ms = counter_measurements(joined, "NVIDIA H100 SXM5 80GB")
    q, attn, add = ms
    assert q.point.cost.bytes == pytest.approx(34_088_190) and q.point.cost.flops == 536_875_008
    assert ratio(q, "bytes") == pytest.approx(34_088_190 / (4096 * 4096 * 2 + 2 * 4096 * 2))   # 1.015x
    assert ratio(q, "flops") == pytest.approx(536_875_008 / (2 * 4096 * 4096))                  # 16.0x: padded tiles
    assert ratio_line(q).startswith("q_proj decode b1 ctx512: 1.02x the weight bytes, 16.00x the model's FLOPs")
    kv = 2 * 64 * 4096 * 8 * 128 * 2                                   # K and V, bf16: 1,073,741,824
    assert attn.point.cost.bytes == pytest.approx(2.58e9 + 16.78e6 + 16.78e6 + 0.52e6)
    assert attn.instance_s == pytest.approx(1.10e-3 + 12.5e-6)
    assert ratio(attn, "bytes") == pytest.approx(attn.point.cost.bytes / H100_POINTS[1].cost.bytes)
    assert 2.4 < attn.point.cost.bytes / kv < 2.45
    assert "2.43x the KV bytes" in ratio_line(attn)
    assert attn.config["levels"]["L2"] == pytest.approx(2.7e9 + 17.4e6)


def test_unjoined_and_half_metrics_said_never_zero():
    cf = read_counters(NCU / "half_metrics.csv")
    ms = counter_measurements(join(cf.launches, [])[0], "NVIDIA H100 SXM5 80GB")
    by = {m.point.op: m for m in ms}
    assert set(by) == {"_linear_kernel", "_decode_split_kernel", "_decode_merge_kernel", "_add_kernel"}
    assert by["_add_kernel"].flags == ("counters", "uncosted") and by["_add_kernel"].config["missing"]
    assert by["_linear_kernel"].point.phase == "forward" and by["_linear_kernel"].point.compute_dtype == "bf16"
    assert by["_add_kernel"].point.compute_dtype == "fp32"
    # joined, the model's FLOPs stand in and say so
    ms = counter_measurements(join(cf.launches, H100_POINTS)[0], "NVIDIA H100 SXM5 80GB")
    add = ms[2]
    assert add.point.op == "mlp_residual" and "uncosted" in add.flags    # DRAM bytes missing: off the roofline
    assert add.config["flops_from"] == "model" and math.isnan(ratio(add, "bytes"))


def test_a_point_whose_kernels_never_come_is_said():
    cf = read_counters(NCU / "a100_raw.csv")
    joined, notes = join(cf.launches, [point("rope", "decode", 1, 512)] + A100_POINTS)
    assert len(notes) == 1 and notes[0].startswith("rope decode b1 ctx512: none of its kernels")
    assert [j.point.op for j in joined if j.point] == ["q_proj", "attention", "swiglu"]
