"""profiler.probes: NVML decoding with a fake pynvml, the no-NVML path, CPU facts, and `roofline env`."""

import json
import sys
import types

import pytest

from click.testing import CliRunner

from profiler import probes
from profiler.cli import main


def test_clock_event_reasons_are_decoded():
    assert probes.decode_reasons(0x0) == []
    assert probes.decode_reasons(0x24) == ["sw-power-cap", "sw-thermal"]
    assert probes.decode_reasons(0x1 | 0x80 | 0x1000) == ["idle", "power-brake", "0x1000"]


def test_point_flags_from_samples():
    static = {"sm_clock_max_mhz": 1980}
    busy = {"sm_clock_mhz": 1980, "clock_event_mask": 0}
    assert probes.point_flags(busy, busy, static) == ()
    hot = {"sm_clock_mhz": 1500, "clock_event_mask": 0x40}      # hw thermal, 1500 < 0.85 * 1980
    assert probes.point_flags(busy, hot, static) == ("throttled:hw-thermal", "sm-clock-low")
    idle = {"sm_clock_mhz": 345, "clock_event_mask": 0x1}       # an idle GPU idles its clock: no flag
    assert probes.point_flags(idle, busy, static) == ()
    # 200 ticks passed on the machine (2 CPUs x 100); 150 were busy, 50 of them ours: others took 50%
    t0 = {"ticks_total": 1000, "ticks_busy": 500, "ticks_self": 100, "ticks_steal": 0}
    t1 = {"ticks_total": 1200, "ticks_busy": 650, "ticks_self": 150, "ticks_steal": 0}
    assert probes.others_share(t0, t1) == 0.5
    assert probes.point_flags(t0, t1, {}) == ("host-busy",)
    alone = dict(t1, ticks_self=240)                                  # 140 of the 150 were ours: 5%
    assert probes.others_share(t0, alone) == 0.05 and probes.point_flags(t0, alone, {}) == ()


def test_no_nvml_is_the_cpu_path_with_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)           # import pynvml -> ImportError
    p = probes.open_probe("cuda")
    assert p.kind == "cpu" and "nvidia-ml-py" in p.note
    assert p.static()["logical_cpus"] >= 1


def test_nvml_without_a_driver_is_the_cpu_path(monkeypatch):
    fake = types.ModuleType("pynvml")
    fake.NVMLError = type("NVMLError", (Exception,), {})

    def init():
        raise fake.NVMLError("Driver Not Loaded")
    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    p = probes.open_probe("cuda:0")
    assert p.kind == "cpu" and "Driver Not Loaded" in p.note
    assert probes.open_probe("cpu").note == ""


def _fake_nvml():
    nv = types.ModuleType("pynvml")
    nv.NVMLError = type("NVMLError", (Exception,), {})
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 0, 1, 0
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: "h"
    nv.nvmlDeviceGetHandleByPciBusId = lambda b: "h"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nv.nvmlDeviceGetMaxClockInfo = lambda h, k: {0: 1980, 1: 2619}[k]
    nv.nvmlDeviceGetClockInfo = lambda h, k: {0: 1755, 1: 2619}[k]
    nv.nvmlDeviceGetMemoryBusWidth = lambda h: 5120
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetPowerUsage = lambda h: 650_000
    nv.nvmlDeviceGetTemperature = lambda h, k: 71
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1_000
    nv.NVML_PERF_POLICY_POWER, nv.NVML_PERF_POLICY_THERMAL = 0, 1
    nv.nvmlDeviceGetViolationStatus = lambda h, policy: types.SimpleNamespace(referenceTime=0, violationTime=0)
    return nv


def test_gpu_probe_reads_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    p = probes.open_probe("cuda")
    assert p.kind == "gpu"
    s = p.static()
    assert s["name"] == "NVIDIA H100 80GB HBM3" and s["compute_capability"] == "9.0"
    # 2619 MHz x 5120 bits / 8 x 2 (DDR) = 3.352 TB/s, the H100 SXM datasheet's 3.35
    assert s["bandwidth_implied"] == 2619e6 * 5120 / 8 * 2
    assert s["power_limit_w"] == 700.0
    smp = p.sample()
    assert smp["power_w"] == 650.0 and smp["clock_events"] == ["sw-power-cap"]
    assert probes.point_flags(smp, smp, s) == ("power-capped",)      # at its limit, by design: no sm-clock-low
    # the host's CPU ticks ride along, so a busy host is flagged on a GPU run too
    assert smp["ticks_total"] > 0 and "usable_cpus" in smp
    assert smp["energy_mj"] == 1_000 and smp["thermal_violation_ns"] == 0 and smp["power_violation_ns"] == 0


