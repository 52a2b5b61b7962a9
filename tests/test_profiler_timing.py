"""profiler.timing: repeated timing on the CPU clock, rep counts, thread pinning; GPU paths (marked)."""

import math
import time

import pytest
import torch

from profiler import timing
from roofline.cost import Cost
from roofline.records import Measurement, WorkloadPoint


def test_sleep_is_timed_by_the_cpu_clock():
    t = timing.measure(lambda: time.sleep(2e-3), budget_s=0.03, warmup_s=0.0, min_reps=5)
    assert t.timer == "cpu-clock" and t.l2_policy == "warm"
    assert len(t.times_s) >= 5 and len(t.times_s) == t.config["reps"]
    assert 2e-3 <= t.median_s < 2e-3 + 8e-3          # sleep never returns early; the slack is the scheduler's
    assert t.config["threads"] == torch.get_num_threads()


def test_rep_count_follows_the_budget():
    # 0.1 s budget at 1 ms per call: 100 reps; clamped to [5, 50]
    assert timing.rep_count(1e-3, 0.1, 5, 1000) == 100
    assert timing.rep_count(1e-3, 0.1, 5, 50) == 50
    assert timing.rep_count(1.0, 0.1, 5, 1000) == 5      # slower than the budget: the minimum
    assert timing.rep_count(0.0, 0.1, 5, 1000) == 1000


def test_first_call_is_never_timed():
    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.05)   # "compilation": must not reach the samples

    t = timing.measure(fn, budget_s=0.01, warmup_s=0.0, min_reps=5)
    assert max(t.times_s) < 0.02
    assert len(calls) == t.config["warmup_calls"] + t.config["reps"]


def test_cpu_threads_are_fixed_and_restored():
    before = torch.get_num_threads()
    with timing.cpu_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
        t = timing.measure(lambda: None, budget_s=0.001)
        assert t.config["threads"] == 1
    assert torch.get_num_threads() == before


def test_cpu_cache_flush_between_repetitions():
    a = torch.randn(64, 64)
    t = timing.measure(lambda: a @ a, budget_s=0.01, warmup_s=0.0, flush_bytes=4 * 2**20)
    assert t.l2_policy == "flushed" and t.config["flush_bytes"] == 4 * 2**20
    assert timing.measure(lambda: a @ a, budget_s=0.002).l2_policy == "warm"


def test_a_gpu_timer_on_the_cpu_is_refused():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        timing.measure(lambda: None, "cpu", timer="cuda-graph")


def test_wide_spread_is_derived_from_the_samples():
    p = WorkloadPoint("m", "q_proj", "decode", 1, 1, 16, Cost(100.0, 10.0))
    narrow = Measurement(p, times_s=(1.0, 1.01, 1.0, 0.99, 1.0))
    wide = Measurement(p, times_s=(1.0, 2.0, 1.0, 3.0, 1.0, 1.5))
    assert not narrow.wide_spread and "wide-spread" not in narrow.all_flags
    # sorted 1,1,1,1.5,2,3: p20 = 1, p80 = 2, median 1.25 -> (2 - 1) / 1.25 = 0.8 > 0.10
    assert wide.spread == pytest.approx(0.8) and "wide-spread" in wide.all_flags


def test_timestamp_is_monotonic():
    a = timing.timestamp()
    b = timing.timestamp("cpu")
    assert b >= a and not math.isnan(a)


@pytest.mark.gpu
def test_cuda_events_flush_l2_and_graphs_for_small_kernels():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t = timing.measure(lambda: a @ a, "cuda", timer="cuda-events", budget_s=0.05)
    assert t.timer == "cuda-events" and t.l2_policy == "flushed"
    assert t.config["flush_bytes"] >= 2 * torch.cuda.get_device_properties(0).L2_cache_size
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    t = timing.measure(lambda: x + 1, "cuda", budget_s=0.02)
    assert t.timer == "cuda-graph" and t.median_s < 1e-3
