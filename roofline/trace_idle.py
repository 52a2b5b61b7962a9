"""Why the GPU sat idle in a trace: each idle gap's cause, and kernel-launch statistics.

``idle_causes(trace)`` splits the GPU's idle time (the gaps between the union of its activity,
inside the trace's GPU window: the same ``idle_s`` ``trace_events.gpu_time`` gives) into three
causes, one per gap, tried in this order:

* **synchronisation**: a host call that blocks until the GPU is done (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy``, their ``hip``
  forms) overlaps the gap: the host drained the GPU's queue and waited, so the next launch came late
  (``.item()``, ``.cpu()``, ``.tolist()`` in a step loop).
* **host-bound**: the next GPU activity's launch call started after the GPU went idle: the GPU
  waited for the CPU to launch. The gap is charged to the CPU op running on the launching thread
  at the gap's midpoint ("no op" when the thread was between ops: Python or framework code).
* **other**: the next activity was already queued when the GPU went idle (a wait on another
  stream's event, a launch latency, a dependency): not the host.

It also returns ``timeline``: what a report draws without the trace (``reports/idle_plot.py``), in
seconds from the first GPU activity: ``window_s`` (the GPU window, from 0), ``busy`` ([start, end] of
the union of GPU activity), ``gaps`` ([start, end, cause], in time order) and ``phases`` ([start, end,
phase]: where the GPU ran the work launched inside the phase-marker annotations, consecutive ranges
of one phase joined; none when no annotation marks a phase). A huge trace stays small: past
``MAX_GAPS`` gaps only the ``MAX_GAPS`` longest are drawn (every gap longer than 1/``MAX_GAPS`` of the
window among them, so nothing a pixel could show is lost) and the busy intervals around the others
join; ``merged_gaps``, ``merged_s`` and ``merged_by_cause_s`` say what was folded into busy time, so a
figure can say it is simplified. Past ``MAX_GAPS`` phase ranges (prefill and decode steps alternating),
those shorter than 1/``MAX_GAPS`` of the window are left out and ``phases_dropped`` counts them.

``launch_stats(trace)``, as HTA reports them: per kernel launched by a runtime call (graph
replays excluded: their kernels start long after one launch), the launch-to-start delay
(p50, p90, max) and the "short" kernels whose GPU time is less than their launch call's CPU
time (launch overhead dominates them: fuse them or capture them in a graph).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

from .trace_events import US
from .trace_phases import DEFAULT_MARKERS, marked_phase

SYNC = re.compile(r"(cuda|hip|cu)(Device|Stream|Event|Ctx)Synchronize|^(cuda|hip)Memcpy(2D|3D)?$|^cuMemcpy[DH]to[DH]"
                  r"(_v2)?$|(cuda|hip)StreamWaitEvent$|^(cuda|hip)MemcpyDtoH$")
CAUSES = ("host-bound", "synchronisation", "other")
NO_OP = "no op (Python or framework code between ops)"
TOP_GAPS = 10
# Gaps drawn at most: with the busy blocks between them, 2 * MAX_GAPS + 1 segments (about two per pixel of a
# 1,000-pixel strip). A gap longer than 1/MAX_GAPS of the window is always among them: MAX_GAPS such gaps would
# already fill the window.
MAX_GAPS = 1000
NS = 9          # timeline times are rounded to the nanosecond: a trace's clock ticks in microseconds


def busy_intervals(gpu) -> list:
    """The union of (start, end) of GPU activity, merged and sorted."""
    out: list = []
    for g in sorted(gpu, key=lambda g: g.ts):
        if out and g.ts <= out[-1][1]:
            if g.end > out[-1][1]:
                out[-1][1] = g.end
        else:
            out.append([g.ts, g.end])
    return out


def idle_causes(trace, markers=None) -> dict:
    """Idle time by cause (seconds), the dominant cause, the host-bound time by CPU op, the largest gaps and the
    timeline a report draws (module docstring). ``markers``: the phase markers (``trace_phases.parse_markers``)."""
    if not trace.gpu:
        return {}
    busy = busy_intervals(trace.gpu)
    starts = [g.ts for g in trace.gpu]               # trace.gpu is sorted by start
    syncs = sorted((ln.ts, ln.end) for ln in trace.launches.values() if SYNC.search(ln.name))
    sync_starts = [s for s, _ in syncs]
    reach, m = [], float("-inf")          # reach[i]: the latest end of the first i sync calls
    for _, e in syncs:
        m = max(m, e)
        reach.append(m)
    origin = busy[0][0]
    by_cause: dict = dict.fromkeys(CAUSES, 0.0)
    counts: dict = dict.fromkeys(CAUSES, 0)
    by_op: dict = defaultdict(float)
    gaps = []
    for (_, a), (b, _) in zip(busy, busy[1:]):
        nxt = trace.gpu[bisect.bisect_left(starts, b)]
        launch = nxt.launch                           # for a replayed kernel: its graph launch
        cause, op = "other", ""
        i = bisect.bisect_left(sync_starts, b)
        if i and reach[i - 1] > a:        # a sync call started before the gap ended and returned after it began
            cause = "synchronisation"
        elif launch is not None and launch.ts > a:
            cause = "host-bound"
            running = trace.op_at(launch.thread, (a + b) / 2)
            op = running.name if running is not None else NO_OP
            by_op[op] += (b - a) * US
        by_cause[cause] += (b - a) * US
        counts[cause] += 1
        gaps.append((b - a, a, cause, op, nxt.name))
    idle = sum(by_cause.values())
    dominant = max(CAUSES, key=lambda c: by_cause[c]) if idle > 0 else ""
    line = timeline(busy, gaps, phase_spans(trace, markers or DEFAULT_MARKERS))
    gaps.sort(key=lambda x: -x[0])
    return {"idle_s": idle, "by_cause_s": by_cause, "gaps": counts, "dominant": dominant,
            "dominant_share": by_cause[dominant] / idle if idle else 0.0,
            "host_ops": [{"op": k, "time_s": v} for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:5]],
            "largest": [{"at_s": (a - origin) * US, "gap_s": d * US, "cause": c, "cpu_op": o, "next": n[:80]}
                        for d, a, c, o, n in gaps[:TOP_GAPS]], "timeline": line}


def phase_spans(trace, markers) -> list:
    """[(start, end, phase)] in trace microseconds: where the GPU ran what was launched inside each annotation that
    marks a phase (same process), in the annotations' order, consecutive ones of one phase joined."""
    launched = sorted((g.launch.ts, g.launch.thread[0], g.ts, g.end) for g in trace.gpu if g.launch is not None)
    at = [x[0] for x in launched]
    runs: list = []
    for a in sorted(trace.annotations, key=lambda a: (a.ts, -a.end)):
        phase = marked_phase(a.name, markers)
        if phase is None:
            continue
        ran = [(s, e) for _, pid, s, e in launched[bisect.bisect_left(at, a.ts):bisect.bisect_right(at, a.end)]
               if pid == a.thread[0]]
        if not ran:
            continue
        s, e = min(x[0] for x in ran), max(x[1] for x in ran)
        if runs and runs[-1][2] == phase:
            runs[-1][0], runs[-1][1] = min(runs[-1][0], s), max(runs[-1][1], e)
        else:
            runs.append([s, e, phase])
    return [tuple(r) for r in runs]


