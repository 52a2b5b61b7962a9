"""profiler.timing: repeated timing on the CPU clock, rep counts, thread pinning; the GPU timer's decisions
with a fake torch.cuda; real GPU paths (marked)."""

import math
import time
import types

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


# ---- the GPU timer's decisions, with a fake torch.cuda (no GPU needed) -----------------------

class FakeCuda:
    """Stands in for timing.CudaOps: each call 'takes' the time given for eager calls or replays."""

    OutOfMemoryError = MemoryError

    def __init__(self, eager_s, graph_s=None, capture_error=None):
        self.eager_s, self.graph_s, self.capture_error = eager_s, graph_s, capture_error
        self.flushes, self.captured = 0, 0

    def context(self):
        import contextlib

        return contextlib.nullcontext()

    def synchronize(self):
        pass

    def flusher(self, l2_bytes):
        fake = self

        class F:
            nbytes, read_nbytes = 256 * 2**20, 128 * 2**20

            def __call__(self):
                fake.flushes += 1
        return F()

    def capture(self, fn):
        if self.capture_error:
            raise self.capture_error
        self.captured += 1
        return types.SimpleNamespace(replay=lambda: "replay")

    def times(self, call, flush, reps):
        out = []
        for _ in range(reps):
            flush()
            out.append(self.graph_s if call() == "replay" else self.eager_s)
        return out


def test_graph_decision_comes_from_the_replay_estimate():
    # a decode layer: 250 us eagerly (launch gaps), 130 us as a graph: over 100 us either way, yet a graph
    fake = FakeCuda(eager_s=250e-6, graph_s=130e-6)
    t = timing.measure(lambda: None, "cuda", budget_s=0.01, cuda_ops=fake)
    assert t.timer == "cuda-graph" and t.median_s == 130e-6 and t.l2_policy == "flushed"
    assert t.config["eager_estimate_s"] == 250e-6 and t.config["graph_estimate_s"] == 130e-6
    assert t.config["launch_overhead_s"] == pytest.approx(120e-6) and t.config["estimate_s"] == 130e-6
    assert fake.flushes == t.config["warmup_calls"] - 1 + t.config["reps"]   # every call but the first is flushed
    # a 2 ms kernel that a graph saves 1% on: events, with both estimates kept
    t = timing.measure(lambda: None, "cuda", budget_s=0.01, cuda_ops=FakeCuda(2e-3, 1.98e-3))
    assert t.timer == "cuda-events" and t.config["graph_estimate_s"] == 1.98e-3
    assert t.config["launch_overhead_s"] == pytest.approx(20e-6)
    # a 20 ms GEMM is not captured at all
    fake = FakeCuda(20e-3, 20e-3)
    t = timing.measure(lambda: None, "cuda", budget_s=0.1, cuda_ops=fake)
    assert t.timer == "cuda-events" and fake.captured == 0 and "graph_estimate_s" not in t.config
    # a tiny kernel whose graph is no faster is still graph-timed (under 100 us)
    assert timing.measure(lambda: None, "cuda", budget_s=0.01, cuda_ops=FakeCuda(8e-6, 8e-6)).timer == "cuda-graph"


def test_capture_failure_falls_back_to_events_with_the_reason():
    fake = FakeCuda(50e-6, capture_error=RuntimeError("operation not permitted when stream is capturing"))
    t = timing.measure(lambda: None, "cuda", budget_s=0.01, cuda_ops=fake)
    assert t.timer == "cuda-events" and "not permitted" in t.config["graph_fallback"]
    assert t.config["eager_estimate_s"] == 50e-6 and "graph_estimate_s" not in t.config
    with pytest.raises(MemoryError):
        timing.measure(lambda: None, "cuda", cuda_ops=FakeCuda(50e-6, capture_error=MemoryError("oom")))


def test_the_flush_writes_then_reads_so_the_l2_ends_clean():
    f = timing._Flusher("cpu", l2_bytes=2**20, min_bytes=0, min_read_bytes=0)
    assert f.nbytes == 2 * 2**20 and f.read_nbytes == 2 * 2**20       # each >= 2 x L2
    log = []

    class Spy:
        def __init__(self, what):
            self.what = what

        def zero_(self):
            log.append(("write", self.what))

        def max(self):
            log.append(("read", self.what))
    f.buf, f.rbuf = Spy("buf"), Spy("rbuf")
    f()
    assert log == [("write", "buf"), ("read", "rbuf")]
    big = timing._Flusher("cpu", l2_bytes=0, min_bytes=4096, min_read_bytes=8192)
    assert big.buf.numel() * 4 == 4096 and big.rbuf.numel() * 4 == 8192 and not big.rbuf.any()
