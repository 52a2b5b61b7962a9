"""A CPU is a machine with caches (issue 22): cache levels as ceilings, classification against them, the figure.

A synthetic CPU: fp32 peak 100 GFLOP/s, DRAM 10 GB/s, an L2 of 2 MiB at 80 GB/s and an L3 of 32 MiB at
40 GB/s. Each point's time is chosen so that it moves a stated number of bytes/s:

    op            working set              moves     judged against        roof fraction  label
    down_proj     2.75 MiB weight (fp32)   30 GB/s   L3 (40 GB/s)          0.75           cache-resident
    attn_norm     1 MiB                    60 GB/s   L2 (80: the slowest   0.75           cache-resident
                                                      level that bounds it)
    attn_norm b2  1 MiB                    30 GB/s   L3 (40)               0.75           cache-resident
    swiglu        1 MiB                    100 GB/s  L2 (no level bounds   1.25 (above)   cache-resident
                                                      it: the fastest)
    attention     64 MiB (fits none)       12 GB/s   DRAM                  1.2 (above)    memory
    mlp_residual  1 MiB                    8 GB/s    DRAM (below its roof) 0.8            memory

No timing anywhere: the times are written into the records.
"""

import math
from pathlib import Path

import numpy as np
import pytest

from profiler import ceilings as C
from reports.roofline_plot import plot_roofline
from reports.style import new_figure
from roofline.analysis import analyze
from roofline.working_set import working_set_bytes
from roofline.bounds import CACHE_RESIDENT, roof_for
from roofline.cost import Cost
from roofline.devices import CacheLevel, Device, cpu_device
from roofline.verdicts.diagnosis import diagnose
from roofline.errors import RooflineError
from roofline.records import Measurement, ResultFile, RunHeader, WorkloadPoint

MiB = 2**20
GB = 1e9


def cpu(levels=True) -> Device:
    d = cpu_device("Test CPU", {"fp32": 100 * GB}, 10 * GB)
    return d.with_cache_levels([("L3", 32 * MiB, 40 * GB), ("L2", 2 * MiB, 80 * GB)]) if levels else d


def gpu() -> Device:
    """An H100-like card whose L2 (34 MB, 10 TB/s) holds one 4096 x 4096 bf16 weight (33.5 MB) but not its
    activations besides."""
    return Device("test-gpu", "Test GPU", "gpu", {"bf16": 1e15}, 3e12, 80e9, 34e6).with_cache_levels(
        [CacheLevel("L2", 34e6, 10e12, "custom")])


def point(op, cost, *, batch=1, new=1, phase="decode", dtype="fp32"):
    return WorkloadPoint("small", op, phase, batch, new, 64, cost, dtype=dtype, weight_dtype=dtype, kv_dtype=dtype,
                         compute_dtype=dtype)


def at(p, bytes_per_s, op_flags=()):
    """A measurement of ``p`` whose median moves ``bytes_per_s``."""
    t = p.cost.bytes / bytes_per_s
    return Measurement(p, (t, t, t), flags=tuple(op_flags))


def result_file(device, measurements, dtype="fp32"):
    return ResultFile(Path("synthetic.jsonl"), RunHeader(device=device, dtype=dtype), list(measurements))