def timeline(busy: list, gaps: list, phases=()) -> dict:
    """The drawable timeline (module docstring) from the busy intervals and the gaps in time order
    ((length, start, cause, op, next), microseconds); at most MAX_GAPS gaps, the rest folded into busy time."""
    if not busy:
        return {}
    origin, end = busy[0][0], busy[-1][1]

    def s(t):
        return round((t - origin) * US, NS)

    keep = range(len(gaps))
    if len(gaps) > MAX_GAPS:                          # the longest MAX_GAPS, earlier first among equals
        keep = sorted(sorted(keep, key=lambda i: (-gaps[i][0], i))[:MAX_GAPS])
    kept = set(keep)
    merged = dict.fromkeys(CAUSES, 0.0)
    for i, g in enumerate(gaps):
        if i not in kept:
            merged[g[2]] += g[0] * US
    blocks = [[busy[0][0], busy[0][1]]]
    for i, g in enumerate(gaps):                      # gap i lies between busy[i] and busy[i + 1]
        if i in kept:
            blocks.append([busy[i + 1][0], busy[i + 1][1]])
        else:
            blocks[-1][1] = busy[i + 1][1]
    ranges = [[max(s(a), 0.0), min(s(b), s(end)), p] for a, b, p in phases if b > origin and a < end]
    shown = ranges
    if len(ranges) > MAX_GAPS:                        # steps of alternating phases: those under a pixel go
        shown = [r for r in ranges if r[1] - r[0] > s(end) / MAX_GAPS]
    return {"window_s": s(end), "busy": [[s(a), s(b)] for a, b in blocks],
            "gaps": [[s(gaps[i][1]), s(gaps[i][1] + gaps[i][0]), gaps[i][2]] for i in keep], "phases": shown,
            "merged_gaps": len(gaps) - len(kept), "merged_s": sum(merged.values()), "merged_by_cause_s": merged,
            "phases_dropped": len(ranges) - len(shown)}


def _pct(xs: list, q: float) -> float:
    """The q-quantile of sorted ``xs`` (nearest rank below, no interpolation: an observed delay)."""
    return xs[min(int(q * (len(xs) - 1) + 0.5), len(xs) - 1)]


def launch_stats(trace) -> dict:
    """Launch-to-start delays (seconds) and the kernels shorter than their launch call."""
    delays, short, short_s, n = [], 0, 0.0, 0
    for g in trace.gpu:
        ln = g.launch
        if g.kind != "kernel" or ln is None or g.graph is not None:
            continue
        n += 1
        delays.append((g.ts - ln.ts) * US)
        if g.dur < ln.dur:
            short += 1
            short_s += g.dur * US
    if not n:
        return {"kernels": 0}
    delays.sort()
    return {"kernels": n, "delay_p50_s": _pct(delays, 0.5), "delay_p90_s": _pct(delays, 0.9),
            "delay_max_s": delays[-1], "short_kernels": short, "short_s": short_s, "short_share": short / n}


def idle_sentence(idle: dict, window_s: float) -> str:
    """'GPU idle 177 us of a 400 us window (44%): mostly host-bound (56%: the GPU waited for launches; ...)'."""
    from . import units as U

    if not idle or not idle.get("idle_s"):
        return ""
    c = idle["by_cause_s"]
    d = idle["dominant"]
    why = {"host-bound": "the GPU waited for launches from the host",
           "synchronisation": "the host waited in syncs or copies, then launched late",
           "other": "work was queued but waited (other streams, events, launch latency)"}[d]
    head = f"GPU idle {U.seconds(idle['idle_s'])}"
    if window_s:
        head += f" of a {U.seconds(window_s)} window ({U.percent(idle['idle_s'] / window_s)})"
    text = (f"{head}: mostly {d} ({U.percent(idle['dominant_share'])}: {why}); "
            + ", ".join(f"{k} {U.seconds(c[k])}" for k in CAUSES))
    if d == "host-bound" and idle.get("host_ops"):
        text += f"; the CPU was in {idle['host_ops'][0]['op']}"
    return text
