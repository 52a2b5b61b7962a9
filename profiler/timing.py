"""All timing lives here (DESIGN.md "Timing"): clocks, synchronisation, repeated timing.

Only this module reads a clock. Every timestamp is taken after a device sync, so a
time on the GPU means work finished, not work queued.

``measure(fn, device)`` times a zero-argument callable and returns a ``Timing``
(raw samples in seconds, the timer that ran, the L2 policy, the settings used):

* Warm-up first, never timed: the first call compiles or autotunes (Triton's JIT,
  cuBLAS heuristics, oneDNN primitives), then a short untimed estimate gives the time
  per call, and the repetition count is derived from it and a time budget, as
  ``triton.testing.do_bench`` does (its warm-up and rep are millisecond budgets, too).
* GPU, "cuda-events": a CUDA event pair around each call. Before each repetition,
  outside the timed interval, a buffer of at least twice the L2 size (and at least
  256 MiB, do_bench's figure) is zeroed, so every call starts with a cold L2: a weight
  that fits in L2 must not look faster than HBM. Policy recorded as "flushed".
* GPU, "cuda-graph": for microsecond-scale calls (estimate under ``GRAPH_BELOW_S``)
  the call is captured once into a CUDA graph and each repetition replays it, so the
  CPU cost of launching several kernels does not open gaps between them; the L2 is
  still flushed between replays (do_bench_cudagraph does not, and a working set under
  L2 then "beats" HBM). If capture fails the events timer runs and the reason is kept.
* CPU, "cpu-clock": ``time.perf_counter`` around each call with a fixed torch thread
  count (``cpu_threads``), recorded in the config. By default the caches are not flushed
  (policy "warm"): a small model's weights can sit in a large last-level cache and run
  above the DRAM roof. ``flush_bytes`` (2 x the LLC) writes a buffer between repetitions,
  outside the timed interval (policy "flushed"); the repetition count then allows for
  the flush's time so the budget still holds.

Run ``python -m profiler.timing`` to time a 1 ms sleep and a small matmul.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

GRAPH_BELOW_S = 100e-6        # calls faster than this are timed as CUDA-graph replays
MIN_FLUSH_BYTES = 256 * 2**20  # do_bench's L2 flush buffer
TIMERS = ("cuda-events", "cuda-graph", "cpu-clock")


def synchronize(device=None) -> None:
    """Wait for queued device work (a no-op on the CPU)."""
    import torch

    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def timestamp(device=None) -> float:
    """Monotonic seconds, taken after the device has finished all queued work."""
    synchronize(device)
    return time.perf_counter()


def now() -> float:
    """Monotonic seconds with no sync: for wall-clock bookkeeping (ETA, budgets), never for kernels."""
    return time.perf_counter()


@dataclass(frozen=True)
class Timing:
    """Raw samples of one timed callable and how they were taken."""

    times_s: tuple
    timer: str                  # one of TIMERS
    l2_policy: str              # "flushed" | "warm"
    config: dict = field(default_factory=dict)  # reps, warm-up, estimate, threads, flush bytes

    @property
    def median_s(self) -> float:
        import statistics

        return statistics.median(self.times_s)


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Fix torch's intra-op thread count for the block (None: keep the current one)."""
    import torch

    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(old)