DOWN = Cost(2 * 1408 * 512, 1408 * 512 * 4 + (1408 + 512) * 4)   # decode down_proj of `small`, fp32, batch 1
NORM = Cost(MiB // 4, MiB)                                       # intensity 0.25


@pytest.fixture(scope="module")
def cpu_run():
    ms = [at(point("down_proj", DOWN), 30 * GB),
          at(point("attn_norm", NORM), 60 * GB),
          at(point("attn_norm", NORM, batch=2), 30 * GB),
          at(point("swiglu", NORM), 100 * GB),
          at(point("attention", Cost(16 * MiB, 64 * MiB)), 12 * GB),
          at(point("mlp_residual", NORM), 8 * GB)]
    return result_file(cpu(), ms)


def results(rf):
    return {(r.op, r.point.batch): r for r in analyze(rf).results}


def test_the_working_set_is_a_linear_ops_weight_else_its_bytes():
    assert working_set_bytes(point("down_proj", DOWN)) == 1408 * 512 * 4
    # prefill: 2 x 100 rows; the head reads only the last token of each of the 2 sequences
    assert working_set_bytes(point("q_proj", Cost(2 * 200 * 512 * 512, 0), batch=2, new=100,
                                   phase="prefill", dtype="bf16")) == 512 * 512 * 2
    assert working_set_bytes(point("lm_head", Cost(2 * 2 * 512 * 8192, 0), batch=2, new=100,
                                   phase="prefill", dtype="bf16")) == 512 * 8192 * 2
    assert working_set_bytes(point("attn_norm", NORM)) == MiB


def test_each_point_is_judged_against_the_level_that_served_it(cpu_run):
    r = results(cpu_run)
    want = {("down_proj", 1): ("L3", 0.75, CACHE_RESIDENT), ("attn_norm", 1): ("L2", 0.75, CACHE_RESIDENT),
            ("attn_norm", 2): ("L3", 0.75, CACHE_RESIDENT), ("swiglu", 1): ("L2", 1.25, CACHE_RESIDENT),
            ("attention", 1): ("", 1.2, "memory"), ("mlp_residual", 1): ("", 0.8, "memory")}
    got = {k: (v.roof.level_name, v.roof_fraction, v.label) for k, v in r.items()}
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}
    assert {k: v[2] for k, v in got.items()} == {k: v[2] for k, v in want.items()}
    for k, (_, frac, _) in want.items():
        assert got[k][1] == pytest.approx(frac), k
    assert r[("down_proj", 1)].verdict == "cache-resident (L3)"
    assert r[("down_proj", 1)].roof.bandwidth == 40 * GB and r[("down_proj", 1)].roof.dram_bandwidth == 10 * GB
    assert [k for k, v in r.items() if v.above_roof] == [("swiglu", 1), ("attention", 1)]


def test_without_cache_levels_the_same_points_sit_above_the_dram_roof(cpu_run):
    r = results(result_file(cpu(levels=False), cpu_run.measurements))
    assert r[("down_proj", 1)].roof_fraction == pytest.approx(3.0) and r[("down_proj", 1)].label == "memory"
    assert r[("down_proj", 1)].above_roof and r[("down_proj", 1)].roof.level is None


def test_roof_for_is_the_one_rule():
    d = cpu()
    assert roof_for(d, "fp32", "fp32").bandwidth == 10 * GB                              # analytic: DRAM
    assert roof_for(d, "fp32", "fp32", working_set_bytes=MiB, achieved_bytes_per_s=9 * GB).level is None
    r = roof_for(d, "fp32", "fp32", working_set_bytes=MiB, achieved_bytes_per_s=41 * GB)
    assert (r.level_name, r.bandwidth, r.ridge) == ("L2", 80 * GB, 1.25)
    assert roof_for(d, "fp32", "fp32", working_set_bytes=33 * MiB, achieved_bytes_per_s=41 * GB).level is None
    # a level measured slower than DRAM (a busy host) is never a roof
    slow = cpu_device("slow", {"fp32": 100 * GB}, 10 * GB).with_cache_levels([("L3", 32 * MiB, 5 * GB)])
    assert roof_for(slow, "fp32", "fp32", working_set_bytes=MiB, achieved_bytes_per_s=20 * GB).level is None


def test_a_gpu_l2_roof_takes_a_linear_by_its_weight_not_its_bytes():
    # prefill q_proj, 64 tokens x 4096 -> 4096, bf16: weight 33,554,432 B fits the 34 MB L2; with its
    # activations (34,603,008 B) it would not. It moves 6 TB/s, twice the HBM roof.
    cost = Cost(2 * 64 * 4096 * 4096, 4096 * 4096 * 2 + 64 * 8192 * 2)
    q = point("q_proj", cost, new=64, phase="prefill", dtype="bf16")
    same_bytes = point("attention", cost, new=64, phase="prefill", dtype="bf16")
    r = results(result_file(gpu(), [at(q, 6e12), at(same_bytes, 6e12)], dtype="bf16"))
    lin, other = r[("q_proj", 1)], r[("attention", 1)]
    assert lin.roof.level_name == "L2" and lin.label == CACHE_RESIDENT
    assert lin.roof_fraction == pytest.approx(0.6)             # 6 of the L2's 10 TB/s (intensity 62 < ridge 100)
    assert other.roof.level is None and other.roof_fraction == pytest.approx(2.0) and other.above_roof


