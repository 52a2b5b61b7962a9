"""profiler.ceilings on the CPU: positive figures, the 8x-cache working set, the cache and --remeasure."""

import json

import pytest
from click.testing import CliRunner

from profiler import ceilings as C
from profiler import probes
from profiler.cli import main


@pytest.fixture
def small_cpu(tmp_path, monkeypatch):
    """A pretend 1 MiB last-level cache and small GEMMs, so a measurement takes a fraction of a second."""
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(probes, "llc_bytes", lambda *a: (2**20, "test"))
    monkeypatch.setattr(C, "CPU_SHAPES", ((128, 128, 128), (256, 128, 192)))
    monkeypatch.setattr(C, "_measured_busy", lambda a, b: False)   # the real load must not decide these tests
    return tmp_path / "cache"


def test_cpu_ceilings_are_positive_and_over_8x_the_cache(small_cpu):
    c = C.get_ceilings("cpu", quick=True)
    d = c.device
    assert d.kind == "cpu" and d.source == "measured" and c.datasheet is None
    assert d.peak_flops["fp32"] > 0 and d.peak_flops["bf16"] > 0 and d.bandwidth > 0
    bw = c.details["bandwidth"]
    assert d.bandwidth == max(bw["copy_bytes_per_s"], bw["read_bytes_per_s"])
    assert c.details["working_set_bytes"] == 8 * 2**20 and c.details["label"] == "achievable"
    # the GEMM figure is 2MNK / median of the best shape
    g = c.details["gemm"]["fp32"]
    best = max(g["shapes"], key=lambda r: r["flops_per_s"])
    m, n, k = best["shape"]
    assert best["flops_per_s"] == pytest.approx(2 * m * n * k / best["median_s"])
    assert "achievable" in C.ceilings_table(c)


def test_cache_hit_then_remeasure(small_cpu):
    first = C.get_ceilings("cpu", quick=True)
    assert not first.cached
    files = list(small_cpu.glob("ceilings-*.json"))
    assert len(files) == 1
    again = C.get_ceilings("cpu", quick=True)
    assert again.cached and again.device.peak_flops == first.device.peak_flops
    fresh = C.get_ceilings("cpu", quick=True, remeasure=True)
    assert not fresh.cached
    files[0].write_text("{ not json")          # a corrupt cache is measured again, not an error
    assert not C.get_ceilings("cpu", quick=True).cached


def test_cache_key_carries_versions():
    key = C.cache_key("cpu", "X", 2)
    assert {"torch", "triton", "cuda", "driver", "threads", "method"} <= set(key)
    other = dict(key, torch="0.0")
    assert C._cache_path(key) != C._cache_path(other)


def test_ceilings_command_json(small_cpu):
    r = CliRunner().invoke(main, ["ceilings", "--json", "--device", "cpu", "--quick"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["device"]["bandwidth"] > 0 and d["datasheet"] is None
    r = CliRunner().invoke(main, ["ceilings", "--device", "cpu", "--quick"])
    assert "[cached]" in r.output and "fp32 GEMM" in r.output


def test_a_busy_measurement_is_flagged_and_never_cached(small_cpu, monkeypatch):
    monkeypatch.setattr(C, "_measured_busy", lambda a, b: True)
    busy = C.get_ceilings("cpu", quick=True)
    assert busy.details["flags"] == ["host-busy"] and "not cached" in busy.details["not_cached"]
    assert "were not cached" in C.ceilings_table(busy)
    assert list(small_cpu.glob("ceilings-*.json")) == []              # not the machine's ceilings
    assert C.cached_ceilings("cpu") is None
    again = C.get_ceilings("cpu", quick=True)                          # still busy: measured again, still uncached
    assert not again.cached and again.details["flags"] == ["host-busy"]
    monkeypatch.setattr(C, "_measured_busy", lambda a, b: False)
    quiet = C.get_ceilings("cpu", quick=True)
    assert not quiet.cached and quiet.details["flags"] == [] and "not_cached" not in quiet.details
    assert len(list(small_cpu.glob("ceilings-*.json"))) == 1
    assert C.cached_ceilings("cpu").device.bandwidth == quiet.device.bandwidth


def test_an_older_cached_busy_measurement_is_not_used(small_cpu):
    quiet = C.get_ceilings("cpu", quick=True)
    f = next(small_cpu.glob("ceilings-*.json"))
    d = json.loads(f.read_text())
    d["details"]["flags"] = ["host-busy"]
    f.write_text(json.dumps(d))
    assert C.cached_ceilings("cpu") is None and not C.get_ceilings("cpu", quick=True).cached
    assert quiet.device.bandwidth > 0


@pytest.mark.gpu
def test_gpu_ceilings_beside_the_datasheet(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    c = C.get_ceilings("cuda", quick=True, remeasure=True)
    assert c.device.kind == "gpu" and c.details["working_set_bytes"] >= 8 * c.details["cache_bytes"]
    assert set(C.GPU_DTYPES) <= set(c.device.peak_flops)
    if c.datasheet is not None:   # a catalogued GPU: measured / datasheet, HBM copies reach 60-100%
        r = c.details["vs_datasheet"]
        assert 0.5 < r["bandwidth"] < 1.05 and 0.3 < r["bf16"] < 1.05


def test_a_gemm_shape_past_the_budget_stops_the_larger_ones(monkeypatch):
    """On a CPU without a dtype's instructions one bf16 call of 2048^3 takes about a minute (three repetitions:
    minutes): once a shape's call is past the shape's budget the larger shapes are not timed, and the result says
    which and why. Times are injected (no real GEMM is timed)."""
    from types import SimpleNamespace

    from profiler import ceilings as C

    medians = {(8, 8, 8): 0.5, (16, 16, 16): 99.0}
    timed = []

    def fake_measure(call, device, **kw):
        shape = call()
        timed.append(shape)
        return SimpleNamespace(median_s=medians[shape])

    monkeypatch.setattr(C, "measure", fake_measure)
    out = C._best_gemm("cpu", ((8, 8, 8), (16, 16, 16)), True, lambda m, n, k: (lambda: (m, n, k)))
    assert timed == [(8, 8, 8)]
    assert out["best_flops"] == 2 * 8 ** 3 / 0.5 and out["best_shape"] == [8, 8, 8]
    assert out["skipped_shapes"] == [[16, 16, 16]]
    assert out["skipped_why"] == ("one call of [8, 8, 8] took 0.5 s, past the 0.1 s budget of a shape: the larger "
                                  "ones were not timed")
    medians[(8, 8, 8)] = 0.01                                   # under the budget: every shape is timed
    timed.clear()
    out = C._best_gemm("cpu", ((8, 8, 8), (16, 16, 16)), True, lambda m, n, k: (lambda: (m, n, k)))
    assert timed == [(8, 8, 8), (16, 16, 16)] and "skipped_shapes" not in out
