"""Why the GPU sat idle in a trace: each idle gap's cause, and kernel-launch statistics.

``idle_causes(trace)`` splits the GPU's idle time (the gaps between the union of its activity,
inside the trace's GPU window: the same ``idle_s`` ``events.gpu_time`` gives) into three
causes, one per gap, tried in this order:

* **synchronisation**: a host call that blocks until the GPU is done (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy``, their ``hip``
  forms) overlaps the gap and the next activity was launched after the gap began: the host drained the
  GPU's queue and waited, so the next launch came late (``.item()``, ``.cpu()``, ``.tolist()`` in a step
  loop). A bubble between kernels already queued while the host sat in a sync is not the sync's: "other".
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

Past ``ZOOM_ABOVE`` gaps the timeline also holds ``zoom``: a few consecutive steps drawn exactly (nothing folded),
so single kernels and gaps stay visible beside a strip of a thousand gaps. The window is ``ZOOM_STEPS`` steps (one
phase-marker annotation each, on the GPU) centred on the median step by GPU span of the phase with the most steps;
with no marked steps, the ``ZOOM_GAPS`` gaps around the middle one. ``zoom`` holds ``pick`` (how it was chosen),
``start_s``/``end_s``, ``steps`` ([start, end, phase, number of that step within its phase, from 1]), ``busy``
(the exact union of GPU activity in the window), ``kernels`` ([start, end] of each GPU activity, clipped to the
window; at most ``ZOOM_MAX_KERNELS``, the window ends at the last one kept and ``kernels_cut`` counts the others),
``gaps`` ([start, end, cause]) and ``largest`` (the window's longest gap: ``at_s``, ``gap_s``, ``cause``,
``cpu_op``: the op on the thread that launched the next work, at the gap's midpoint, whatever the cause, and
``next``), all in the timeline's seconds.

``launch_stats(trace)``, as HTA reports them: per kernel launched by a runtime call (graph
replays excluded: their kernels start long after one launch), the launch-to-start delay
(p50, p90, max) and the "short" kernels whose GPU time is less than their launch call's CPU
time (launch overhead dominates them: fuse them or capture them in a graph).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

from .. import units as U
from .events import US
from .phases import DEFAULT_MARKERS, marked_phase

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
# The zoom (module docstring): only when the strip has more gaps than a reader can tell apart at a glance.
ZOOM_ABOVE = 50
ZOOM_STEPS = 3          # consecutive steps: the median step and one either side (a step's hand-over shows twice)
ZOOM_GAPS = 20          # with no marked steps: this many gaps around the middle one
ZOOM_MAX_KERNELS = 2000  # a few steps of a large model (32 layers x ~15 kernels x 3) fit; the header stays small


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
    timeline a report draws (module docstring). ``markers``: the phase markers (``phases.parse_markers``)."""
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
        late = launch is None or launch.ts > a        # the next work was not queued when the GPU went idle
        if late and i and reach[i - 1] > a:   # a sync call started before the gap ended and returned after it began
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
    steps = step_spans(trace, markers or DEFAULT_MARKERS)
    line = timeline(busy, gaps, join_steps(steps))
    if line and len(gaps) > ZOOM_ABOVE:
        line["zoom"] = zoom_window(trace, busy, gaps, steps)
    gaps.sort(key=lambda x: -x[0])
    return {"idle_s": idle, "by_cause_s": by_cause, "gaps": counts, "dominant": dominant,
            "dominant_share": by_cause[dominant] / idle if idle else 0.0,
            "host_ops": [{"op": k, "time_s": v} for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:5]],
            "largest": [{"at_s": (a - origin) * US, "gap_s": d * US, "cause": c, "cpu_op": o, "next": n[:80]}
                        for d, a, c, o, n in gaps[:TOP_GAPS]], "timeline": line}


def step_spans(trace, markers) -> list:
    """[(start, end, phase)] in trace microseconds, one per annotation that marks a phase (same process), in the
    annotations' order: where the GPU ran what was launched inside it. Annotations that launched nothing are left
    out."""
    launched = sorted((g.launch.ts, g.launch.thread[0], g.ts, g.end) for g in trace.gpu if g.launch is not None)
    at = [x[0] for x in launched]
    out: list = []
    for a in sorted(trace.annotations, key=lambda a: (a.ts, -a.end)):
        phase = marked_phase(a.name, markers)
        if phase is None:
            continue
        ran = [(s, e) for _, pid, s, e in launched[bisect.bisect_left(at, a.ts):bisect.bisect_right(at, a.end)]
               if pid == a.thread[0]]
        if ran:
            out.append((min(x[0] for x in ran), max(x[1] for x in ran), phase))
    return out