def test_a_step_of_cache_resident_ops_is_cache_resident_and_says_which_level():
    # batch 4: down_proj (2.75 MiB weight) and attn_norm (1 MiB), both at 30 GB/s -> the step moves 30 GB/s,
    # its largest op's working set is 2.75 MiB: the L3's roof, 75%
    down4 = Cost(2 * 4 * 1408 * 512, 1408 * 512 * 4 + 4 * (1408 + 512) * 4)
    rf = result_file(cpu(), [at(point("down_proj", down4, batch=4), 30 * GB),
                             at(point("attn_norm", NORM, batch=4), 30 * GB)])
    (s,) = analyze(rf).steps
    assert s.label == CACHE_RESIDENT and s.roof.level_name == "L3"
    assert s.working_set_bytes == 1408 * 512 * 4
    assert s.roof_fraction == pytest.approx(0.75)
    assert s.ceiling.level == "L3" and s.ceiling.value == 40 * GB
    assert "is cache-resident (L3), not DRAM-bound: 75% of the 40 GB/s measured L3 bandwidth roof" in s.sentence, \
        s.sentence
    assert "working set of 2.88 MB fits the 33.6 MB L3" in s.sentence and "above the 10 GB/s DRAM roof" in s.sentence


def test_diagnose_on_a_cpu_never_advises_cuda_graphs():
    # every op at 1 GB/s: 10% of the 10 GB/s DRAM roof -> overhead
    slow = [at(point(op, NORM, batch=b), 1 * GB) for op in ("attn_norm", "swiglu") for b in (1, 8)]
    cpu_found = diagnose([result_file(cpu(), slow)])
    over = [f for f in cpu_found if f.rule == "overhead-bound"]
    assert len(over) == 1 and "thread" in over[0].action and "OpenMP" in over[0].action
    assert not any("CUDA" in f.action for f in cpu_found)
    gpu_dev = Device("g", "G", "gpu", {"fp32": 100 * GB}, 10 * GB)
    (g_over,) = [f for f in diagnose([result_file(gpu_dev, slow)]) if f.rule == "overhead-bound"]
    assert "CUDA graphs" in g_over.action


def test_diagnose_names_the_cache_level(cpu_run):
    found = diagnose([cpu_run])
    (cache,) = [f for f in found if f.rule == "cache-resident"]
    # batch 1 holds the 64 MiB attention: its largest working set fits no level, so the step stays on DRAM
    assert cache.claim.startswith("Decode ran from cache at b2/ctx64: faster than the 10 GB/s DRAM roof")
    assert "b2/ctx64 in the L3 (1.05 MB of 33.6 MB, 30 GB/s)" in cache.evidence and "CUDA" not in cache.action
    assert [(s.batch, s.roof.level_name) for s in analyze(cpu_run).steps] == [(1, ""), (2, "L3")]


def test_the_figure_draws_one_roof_per_cache_level(cpu_run):
    fig, ax = new_figure(10, 6.4)
    plot_roofline(ax, cpu_run)
    roofs = {ln.get_gid(): ln for ln in ax.lines if str(ln.get_gid()).startswith("ceiling:cache:")}
    assert sorted(roofs) == ["ceiling:cache:L2", "ceiling:cache:L3"]
    for name, bw in (("L2", 80 * GB), ("L3", 40 * GB)):
        x, y = roofs[f"ceiling:cache:{name}"].get_xdata(), roofs[f"ceiling:cache:{name}"].get_ydata()
        assert y[0] / x[0] == pytest.approx(bw) and y[1] == pytest.approx(100 * GB)    # slope, up to the peak
        assert x[1] == pytest.approx(100 * GB / bw) and (x[-1], y[-1]) == pytest.approx((10.0, 100 * GB))  # then
        # along the peak to the DRAM roof's elbow (100 GFLOP/s / 10 GB/s)
    labels = [t.get_text() for t in ax.texts if str(t.get_gid()).startswith("ceiling-label:cache:")]
    assert len(labels) == 2 and any("L3 40 GB/s" in t for t in labels)
    fig2, ax2 = new_figure(10, 6.4)
    plot_roofline(ax2, result_file(cpu(levels=False), cpu_run.measurements))
    assert len(ax.lines) - len(ax2.lines) == 2
    assert not any(str(ln.get_gid()).startswith("ceiling:cache:") for ln in ax2.lines)


def test_cache_levels_travel_in_the_header_and_bad_ones_are_refused():
    d = cpu()
    back = Device.from_dict(d.to_dict())
    assert back.cache_levels == d.cache_levels and [c.name for c in back.cache_levels] == ["L2", "L3"]
    assert "cache_levels" not in cpu(levels=False).to_dict()
    bad = dict(d.to_dict(), cache_levels=[{"name": "L3", "size_bytes": -1, "bandwidth": 1e9}])
    with pytest.raises(RooflineError, match=r"cache_levels\[0\] \(L3\): size_bytes must be a positive number"):
        Device.from_dict(bad)


# ---------------------------------------------------------------- the measurement (no speed asserted)

