"""Issue 22: device names are exact (aliases listed) or an error with "did you mean"; the added cards carry
sources; `--device cpu` uses the cached measured ceilings; `explain linear` honours --weight-dtype and refuses
an int4 group size that does not divide K."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler import ceilings as C
from profiler.cli import main
from roofline.devices import CATALOGUE, RooflineError, cpu_device, find_device
from roofline.records import read_results

TRACES = Path(__file__).parent / "data" / "traces"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("name, near", [("h1000", "h100-sxm"), ("gh200", "h200"), ("a100-pcie-40", "a100-pcie-40gb")])
def test_a_name_that_is_not_listed_is_an_error_with_did_you_mean(name, near):
    with pytest.raises(RooflineError, match="did you mean") as e:
        find_device(name)
    msg = str(e.value)
    assert f"Unknown device {name!r}" in msg and near in msg.split("did you mean")[1].split(")")[0]
    assert "\n" not in msg and "--device-file" in msg


@pytest.mark.parametrize("name, key", [
    ("a100-pcie-40gb", "a100-pcie-40gb"), ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"), ("a100-pcie", "a100-pcie-80gb"),
    ("v100", "v100-sxm2"), ("Tesla V100-PCIE-16GB", "v100-pcie"), ("Tesla T4", "t4"), ("l40s", "l40s"),
    ("a10g", "a10g"), ("NVIDIA H800", "h800"), ("h20", "h20"), ("mi250x", "mi250x"), ("b200", "b200"),
    ("gb200", "gb200"), ("H100-SXM", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
])
def test_listed_names_and_aliases_are_found(name, key):
    assert find_device(name).key == key


def test_the_added_cards_carry_their_figures_and_sources():
    for key in ("v100-sxm2", "v100-pcie", "t4", "h800", "h20", "a100-pcie-40gb", "mi250x", "gb200"):
        d = CATALOGUE[key]
        assert d.provenance.startswith(("NVIDIA", "AMD")) and d.source == "datasheet"
        assert d.bandwidth > 0 and d.memory_bytes > 0 and d.link is not None
    assert find_device("t4").ridge("fp16") == pytest.approx(65e12 / 320e9)          # 203 FLOP/byte
    assert find_device("v100").ridge("fp16") == pytest.approx(125e12 / 900e9)       # 139
    assert find_device("h800").peak("bf16") == find_device("h100").peak("bf16") == 989e12
    assert find_device("h800").link.bandwidth == 200e9 < find_device("h100").link.bandwidth
    assert find_device("h20").ridge("bf16") == pytest.approx(148e12 / 4.0e12)        # 37
    assert find_device("a100-pcie-40gb").bandwidth == 1.555e12
    with pytest.raises(RooflineError, match="no bf16 peak"):
        find_device("v100").peak("bf16")


def test_devices_lists_cards_without_bf16():
    r = cli("devices")
    assert r.exit_code == 0, r.output
    t4 = next(ln for ln in r.output.splitlines() if ln.startswith("t4 "))
    assert "203*" in t4


def test_explain_linear_uses_the_weight_dtype():
    base = ("explain", "linear", "--tokens", "1", "--in", "4096", "--out", "4096", "--device", "h100", "--json")
    bf16 = json.loads(cli(*base).output)
    w8 = json.loads(cli(*base, "--weight-dtype", "int8").output)
    assert bf16["weight_bytes"] == 33_554_432 and w8["weight_bytes"] == 16_777_216
    # 4,096 x 4,096 x 1 + 4,096 scales x 2 + x, y 2 x 4,096 x 2 = 16,777,216 + 8,192 + 16,384
    assert w8["bytes"] == 16_777_216 + 8_192 + 16_384 and w8["act_dtype"] == "bf16"
    assert w8["compute_dtype"] == "bf16"           # weight-only: dequantized, the bf16 ridge applies
    w4 = json.loads(cli(*base, "--weight-dtype", "int4", "--group-size", "64").output)
    assert w4["weight_bytes"] == 8_388_608 and w4["scale_bytes"] == 64 * 4096 * 2


def test_a_group_size_that_does_not_divide_k_is_an_error():
    r = cli("explain", "linear", "--tokens", "1", "--in", "4160", "--out", "4096", "--weight-dtype", "int4",
            "--group-size", "128", "--device", "h100")
    assert r.exit_code != 0
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "int4 (g128): its groups of 128 do not divide --in 4,160" in lines[0]
    assert "--group-size 32 or 64" in lines[0]          # 4,160 = 65 x 64


@pytest.fixture
def measured_cpu(monkeypatch):
    dev = cpu_device("test CPU", {"fp32": 155e9, "bf16": 40e9}, 15e9)
    c = C.Ceilings(dev, None, {"flags": []}, cached=True)
    monkeypatch.setattr(C, "cached_ceilings", lambda *a, **k: c)
    monkeypatch.setattr(C, "get_ceilings", lambda *a, **k: c)
    return dev


def test_explain_device_cpu_uses_the_cached_measured_ceilings(measured_cpu):
    d = json.loads(cli("explain", "linear", "--tokens", "1", "--in", "4096", "--out", "4096", "--dtype", "fp32",
                       "--device", "cpu", "--json").output)
    assert d["ridge"] == pytest.approx(155e9 / 15e9)


def test_explain_device_cpu_without_a_cache_says_what_to_run(monkeypatch):
    monkeypatch.setattr(C, "cached_ceilings", lambda *a, **k: None)
    r = cli("explain", "linear", "--tokens", "1", "--in", "64", "--out", "64", "--device", "cpu")
    assert r.exit_code != 0 and "roofline ceilings --device cpu" in r.output


def test_trace_device_cpu_uses_the_measured_ceilings(measured_cpu, tmp_path):
    r = cli("trace", TRACES / "gpu_new.json", "--device", "cpu", "--out", tmp_path / "t", "--no-report", "--json")
    assert r.exit_code == 0, r.output
    rf = read_results(json.loads(r.output)["results"])
    assert rf.header.device.bandwidth == 15e9 and rf.header.device.kind == "cpu"
