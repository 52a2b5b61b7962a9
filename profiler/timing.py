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
  that fits in L2 must not look faster than HBM. The flush then reads a second buffer of
  at least twice the L2, so the L2 ends holding clean lines: the zeroing leaves up to an
  L2's worth of dirty lines that the timed call would otherwise write back. Policy "flushed".
* GPU, "cuda-graph": the call is captured once into a CUDA graph and each repetition
  replays it, so the CPU cost of launching several kernels does not open gaps between
  them; the L2 is still flushed between replays (do_bench_cudagraph does not, and a
  working set under L2 then "beats" HBM). The choice is made from a graph-replay
  estimate, not the eager one: a decode layer of 20 launches around ~130 us of HBM
  traffic measures well over 100 us eagerly because of Python's launch gaps, and timing it
  eagerly would report the gaps. Calls under ``GRAPH_TRY_BELOW_S`` eagerly are captured;
  the graph timer runs when its replay estimate is under ``GRAPH_BELOW_S`` or saves more
  than ``LAUNCH_SHARE`` of the eager time. The config keeps both estimates and their
  difference ("eager_estimate_s", "graph_estimate_s", "launch_overhead_s": what launching
  costs this callable eagerly). If capture fails the events timer runs and the reason is kept.
* CPU, "cpu-clock": ``time.perf_counter`` around each call with a fixed torch thread
  count (``cpu_threads``), recorded in the config. By default the caches are not flushed
  (policy "warm"): a small model's weights can sit in a large last-level cache and run
  above the DRAM roof. ``flush_bytes`` (2 x the LLC) writes a buffer between repetitions,
  outside the timed interval (policy "flushed"); the repetition count then allows for
  the flush's time so the budget still holds.

* Several ranks at once (a collective, timed under tensor parallelism): ``agree`` turns this
  rank's per-call estimate into the one every rank uses (the max over ranks, through
  torch.distributed), so every rank makes the same number of warm-up and timed calls and the
  collectives meet; the estimate is then always 5 calls (never a time budget, which differs
  between ranks), and the GPU timer is "cuda-events" (no graph capture). ``between`` runs before
  each timed repetition, outside the timed interval (a barrier: every rank starts the call
  together, so one rank's lateness is not timed as another's collective).

Run ``python -m profiler.timing`` to time a 1 ms sleep and a small matmul.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from roofline.stats import median

GRAPH_BELOW_S = 100e-6        # a replay estimate under this: the graph timer
GRAPH_TRY_BELOW_S = 5e-3      # eager calls under this are captured to get a replay estimate
LAUNCH_SHARE = 0.05           # ... or a graph that saves more than this share of the eager time
MIN_FLUSH_BYTES = 256 * 2**20  # do_bench's L2 flush buffer (the write)
MIN_READ_BYTES = 128 * 2**20   # the clean read after it
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
        return median(self.times_s)


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
            flush_bytes: int = 0, cuda_ops=None, agree=None, between=None) -> Timing:
    """Time ``fn()`` on ``device`` ("cpu" or "cuda[:i]"): warm-up, estimate, then timed repetitions.

    ``timer``: "auto" (cpu-clock on a CPU; on a GPU cuda-graph when the replay estimate is under
    GRAPH_BELOW_S or saves more than LAUNCH_SHARE of the eager time, else cuda-events),
    or one of TIMERS to force it. ``l2_bytes``: the GPU's L2 size (read from torch if None).
    ``flush_bytes``: CPU only, a buffer written between repetitions (0: caches stay warm).
    ``cuda_ops``: the torch.cuda calls the GPU timer makes (``CudaOps``); tests pass a fake.
    ``agree(seconds) -> seconds`` and ``between()``: for a collective timed on every rank at once
    (see the module docstring).
    """
    if str(device).startswith("cuda"):
        if agree is not None and timer == "auto":
            timer = "cuda-events"
        return _measure_cuda(fn, str(device), budget_s, warmup_s, min_reps, max_reps, timer, l2_bytes, cuda_ops,
                             agree, between)
    if timer not in ("auto", "cpu-clock"):
        raise ValueError(f"timer {timer!r} needs a CUDA device; on a CPU only 'cpu-clock' runs.")
    return _measure_cpu(fn, budget_s, warmup_s, min_reps, max_reps, flush_bytes, agree, between)


