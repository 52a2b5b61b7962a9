"""The catalogue's FP4 and FP8 peaks (issue 29): dense figures, each with its source; fp4 a compute dtype."""

import json

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline import RooflineError, load_device_file
from roofline.devices import CATALOGUE, COMPUTE_DTYPES, compute_dtype, find_device
from roofline.precision.formats import native_computes

T = 1e12

# dense TFLOP/s: the datasheets' 2:4-sparse figures halved where they print those (module sources)
FP4 = {"b200": 9000, "gb200": 10000, "b300": 13125, "gb300": 15000, "mi355x": 10066.3}
FP8 = {"b200": 4500, "gb200": 5000, "b300": 4500, "gb300": 5000, "mi300x": 2614.9, "mi325x": 2614.9,
       "mi355x": 5033.2}


@pytest.mark.parametrize("key, tflops", sorted(FP4.items()))
def test_dense_fp4_peaks_with_their_sources(key, tflops):
    d = find_device(key)
    assert d.peak("fp4") == tflops * T and d.peak_flops["fp4"] == tflops * T
    assert d.provenance.startswith(("NVIDIA", "AMD")) and d.source == "datasheet"
    assert ("FP4" in d.provenance or "MXFP4" in d.provenance) and d.link is not None


@pytest.mark.parametrize("key, tflops", sorted(FP8.items()))
def test_dense_fp8_peaks(key, tflops):
    assert find_device(key).peak("fp8") == tflops * T


def test_the_sparse_figures_are_halved_and_said():
    for key in ("b200", "gb200", "b300", "gb300"):
        assert "sparsity" in find_device(key).provenance
    # B200: 18 PFLOPS* sparse -> 9 dense; GB300 rack: 1,080 PFLOPS dense / 72 GPUs = 15
    assert "18 PFLOPS*" in find_device("b200").provenance and "1,080 PFLOPS" in find_device("gb300").provenance
    assert "5,229.8 with sparsity" in find_device("mi325x").provenance


def test_fp4_ridge_on_b200_is_exact():
    # 9,000 TFLOP/s / 8.0 TB/s = 9e15 / 8e12 = 1,125 FLOP/byte
    assert find_device("b200").ridge("fp4") == 1125.0
    # B300: 13,125 TFLOP/s / 7.7 TB/s
    assert find_device("b300").ridge("fp4") == 13125e12 / 7.7e12


def test_cards_without_fp4_refuse_it_in_one_line():
    with pytest.raises(RooflineError, match="has no fp4 peak"):
        find_device("h100").peak("fp4")
    with pytest.raises(RooflineError, match="has no fp4 peak"):
        find_device("mi300x").peak("fp4")


def test_compute_dtypes_take_the_registry_rates():
    assert set(native_computes()) <= set(COMPUTE_DTYPES)
    assert COMPUTE_DTYPES == ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")
    assert compute_dtype("FP4") == "fp4" and compute_dtype("torch.bfloat16") == "bf16"
    assert compute_dtype("int4") == "int4"   # priced at the int8 rate by Device.peak
    with pytest.raises(RooflineError, match="fp8, fp4, int8"):
        compute_dtype("fp5")


def test_device_file_and_json_take_fp4(tmp_path):
    p = tmp_path / "dev.json"
    p.write_text(json.dumps({"name": "MyBlackwell", "peak_tflops": {"bf16": 2250, "fp4": 9000},
                             "bandwidth_gbs": 8000}))
    d = load_device_file(p)
    assert d.peak("fp4") == 9000e12 and d.ridge("fp4") == 1125.0
    p.write_text(json.dumps({"name": "X", "peak_tflops": {"fp3": 1}, "bandwidth_gbs": 1}))
    with pytest.raises(RooflineError, match="peak_tflops names an unknown dtype"):
        load_device_file(p)
    back = type(d).from_dict(d.to_dict())
    assert back.peak_flops["fp4"] == 9000e12


def test_devices_table_shows_the_fp4_column():
    r = CliRunner().invoke(main, ["devices"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["dense", "TFLOP/s", "bandwidth", "ridge", "memory", "L2"]   # the units line
    assert lines[1].split()[2:5] == ["bf16", "fp8", "fp4"]
    b200 = next(ln for ln in lines if ln.startswith("b200 "))
    h100 = next(ln for ln in lines if ln.startswith("h100-sxm "))
    assert b200.split()[3:6] == ["2250", "4500", "9000"] and h100.split()[5:8] == ["989", "1979", "-"]
    assert "Compute dtypes: fp32, tf32, bf16, fp16, fp8, fp4, int8." in r.output
    js = json.loads(CliRunner().invoke(main, ["devices", "--json"]).output)
    row = next(x for x in js if x["key"] == "b200")
    assert row["peak_flops"]["fp4"] == 9000e12 and row["ridge"]["fp4"] == 1125.0


def test_old_figures_unchanged():
    assert find_device("b200").peak_flops == {k: v * T for k, v in dict(
        fp32=75, tf32=1100, fp16=2250, bf16=2250, fp8=4500, fp4=9000, int8=4500).items()}
    assert find_device("gb200").peak("bf16") == 2500e12 and find_device("mi300x").peak("bf16") == 1307.4e12
    assert len(CATALOGUE) == 25
