"""The device catalogue: sources, forgiving look-up, custom devices."""

import json

import pytest

from roofline import CATALOGUE, RooflineError, custom_device, find_device, load_device_file
from roofline.devices import cpu_device


def test_catalogue_has_13_devices_with_sources():
    assert len(CATALOGUE) >= 13
    for d in CATALOGUE.values():
        assert d.provenance and d.bandwidth > 0 and d.memory_bytes > 0 and d.sms > 0
        assert "fp32" in d.peak_flops and ("bf16" in d.peak_flops or "no bf16" in d.notes)   # V100, T4: fp16 only


@pytest.mark.parametrize("name, key", [
    ("h100", "h100-sxm"), ("H100-SXM", "h100-sxm"), ("nvidia_h100_sxm", "h100-sxm"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"), ("a100", "a100-sxm-80gb"), ("NVIDIA L4", "l4"),
    ("mi300x", "mi300x"), ("RTX 4090", "rtx-4090"),
])
def test_forgiving_names(name, key):
    assert find_device(name).key == key


def test_dense_not_sparse():
    # inductor's 1979 for H100 bf16 is the sparse figure; ours is dense
    assert find_device("h100").peak("bf16") == 989e12
    assert find_device("rtx-4090").peak("bf16") == pytest.approx(165.2e12)


def test_custom_devices(tmp_path):
    d = custom_device(100, 1000)
    assert d.ridge("bf16") == pytest.approx(100e12 / 1000e9)
    p = tmp_path / "dev.json"
    p.write_text(json.dumps({"name": "MyGPU", "peak_tflops": {"bf16": 200}, "bandwidth_gbs": 2000}))
    assert load_device_file(p).ridge("bf16") == pytest.approx(100.0)
    p.write_text(json.dumps({"name": "MyGPU"}))
    with pytest.raises(RooflineError, match="peak_tflops"):
        load_device_file(p)
    with pytest.raises(RooflineError, match="positive"):
        custom_device(0, 10)


def test_cpu_device_measured_later():
    c = cpu_device()
    with pytest.raises(RooflineError, match="roofline ceilings"):
        c.peak("fp32")
    m = c.with_ceilings({"fp32": 1e11}, 2e10)
    assert m.ridge("fp32") == 5.0 and m.source == "measured"