def _measure_cpu(fn, budget_s, warmup_s, min_reps, max_reps, flush_bytes=0, agree=None, between=None) -> Timing:
    import torch

    buf = torch.empty(int(flush_bytes) // 4, dtype=torch.float32) if flush_bytes else None

    clock = time.perf_counter
    fn()  # first call: compilation, allocation, oneDNN primitive creation; never timed
    # estimate: the median of a few calls (the first ones after compilation are often slow)
    est_times, t_start = [], clock()
    while len(est_times) < 5 and (not est_times or agree is not None or clock() - t_start < warmup_s):
        t0 = clock()
        fn()
        est_times.append(clock() - t0)
    n = len(est_times)
    est = sorted(est_times)[n // 2]
    if agree is not None:
        est = agree(est)      # every rank: the same estimate, so the same call counts
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
        if between is not None:
            between()
        t0 = clock()
        fn()
        times.append(clock() - t0)
    config = {"reps": reps, "warmup_calls": 1 + n + max(0, warm), "estimate_s": est,
              "threads": torch.get_num_threads(), "budget_s": budget_s}
    if buf is not None:
        config["flush_bytes"] = int(flush_bytes)
    return Timing(tuple(times), "cpu-clock", "flushed" if buf is not None else "warm", config)


class _Flusher:
    """Between repetitions, outside the timed interval: write a buffer of at least 2 x L2 (evicts the
    timed call's working set), then read a second one of at least 2 x L2, so the L2 ends clean."""

    def __init__(self, device: str, l2_bytes: int | None, *, min_bytes: int = MIN_FLUSH_BYTES,
                 min_read_bytes: int = MIN_READ_BYTES):
        import torch

        if l2_bytes is None:
            l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        self.nbytes = max(2 * int(l2_bytes), int(min_bytes))
        self.read_nbytes = max(2 * int(l2_bytes), int(min_read_bytes))
        self.buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)
        self.rbuf = torch.zeros(self.read_nbytes // 4, dtype=torch.int32, device=device)  # only read from now on
        self.last = None

    def __call__(self):
        self.buf.zero_()               # evict: the L2 now holds the flush's dirty lines ...
        self.last = self.rbuf.max()    # ... which clean reads push out (written back here, not in the timing)


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


class CudaOps:
    """The torch.cuda calls the GPU timer makes; tests pass a fake with the same methods."""

    def __init__(self, device: str):
        import torch

        self.device = device
        self.OutOfMemoryError = torch.cuda.OutOfMemoryError

    def context(self):
        import torch

        return torch.cuda.device(self.device)

    def synchronize(self):
        import torch

        torch.cuda.synchronize()

    def flusher(self, l2_bytes):
        return _Flusher(self.device, l2_bytes)

    def times(self, call, flush, reps: int) -> list:
        return _events_times(call, flush, reps)

    def capture(self, fn):
        return _capture_graph(fn)


def _estimate(ops, call, flush) -> float:
    return sorted(ops.times(call, flush, 5))[2]


def _measure_cuda(fn, device, budget_s, warmup_s, min_reps, max_reps, timer, l2_bytes, ops=None, agree=None,
                  between=None) -> Timing:
    ops = ops or CudaOps(device)
    with ops.context():
        fn()  # compile / autotune: never timed
        ops.synchronize()
        flusher = flush = ops.flusher(l2_bytes)
        if between is not None:   # outside the timed interval: the device idle, then every rank together
            def flush_then_meet():
                flusher()
                ops.synchronize()
                between()
            flush = flush_then_meet
        eager = _estimate(ops, fn, flush)
        if agree is not None:
            eager = agree(eager)
        config = {"eager_estimate_s": eager, "flush_bytes": flusher.nbytes, "budget_s": budget_s}
        if getattr(flusher, "read_nbytes", None):
            config["flush_read_bytes"] = flusher.read_nbytes
        call, used, est = fn, "cuda-events", eager
        if timer == "cuda-graph" or (timer == "auto" and eager < GRAPH_TRY_BELOW_S):
            try:
                g = ops.capture(fn)
            except ops.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - any capture failure falls back to events
                ops.synchronize()
                config["graph_fallback"] = f"{type(e).__name__}: {str(e)[:200]}"
            else:
                graph = _estimate(ops, g.replay, flush)
                config.update(graph_estimate_s=graph, launch_overhead_s=max(0.0, eager - graph))
                if timer == "cuda-graph" or graph < GRAPH_BELOW_S or eager - graph > LAUNCH_SHARE * eager:
                    call, used, est = g.replay, "cuda-graph", graph
        config["estimate_s"] = est     # of the timer that ran
        # warm-up by time budget (the flush counts: it runs every repetition too)
        warm = rep_count(est, warmup_s, 1, max_reps)
        ops.times(call, flush, warm)
        reps = rep_count(est, budget_s, min_reps, max_reps)
        times = ops.times(call, flush, reps)
        config.update(reps=reps, warmup_calls=1 + 5 + warm + (5 if used == "cuda-graph" else 0))
        return Timing(tuple(times), used, "flushed", config)


if __name__ == "__main__":  # pragma: no cover
    import torch

    t = measure(lambda: time.sleep(1e-3), budget_s=0.05)
    print(f"sleep(1 ms): median {t.median_s * 1e3:.3f} ms over {len(t.times_s)} reps ({t.timer})")
    a = torch.randn(256, 256)
    t = measure(lambda: a @ a)
    print(f"256^3 matmul: median {t.median_s * 1e6:.1f} us, config {t.config}")