def join_steps(steps) -> list:
    """Consecutive steps of one phase joined into one range: [(start, end, phase)]."""
    runs: list = []
    for s, e, phase in steps:
        if runs and runs[-1][2] == phase:
            runs[-1][0], runs[-1][1] = min(runs[-1][0], s), max(runs[-1][1], e)
        else:
            runs.append([s, e, phase])
    return [tuple(r) for r in runs]


def phase_spans(trace, markers) -> list:
    """[(start, end, phase)] in trace microseconds: where the GPU ran what was launched inside each annotation that
    marks a phase (same process), in the annotations' order, consecutive ones of one phase joined."""
    return join_steps(step_spans(trace, markers))


def median_step(steps) -> int:
    """The index in ``steps`` of the median step by GPU span of the phase with the most steps (the lower middle
    of an even count; the earlier of equal spans)."""
    counts: dict = defaultdict(int)
    for *_, p in steps:
        counts[p] += 1
    phase = max(counts, key=lambda p: (counts[p], -next(i for i, x in enumerate(steps) if x[2] == p)))
    mine = sorted((steps[i][1] - steps[i][0], i) for i in range(len(steps)) if steps[i][2] == phase)
    return mine[(len(mine) - 1) // 2][1]


def zoom_window(trace, busy: list, gaps: list, steps: list) -> dict:
    """The zoom (module docstring) from the busy intervals, the gaps in time order ((length, start, cause, op,
    next), microseconds) and the unjoined steps."""
    origin = busy[0][0]

    def s(t):
        return round((t - origin) * US, NS)

    if steps:
        mid = median_step(steps)
        first = min(max(mid - ZOOM_STEPS // 2, 0), max(len(steps) - ZOOM_STEPS, 0))
        shown = list(range(first, min(first + ZOOM_STEPS, len(steps))))
        lo, hi = min(steps[i][0] for i in shown), max(steps[i][1] for i in shown)
        pick = "median step"
    else:
        mid = len(gaps) // 2
        a, b = max(mid - ZOOM_GAPS // 2, 0), min(mid + ZOOM_GAPS - ZOOM_GAPS // 2, len(gaps))
        lo, hi, shown = busy[a][0], busy[b][1], []                 # gap i lies between busy[i] and busy[i + 1]
        pick = "middle gaps"
    starts = [g.ts for g in trace.gpu]
    i = bisect.bisect_left(starts, lo - max((g.dur for g in trace.gpu), default=0.0))
    acts = [g for g in trace.gpu[i:bisect.bisect_right(starts, hi)] if g.end > lo and g.ts < hi]
    cut = max(len(acts) - ZOOM_MAX_KERNELS, 0)
    if cut:
        acts = acts[:ZOOM_MAX_KERNELS]
        hi = max(g.end for g in acts)
    kernels = [[s(max(g.ts, lo)), s(min(g.end, hi))] for g in acts]
    inside = [b for b in busy if b[1] > lo and b[0] < hi]
    in_gaps = [g for g in gaps if g[1] >= lo and g[1] + g[0] <= hi]
    big = max(in_gaps, key=lambda g: g[0], default=None)
    op = big[3] if big else ""
    if big and not op:          # a sync or queued gap: still say where the launching thread was
        nxt = trace.gpu[bisect.bisect_left(starts, big[1] + big[0])]
        if nxt.launch is not None:
            running = trace.op_at(nxt.launch.thread, big[1] + big[0] / 2)
            op = running.name if running is not None else NO_OP
    number: dict = defaultdict(int)
    numbered = []
    for k, (a, b, p) in enumerate(steps):
        number[p] += 1
        if k in shown:
            numbered.append([s(a), s(b), p, number[p]])
    return {"pick": pick, "start_s": s(lo), "end_s": s(hi), "steps": numbered,
            "busy": [[s(max(a, lo)), s(min(b, hi))] for a, b in inside],
            "kernels": kernels, "kernels_cut": cut,
            "gaps": [[s(g[1]), s(g[1] + g[0]), g[2]] for g in in_gaps],
            "largest": {"at_s": s(big[1]), "gap_s": round(big[0] * US, NS), "cause": big[2], "cpu_op": op,
                        "next": big[4][:80]} if big else None}


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


def cpu_where(op: str) -> str:
    """'CPU in vllm::prepare_inputs', or 'CPU between ops (Python or framework code)' for NO_OP."""
    return "CPU between ops (Python or framework code)" if op == NO_OP else f"CPU in {op}"


def idle_sentence(idle: dict, window_s: float) -> str:
    """'GPU idle 177 us of a 400 us window (44%): mostly host-bound (56%: the GPU waited for launches; ...)'."""
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
        op = idle["host_ops"][0]["op"]
        text += "; the CPU was " + ("between ops (Python or framework code)" if op == NO_OP else f"in {op}")
    return text