def test_cache_sizes_from_sysfs_sum_private_instances(tmp_path):
    def cache(cpu_n, index, level, kind, size, shared):
        d = tmp_path / f"cpu{cpu_n}" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        for name, text in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(text + "\n")
    for c in (0, 1):
        cache(c, 0, 1, "Data", "48K", str(c))
        cache(c, 1, 1, "Instruction", "32K", str(c))
        cache(c, 2, 2, "Unified", "1280K", str(c))
        cache(c, 3, 3, "Unified", "30720K", "0-1")
    levels = C.cpu_cache_levels(str(tmp_path), cpus=[0, 1])
    assert [(n, b, k) for n, b, _, k in levels] == [("L2", 2 * 1280 * 1024, 2), ("L3", 30720 * 1024, 1)]
    assert [(n, b, k) for n, b, _, k in C.cpu_cache_levels(str(tmp_path), cpus=[1])] == [("L2", 1280 * 1024, 1),
                                                                                        ("L3", 30720 * 1024, 1)]
    text = "L1d cache: 64 KiB (2 instances)\nL2 cache: 2 MiB (2 instances)\nL3 cache: 32 MiB (1 instance)\n"
    assert [(n, b, k) for n, b, _, k in C._lscpu_cache_levels(text)] == [("L2", 2 * MiB, 2), ("L3", 32 * MiB, 1)]


def test_the_cache_benchmark_gives_a_finite_bandwidth_per_level():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rows = C.measure_cache_levels("cpu", [("L2", 128 * 1024, "test", 2), ("L3", 512 * 1024, "test", 1),
                                              ("L4", 600 * 1024, "test")], quick=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    assert [r["name"] for r in rows] == ["L2", "L3", "L4"]
    assert [r.get("working_set_bytes") for r in rows] == [64 * 1024, 256 * 1024, None]
    # one thread over one instance's share: half of the L2's 64 KiB working set, all of the shared L3's
    assert [r["one_thread_x"]["working_set_bytes"] for r in rows[:2]] == [32 * 1024, 256 * 1024]
    for r in rows[:2]:
        assert math.isfinite(r["bandwidth"]) and r["bandwidth"] > 0 and r["timer"] == "cpu-clock"
        assert r["bandwidth"] == max(r["copy_bytes_per_s"], r["read_bytes_per_s"])
        assert r["bandwidth"] == max(r["all_threads"]["bandwidth"], r["one_thread_x"]["bandwidth"])
        for way in ("all_threads", "one_thread_x"):   # the fastest repetition: never below the median's figure
            assert r[way]["copy_bytes_per_s"] >= r[way]["median_copy_bytes_per_s"] > 0
    # 1.5 x 512 KiB does not fit well inside 600 KiB: not measured, and said
    assert rows[2]["bandwidth"] is None and "not measured" in rows[2]["note"]


def test_measured_cpu_ceilings_carry_the_levels(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(C, "cpu_cache_levels", lambda: [("L2", 2 * MiB, "t"), ("L3", 32 * MiB, "t")])
    monkeypatch.setattr(C, "measure_cache_levels", lambda dev, levels, quick=False: [
        {"name": n, "size_bytes": s, "source": src, "bandwidth": bw} for (n, s, src), bw in zip(levels, (8e10, 4e10))])
    monkeypatch.setattr(C, "measure_bandwidth", lambda dev, ws, quick=False: {
        "copy_bytes_per_s": 1e10, "read_bytes_per_s": 2e10, "copy_bytes": ws, "read_bytes": ws, "timer": "cpu-clock"})
    monkeypatch.setattr(C, "measure_gemm", lambda dev, dt, quick=False: {"best_flops": 1e11, "best_shape": [1, 1, 1]})
    c = C.get_ceilings("cpu", remeasure=True, dtypes=("fp32",))
    assert [(x.name, x.size_bytes, x.bandwidth) for x in c.device.cache_levels] == [("L2", 2 * MiB, 8e10),
                                                                                    ("L3", 32 * MiB, 4e10)]
    assert [lv["name"] for lv in c.details["cache_levels"]] == ["L2", "L3"]
    table = C.ceilings_table(c)
    assert "L3 (32 MiB)" in table and "not used as a roof" not in table
    slow = C.Ceilings(c.device, None, dict(c.details, cache_levels=[dict(c.details["cache_levels"][1], bandwidth=1e10)]))
    assert "L3 measured no faster than DRAM: not used as a roof" in C.ceilings_table(slow)
    np.testing.assert_allclose(c.device.bandwidth, 2e10)