def rep_count(estimate_s: float, budget_s: float, min_reps: int, max_reps: int) -> int:
    """Repetitions that fit ``budget_s`` at ``estimate_s`` per call, clamped to [min_reps, max_reps]."""
    if estimate_s <= 0:
        return max_reps
    return int(max(min_reps, min(max_reps, budget_s // estimate_s)))


def measure(fn, device="cpu", *, budget_s: float = 0.1, warmup_s: float = 0.025, min_reps: int = 5,
            max_reps: int = 1000, timer: str = "auto", l2_bytes: int | None = None,
            flush_bytes: int = 0) -> Timing:
    """Time ``fn()`` on ``device`` ("cpu" or "cuda[:i]"): warm-up, estimate, then timed repetitions.

    ``timer``: "auto" (cpu-clock on a CPU; cuda-graph under GRAPH_BELOW_S, else cuda-events),
    or one of TIMERS to force it. ``l2_bytes``: the GPU's L2 size (read from torch if None).
    ``flush_bytes``: CPU only, a buffer written between repetitions (0: caches stay warm).
    """
    if str(device).startswith("cuda"):
        return _measure_cuda(fn, str(device), budget_s, warmup_s, min_reps, max_reps, timer, l2_bytes)
    if timer not in ("auto", "cpu-clock"):
        raise ValueError(f"timer {timer!r} needs a CUDA device; on a CPU only 'cpu-clock' runs.")
    return _measure_cpu(fn, budget_s, warmup_s, min_reps, max_reps, flush_bytes)


def _measure_cpu(fn, budget_s, warmup_s, min_reps, max_reps, flush_bytes=0) -> Timing:
    import torch

    buf = torch.empty(int(flush_bytes) // 4, dtype=torch.float32) if flush_bytes else None

    clock = time.perf_counter
    fn()  # first call: compilation, allocation, oneDNN primitive creation; never timed
    # estimate: the median of a few calls (the first ones after compilation are often slow)
    est_times, t_start = [], clock()
    while len(est_times) < 5 and (not est_times or clock() - t_start < warmup_s):
        t0 = clock()
        fn()
        est_times.append(clock() - t0)
    n = len(est_times)
    est = sorted(est_times)[n // 2]
    warm = rep_count(est, warmup_s, 0, max_reps) - n
    for _ in range(max(0, warm)):
        fn()
    flush_s = 0.0
    if buf is not None:
        t0 = clock()
        buf.fill_(1.0)  # first touch; then one timed write to know what a flush costs
        buf.fill_(2.0)
        flush_s = clock() - t0
    reps = rep_count(est + flush_s / 2, budget_s, min_reps, max_reps)
    times = []
    for i in range(reps):
        if buf is not None:
            buf.fill_(float(i))  # evict fn's working set, outside the timed interval
        t0 = clock()
        fn()
        times.append(clock() - t0)
    config = {"reps": reps, "warmup_calls": 1 + n + max(0, warm), "estimate_s": est,
              "threads": torch.get_num_threads(), "budget_s": budget_s}
    if buf is not None:
        config["flush_bytes"] = int(flush_bytes)
    return Timing(tuple(times), "cpu-clock", "flushed" if buf is not None else "warm", config)


class _Flusher:
    """Zeroes a buffer of at least 2 x L2 between repetitions, outside the timed interval."""

    def __init__(self, device: str, l2_bytes: int | None):
        import torch

        if l2_bytes is None:
            l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        self.nbytes = max(2 * int(l2_bytes), MIN_FLUSH_BYTES)
        self.buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self):
        self.buf.zero_()


def _events_times(call, flush, reps: int) -> list:
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]  # elapsed_time is in ms


def _capture_graph(fn):
    """A CUDA graph of one call of ``fn`` (warmed on a side stream, as torch's docs ask)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def _measure_cuda(fn, device, budget_s, warmup_s, min_reps, max_reps, timer, l2_bytes) -> Timing:
    import torch

    with torch.cuda.device(device):
        fn()  # compile / autotune: never timed
        torch.cuda.synchronize()
        flush = _Flusher(device, l2_bytes)
        est_times = _events_times(fn, flush, 5)
        est = sorted(est_times)[2]
        config = {"estimate_s": est, "flush_bytes": flush.nbytes, "budget_s": budget_s}
        call, used = fn, "cuda-events"
        want_graph = timer == "cuda-graph" or (timer == "auto" and est < GRAPH_BELOW_S)
        if want_graph:
            try:
                g = _capture_graph(fn)
                call, used = g.replay, "cuda-graph"
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - any capture failure falls back to events
                torch.cuda.synchronize()
                config["graph_fallback"] = f"{type(e).__name__}: {str(e)[:200]}"
        # warm-up by time budget (the flush counts: it runs every repetition too)
        warm = rep_count(est, warmup_s, 1, max_reps)
        _events_times(call, flush, warm)
        reps = rep_count(est, budget_s, min_reps, max_reps)
        times = _events_times(call, flush, reps)
        config.update(reps=reps, warmup_calls=1 + 5 + warm)
        return Timing(tuple(times), used, "flushed", config)


if __name__ == "__main__":  # pragma: no cover
    import statistics

    import torch

    t = measure(lambda: time.sleep(1e-3), budget_s=0.05)
    print(f"sleep(1 ms): median {statistics.median(t.times_s) * 1e3:.3f} ms over {len(t.times_s)} reps ({t.timer})")
    a = torch.randn(256, 256)
    t = measure(lambda: a @ a)
    print(f"256^3 matmul: median {statistics.median(t.times_s) * 1e6:.1f} us, config {t.config}")