def test_llc_from_sys_and_fallback(tmp_path, monkeypatch):
    for name, level, kind, size in [("index0", 1, "Data", "48K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "2048K"), ("index3", 3, "Unified", "30720K")]:
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert probes.llc_bytes(str(tmp_path))[0] == 30720 * 1024
    monkeypatch.setattr(probes.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no lscpu")))
    size, src = probes.llc_bytes(str(tmp_path / "missing"))
    assert size == 32 * 2**20 and "fallback" in src


def test_env_text_and_json():
    r = CliRunner().invoke(main, ["env", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    for key in ("python:", "torch:", "triton:", "cuda:", "driver:", "roofline:", "git sha:", "name:"):
        assert key in r.output
    r = CliRunner().invoke(main, ["env", "--json", "--device", "cpu"])
    d = json.loads(r.output)
    assert d["probe"] == "cpu" and d["versions"]["torch"] and d["state"]["ticks_total"] > 0


def test_env_on_a_gpu_box_with_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    r = CliRunner().invoke(main, ["env", "--device", "cuda"])
    assert r.exit_code == 0, r.output
    assert "NVIDIA H100 80GB HBM3" in r.output and "sw-power-cap" in r.output and "host cpu:" in r.output
    d = json.loads(CliRunner().invoke(main, ["env", "--json", "--device", "cuda"]).output)
    assert d["probe"] == "gpu" and d["state"]["sm_clock_mhz"] == 1755 and d["static"]["power_limit_w"] == 700.0


def test_gpu_check_script_is_executable_and_parses():
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_counters_catch_throttling_during_a_point_and_spare_a_power_capped_h100():
    static = {"sm_clock_max_mhz": 1980}
    idle = {"sm_clock_mhz": 1980, "clock_event_mask": 0x1, "t_s": 10.0, "power_violation_ns": 0,
            "thermal_violation_ns": 5_000_000_000, "energy_mj": 0}
    # 2 s later: the clocks read at idle again, but NVML says heat held them down for 0.5 s of it
    hot = dict(idle, t_s=12.0, thermal_violation_ns=5_500_000_000)
    assert probes.violation_shares(idle, hot) == {"power": 0.0, "thermal": 0.25}
    assert probes.point_flags(idle, hot, static) == ("throttled:thermal",)
    # a loaded H100 at its power limit runs ~1.6 GHz of 1.98: power-capped, never "sm-clock-low"
    capped = {"sm_clock_mhz": 1590, "clock_event_mask": 0x4, "t_s": 10.0, "power_violation_ns": 0}
    assert probes.point_flags(capped, dict(capped, t_s=11.0, power_violation_ns=600_000_000), static) == \
        ("power-capped",)
    assert probes.point_flags(dict(capped, clock_event_mask=0), dict(capped, clock_event_mask=0, t_s=11.0,
                                                                      power_violation_ns=900_000_000), static) == \
        ("power-capped",)
    # the same clock with no power reason is low
    assert probes.point_flags({"sm_clock_mhz": 1590, "clock_event_mask": 0}, {}, static) == ("sm-clock-low",)
    # no timestamps: any violation during the point counts
    assert probes.violation_shares({"thermal_violation_ns": 1}, {"thermal_violation_ns": 2}) == {"thermal": 1.0}


def _multi_gpu_nvml():
    nv = _fake_nvml()
    uuids = ["GPU-11111111-aaaa", "GPU-22222222-bbbb"]
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    nv.nvmlDeviceGetUUID = lambda h: uuids[int(h[1:])].encode()

    def by_uuid(u):
        if u.startswith("MIG-"):
            return "mig:" + u
        if u not in uuids:
            raise nv.NVMLError("Not Found")
        return f"h{uuids.index(u)}"
    nv.nvmlDeviceGetHandleByUUID = by_uuid
    nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda h: "parent-of-" + h
    return nv


@pytest.mark.parametrize("visible,device,handle", [
    ("GPU-22222222-bbbb,GPU-11111111-aaaa", "cuda:0", "h1"),      # UUIDs, reordered
    ("GPU-11111111-aaaa,GPU-2222", "cuda:1", "h1"),                 # a UUID prefix, as CUDA accepts
    ("MIG-5c3a3b1e-0000", "cuda:0", "parent-of-mig:MIG-5c3a3b1e-0000"),
    ("MIG-GPU-22222222-bbbb/1/0", "cuda", "h1"),                    # the legacy MIG form
    ("1,0", "cuda:0", "h1"),                                        # indices (torch has no GPU here)
])
def test_cuda_visible_devices_maps_to_the_right_nvml_handle(monkeypatch, visible, device, handle):
    nv = _multi_gpu_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert probes._nvml_handle(nv, device) == handle
