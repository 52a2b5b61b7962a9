"""Which GEMM ceilings `ceilings` measures (fp8 from sm_89, fp4 from sm_100, from the precision registry) and
why the others are not; an older cache without them still reads. No GPU: the plan is checked on fake devices,
and the fp8 call itself on the CPU (torch._scaled_mm runs there); nothing here fakes a measurement."""

import json
import types

import pytest
import torch

from profiler import ceilings as C
from profiler import probes
from roofline.devices import find_device


def fake_torch(*lacking):
    """This torch, minus the names in ``lacking``."""
    return types.SimpleNamespace(**{n: getattr(torch, n) for n in ("float8_e4m3fn", "float4_e2m1fn_x2", "_scaled_mm")
                                    if n not in lacking})


def plan(*a, **k):
    return {p.dtype: (p.measure, p.reason) for p in C.plan_gemms(*a, **k)}


def test_blackwell_measures_fp8_and_fp4():
    p = plan("gpu", (10, 0), torch)
    assert [dt for dt, (m, _) in p.items() if m] == ["bf16", "fp16", "tf32", "fp32", "fp8", "fp4"]
    assert p["fp8"][1] == "fp8: sm_100 >= sm_89: torch._scaled_mm, e4m3 x e4m3 -> bf16, per-tensor fp32 scales"
    assert p["fp4"][1].startswith("fp4: sm_100 >= sm_100: torch._scaled_mm, e2m1 x e2m1 -> bf16, NVFP4")


def test_hopper_measures_fp8_and_says_why_not_fp4():
    p = plan("gpu", (9, 0), torch)
    assert p["fp8"][0] and not p["fp4"][0]
    assert p["fp4"][1] == "fp4 ceiling: not measured (sm_90 has no fp4 tensor cores; they start at sm_100)"
    assert plan("gpu", (8, 9), torch)["fp8"][0]                       # Ada L4 / RTX 4090


def test_ampere_measures_neither():
    p = plan("gpu", (8, 0), torch)
    assert [dt for dt, (m, _) in p.items() if m] == list(C.GPU_DTYPES)
    assert p["fp8"][1] == "fp8 ceiling: not measured (sm_80 has no fp8 tensor cores; they start at sm_89)"


def test_a_torch_without_the_fp4_gemm_says_so():
    p = plan("gpu", (10, 0), fake_torch("float4_e2m1fn_x2"))
    assert p["fp8"][0] and not p["fp4"][0]
    assert p["fp4"][1] == "fp4 ceiling: not measured (this torch has no FP4 GEMM: no torch.float4_e2m1fn_x2)"
    p = plan("gpu", (9, 0), fake_torch("_scaled_mm"))
    assert p["fp8"][1] == "fp8 ceiling: not measured (this torch has no FP8 GEMM: no torch._scaled_mm)"


def test_cpu_and_rocm_plans():
    p = plan("cpu", None, torch)
    assert [dt for dt, (m, _) in p.items() if m] == list(C.CPU_DTYPES)
    assert p["fp8"][1] == "fp8 ceiling: not measured (a CPU has no fp8 tensor cores)"
    r = plan("gpu", (9, 4), torch, hip=True)
    assert not r["fp8"][0] and "ROCm" in r["fp8"][1] and "e4m3fnuz" in r["fp8"][1]


def test_the_fp8_gemm_call_runs_through_torch_on_the_cpu():
    # the operands `ceilings` times on a GPU, at a small shape: e4m3 x e4m3 with unit per-tensor scales -> bf16
    g = torch.Generator().manual_seed(0)
    out = C.SCALED_GEMMS["fp8"].operands(torch, 64, 32, 128, "cpu", g)()
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (64, 32)


def test_blocked_scale_shape():
    # 8,192 rows x (8,192 / 16 = 512) NVFP4 blocks: rows padded to 128, blocks to 4 -> 2,048 x 2,048 = 8192 * 512
    assert C.blocked_scales_shape(8192, 512) == (2048, 2048)
    assert C.blocked_scales_shape(100, 3) == (32, 16)      # one 128 x 4 tile


def test_table_prints_skipped_rates_beside_the_datasheet():
    ds = find_device("h100")
    c = C.Ceilings(ds, ds, {"label": "measured", "bandwidth": {"copy_bytes_per_s": 3e12, "read_bytes_per_s": 3e12},
                            "gemm": {}, "working_set_bytes": 2**31, "cache_bytes": 50 * 2**20, "cache_source": "L2",
                            "gemm_plan": [p.to_dict() for p in C.plan_gemms("gpu", (8, 0), torch)]})
    t = C.ceilings_table(c)
    assert "fp8 ceiling: not measured (sm_80 has no fp8 tensor cores; they start at sm_89); datasheet 1.98 PFLOP/s" in t
    assert "fp4 ceiling: not measured (sm_80 has no fp4 tensor cores; they start at sm_100)\n" in t   # no fp4 on H100


def test_an_older_cache_without_fp8_still_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(probes, "llc_bytes", lambda *a: (2**20, "test"))
    monkeypatch.setattr(C, "CPU_SHAPES", ((128, 128, 128),))
    monkeypatch.setattr(C, "_measured_busy", lambda a, b: False)
    first = C.get_ceilings("cpu", quick=True)
    assert set(first.details["gemm"]) == set(C.CPU_DTYPES)
    assert {p["dtype"]: p["measured"] for p in first.details["gemm_plan"]} == {
        "fp32": True, "bf16": True, "fp8": False, "fp4": False}
    # an older run's file: no gemm_plan, no low-precision keys; a plan that now asks for fp8 still reads it
    f = next(tmp_path.glob("ceilings-*.json"))
    d = json.loads(f.read_text())
    d["details"].pop("gemm_plan", None)
    f.write_text(json.dumps(d))
    monkeypatch.setattr(C, "device_plan", lambda dev: [*C.plan_gemms("cpu", None, torch)[:2],
                                                       C.GemmPlan("fp8", True, "fp8: as a GPU would")])
    hit = C.get_ceilings("cpu", quick=True)
    assert hit.cached and "fp8" not in hit.device.peak_flops
    fp8 = next(p for p in hit.details["gemm_plan"] if p["dtype"] == "fp8")
    assert not fp8["measured"] and "not in the cached measurement" in fp8["reason"] and "--remeasure" in fp8["reason"]
    assert "not in the cached measurement" in C.ceilings_table(hit)
