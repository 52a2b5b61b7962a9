"""Reading a PyTorch profiler (Kineto) trace: its events, the op tree, kernel-to-op joins, GPU busy time.

Pure (the standard library only): ``roofline trace`` and the tests read traces with no torch.

The format is the Chrome trace event format as torch.profiler writes it (libkineto
``output_json.cpp``; ``../shared/REFERENCE.md``): a JSON object (``.json`` or ``.json.gz``)
with ``schemaVersion``, ``deviceProperties`` (``name``, ``totalGlobalMem``, ``numSms``, ...),
``distributedInfo`` (``rank``, ``world_size``), ``record_shapes``, and ``traceEvents``:
complete events (``ph: "X"``, ``ts`` and ``dur`` in microseconds) whose ``cat`` says what they
are:

    cpu_op               an aten or custom op; args: External id, Input Dims, Input type, Concrete Inputs
    user_annotation      record_function("...") ranges (phase markers)
    python_function      Python frames (with_stack); "nn.Module: Name_0" for module calls
    cuda_runtime / cuda_driver   cudaLaunchKernel, cudaGraphLaunch, hipLaunchKernel ...; args: correlation
    kernel / gpu_memcpy / gpu_memset   GPU activity: pid = device, tid = stream; args: correlation,
                         External id, stream, bytes (copies), collective metadata (NCCL kernels)

Joins (``Trace.join``): each GPU activity goes to the innermost ``cpu_op`` that launched it.
Newer traces give the activity its launching op's ``External id``; older ones (torch 1.x/2.0)
give it only its own correlation (its External id equals its correlation): the runtime call
with that correlation is found, then the innermost ``cpu_op`` on the calling thread whose
interval contains the call. An External id is trusted when it names a ``cpu_op`` on the
launching thread that contains the runtime call (or when no runtime call was recorded);
otherwise the correlation route decides. An activity that joins nothing is unattributed;
one launched by ``cudaGraphLaunch`` / ``hipGraphLaunch`` is a graph replay (``Gpu.graph``).

GPU time (``gpu_time``): the sum of kernel durations, the busy time (the union of all GPU
activity intervals: kernels on two streams that overlap count once), the idle time inside
the trace's GPU window, and memcpy / memset time. A trace with no GPU activity is a CPU trace:
each op's own duration is its time (``work_items``: an op's self time, its duration less its
children's, is charged to it, so nested ops never count twice).
"""

from __future__ import annotations

import bisect
import gc
import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RooflineError
from ..safejson import TRACE_FILE, BadJSON, finite, key, loads, text, whole
from .stream import stream_events

US = 1e-6  # trace timestamps and durations are microseconds

_CATS = {"cpu_op": "op", "operator": "op", "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
         "gpu_memset": "memset", "memset": "memset", "cuda_runtime": "runtime", "runtime": "runtime",
         "cuda_driver": "runtime", "privateuse1_runtime": "runtime", "privateuse1_driver": "runtime",
         "user_annotation": "annotation", "gpu_user_annotation": "gpu_annotation",
         "python_function": "python"}
GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch")
TRACE_SUFFIXES = (".json", ".json.gz")


class Op:
    """One ``cpu_op``: name, interval (µs), thread, External id, args, and its parent op."""

    __slots__ = ("name", "ts", "end", "thread", "ext", "args", "parent", "children_us", "index")

    def __init__(self, name, ts, end, thread, ext, args, index):
        self.name, self.ts, self.end, self.thread, self.ext, self.args = name, ts, end, thread, ext, args
        self.parent, self.children_us, self.index = None, 0.0, index

    @property
    def dur(self) -> float:
        return self.end - self.ts

    def chain(self):
        """This op, then its ancestors outward."""
        op = self
        while op is not None:
            yield op
            op = op.parent

    def __repr__(self):  # pragma: no cover - debugging aid
        return f"Op({self.name!r}, ts={self.ts}, dur={self.dur})"


class Launch:
    """A runtime call (cudaLaunchKernel, cudaGraphLaunch, ...) with its correlation, and the kernel it names
    (``args.kernel``: ROCm writes it on hipLaunchKernel / hipExtModuleLaunchKernel; "" when absent)."""

    __slots__ = ("name", "ts", "end", "thread", "corr", "ext", "kernel")

    def __init__(self, name, ts, end, thread, corr, ext, kernel=""):
        self.name, self.ts, self.end, self.thread, self.corr, self.ext = name, ts, end, thread, corr, ext
        self.kernel = kernel

    @property
    def dur(self) -> float:
        return self.end - self.ts


class Gpu:
    """One GPU activity (kernel, memcpy, memset) and what it joined: ``op``, ``launch``, ``graph``."""

    __slots__ = ("kind", "name", "ts", "end", "dur", "device", "stream", "corr", "ext", "args", "op", "launch",
                 "graph", "early")

    def __init__(self, kind, name, ts, end, device, stream, corr, ext, args, dur=None):
        self.kind, self.name, self.ts, self.end, self.device, self.stream = kind, name, ts, end, device, stream
        # the file's own duration: end - ts of absolute timestamps (~5e12 us, one float step ~0.001 us) drifts
        # when summed over 10^5 kernels (0.2 us in 45 ms); sums use this, as TraceLens and HTA do
        self.dur = end - ts if dur is None else dur
        self.corr, self.ext, self.args = corr, ext, args
        self.op, self.launch, self.graph, self.early = None, None, None, False


@dataclass
class Span:
    """An annotation range: record_function (``user_annotation``), a module call (``python_function``)."""

    name: str
    ts: float
    end: float
    thread: tuple
    cat: str


@dataclass
class Trace:
    """One trace file read and indexed (``read_trace``), joined by ``join``."""

    path: Path
    rank: int = 0
    world_size: int = 1
    devices: list = field(default_factory=list)       # deviceProperties entries
    record_shapes: bool | None = None
    ops: list = field(default_factory=list)           # Op, by thread then start
    launches: dict = field(default_factory=dict)      # correlation -> Launch
    gpu: list = field(default_factory=list)           # Gpu, by start
    annotations: list = field(default_factory=list)   # Span (user_annotation)
    gpu_annotations: list = field(default_factory=list)
    modules: list = field(default_factory=list)       # Span (python_function "nn.Module: ...")
    notices: list = field(default_factory=list)
    _by_thread: dict = field(default_factory=dict, repr=False)   # thread -> (starts, ops)
    _events: int = field(default=0, repr=False)                  # events read (kept or not)

    @property
    def is_gpu(self) -> bool:
        return bool(self.gpu)

    @property
    def has_shapes(self) -> bool:
        """Whether ops carry input shapes (recorded with record_shapes=True)."""
        if self.record_shapes is not None:
            return bool(self.record_shapes)
        return any("Input Dims" in (op.args or {}) for op in self.ops[:2000])

    # ---- the op tree
    def _index(self) -> None:
        by: dict = {}
        for op in self.ops:
            by.setdefault(op.thread, []).append(op)
        for thread, ops in by.items():
            ops.sort(key=lambda o: (o.ts, -o.end, o.index))
            stack: list = []
            for op in ops:   # sorted by start: the top of the stack started first; pop what ends before op
                while stack and op.end > stack[-1].end + 1e-3:
                    stack.pop()
                if stack:
                    op.parent = stack[-1]
                    stack[-1].children_us += op.end - op.ts
                stack.append(op)
            self._by_thread[thread] = ([o.ts for o in ops], ops)

    def op_at(self, thread, t: float):
        """The innermost op on ``thread`` whose interval contains time ``t`` (µs), or None."""
        entry = self._by_thread.get(thread)
        if entry is None:
            return None
        starts, ops = entry
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return None
        op = ops[i]
        while op is not None and op.end < t:
            op = op.parent
        return op

    # ---- kernels to ops
    def join(self) -> None:
        """Set each GPU activity's launching ``op`` (innermost cpu_op), ``launch`` and ``graph``."""
        by_ext: dict = {}
        for op in self.ops:
            if op.ext is not None:
                by_ext.setdefault(op.ext, op)
        for g in self.gpu:
            launch = self.launches.get(g.corr) if g.corr is not None else None
            g.launch = launch
            if launch is not None and launch.name.startswith(GRAPH_LAUNCHES):
                g.graph = launch.corr      # a replayed graph: the op around the launch did not run it
                continue
            op = by_ext.get(g.ext) if g.ext is not None else None
            if op is not None and launch is not None and not (
                    op.thread == launch.thread and op.ts <= launch.ts <= op.end):
                op = None                  # an External id that is the correlation (older traces)
            if op is None and launch is not None:
                op = self.op_at(launch.thread, launch.ts)
            g.op = op
        self._mark_early()

    def _mark_early(self) -> None:
        """Mark activity launched before the profiler window (``Gpu.early``): on each stream, the activities
        with no runtime call in the trace that ran before the first one whose launch the trace recorded (a
        stream runs in launch order, so these were queued before the profiler started)."""
        if not self.launches:
            return
        first: dict = {}
        for g in self.gpu:
            if g.launch is not None:
                first.setdefault((g.device, g.stream), g.ts)
        for g in self.gpu:
            if g.launch is None and g.op is None and g.ts < first.get((g.device, g.stream), float("inf")):
                g.early = True


ARG_LISTS = ("Input Dims", "Input type", "Concrete Inputs", "Input Strides")   # lists when present, else dropped


def _args(e: dict):
    """An event's ``args``, validated where read: join keys are str or whole numbers (else dropped), the per-input
    lists are lists (else dropped); returns (args, how many fields were dropped)."""
    args = e.get("args")
    if not isinstance(args, dict):
        return {}, 0
    dropped = 0
    for k in ("External id", "correlation", "stream"):
        if k in args and args[k] is not None and key(args[k]) is None:
            args = {**args}
            del args[k]
            dropped += 1
    for k in ARG_LISTS:
        if k in args and not isinstance(args[k], list):
            args = {**args}
            del args[k]
            dropped += 1
    return args, dropped


COMM_KEYS = ("Collective name", "Group size", "dtype", "In msg nelems", "Out msg nelems", "Process Group Name", "Seq")
LAUNCH_KEYS = ("kernel_num_gb", "kernel_flop", "flops", "flops8", "flops16", "bytes")   # a Triton launch's metadata
OP_KEYS = ("Input Dims", "Input type", "Concrete Inputs") + COMM_KEYS + LAUNCH_KEYS   # what the cost rules, comms,
NO_ARGS: dict = {}                                                       # phases and analyze read; never mutated


def _kept(args: dict, keys, seen: dict) -> dict:
    """The ``keys`` of ``args`` only, as one dict shared by every event whose kept fields are equal (``seen``):
    a trace repeats its shapes step after step, so a million ops hold a few hundred small dicts, not a million
    dicts of a dozen fields (Record function id, Sequence number, Input Strides, grid, registers, ...)."""
    kv = [(k, args[k]) for k in keys if k in args]
    if not kv:
        return NO_ARGS
    try:
        sig = repr(kv)       # C-fast, and 1, 1.0, True and "1" stay apart; lists nested past the limit: unshared
    except RecursionError:
        return dict(kv)
    d = seen.get(sig)
    if d is None:
        d = seen[sig] = dict(kv)
    return d


def _load_json(p: Path):
    try:
        raw = p.read_bytes()
    except IsADirectoryError:
        raise RooflineError(f"{p} is a folder: give a trace file, or the folder of per-rank traces "
                            "itself.") from None
    except OSError as e:
        raise RooflineError(f"cannot read trace {p}: {e.strerror or e}.") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error):
            raise RooflineError(f"trace {p} is a gzip file that is cut off or corrupt (decompression failed): "
                                "copy it again, or export the trace again.") from None
    elif p.name.endswith(".gz"):
        raise RooflineError(f"trace {p} is named .gz but is not a gzip file.")
    if not raw.strip():
        raise RooflineError(f"trace {p} is empty: it holds no JSON.")
    try:
        return loads(raw, limits=TRACE_FILE)
    except BadJSON as e:
        raise RooflineError(f"trace {p} {str(e).removeprefix('the trace ')}") from None


def read_trace(path) -> Trace:
    """Parse one trace file into a ``Trace`` (indexed and joined); RooflineError for bad input.

    The cyclic garbage collector is paused while it runs: a 100 MB trace is millions of new
    dicts and lists, none of them cyclic garbage, and the collector would otherwise re-scan the
    growing heap over and over (3-4x the parse time).
    """
    p = Path(path)
    if not p.exists():
        raise RooflineError(f"trace {p} does not exist.")
    paused = gc.isenabled()
    gc.disable()
    try:
        return _read(p)
    finally:
        if paused:
            gc.enable()


STREAM_BYTES = 256 << 20     # larger files stream their events (roofline.traces.stream) instead of one json.loads


def _read(p: Path, stream: bool | None = None) -> Trace:
    if stream is None:
        stream = p.stat().st_size >= STREAM_BYTES
    if not stream:
        d = _load_json(p)
        if isinstance(d, list):
            d = {"traceEvents": d}
        if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
            raise RooflineError(f"trace {p} has no 'traceEvents' list: it is not a PyTorch profiler (Chrome) trace.")
        t = _header(p, d)
        return _fill(t, p, d["traceEvents"])
    head: dict = {}
    t = Trace(p)
    try:
        _fill(t, p, stream_events(p, head), finish=False)
    except BadJSON as e:
        raise RooflineError(f"trace {p} {str(e).removeprefix('the trace ')}") from None
    if not head.get("traceEvents"):
        raise RooflineError(f"trace {p} has no 'traceEvents' list: it is not a PyTorch profiler (Chrome) trace.")
    h = _header(p, head)
    t.rank, t.world_size, t.devices, t.record_shapes = h.rank, h.world_size, h.devices, h.record_shapes
    return _finish(t, p, t._events)


def _header(p: Path, d: dict) -> Trace:
    """A Trace with the file's rank, world size, devices and record_shapes, validated."""
    dist = d.get("distributedInfo") if isinstance(d.get("distributedInfo"), dict) else {}
    rank, world = dist.get("rank", 0), dist.get("world_size", 1)
    if whole(rank, 0) is None:
        raise RooflineError(f"trace {p}: distributedInfo.rank must be a whole number of at least 0, not {rank!r}.")
    if whole(world, 1) is None:
        raise RooflineError(f"trace {p}: distributedInfo.world_size must be a whole number of at least 1, not "
                            f"{world!r}.")
    devices = d.get("deviceProperties") or []
    if not isinstance(devices, list):
        raise RooflineError(f"trace {p}: deviceProperties must be a list of device objects, not "
                            f"{type(devices).__name__} {str(devices)[:40]}.")
    t = Trace(p, rank=whole(rank), world_size=whole(world), devices=[x for x in devices if isinstance(x, dict)])
    rs = d.get("record_shapes")
    t.record_shapes = None if rs is None else bool(rs)
    return t


def _fill(t: Trace, p: Path, events, finish: bool = True) -> Trace:
    """Read ``events`` (a list, or a stream) into ``t``; index and join it unless ``finish`` is False."""
    ops, gpu, launches = t.ops, t.gpu, t.launches
    skipped: dict = {}          # why -> events skipped
    fields = 0                  # bad fields dropped from kept events
    seen: dict = {}             # kept args by value: equal ones share one dict (_kept)

    def skip(why):
        skipped[why] = skipped.get(why, 0) + 1

    n_events = 0
    for e in events:
        n_events += 1
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        kind = _CATS.get(str(e.get("cat", "")).lower())
        if kind is None:
            continue
        ts, dur = finite(e.get("ts")), finite(e.get("dur", 0))
        if ts is None:
            skip("no finite ts")
            continue
        if dur is None or dur < 0:
            skip("a negative or non-finite dur" if "dur" in e else "no dur")
            continue
        if finite(ts + dur) is None:
            skip("a negative or non-finite dur")
            continue
        pid, tid = e.get("pid"), e.get("tid")
        if (pid is not None and key(pid) is None) or (tid is not None and key(tid) is None):
            skip("a pid or tid that is not a string or whole number")
            continue
        args, n_bad = _args(e)
        fields += n_bad
        name = str(e.get("name", ""))
        thread = (pid, tid)
        if kind == "op":
            ops.append(Op(name, ts, ts + dur, thread, args.get("External id"), _kept(args, OP_KEYS, seen), len(ops)))
        elif kind in ("kernel", "memcpy", "memset"):
            stream = args.get("stream", tid)
            gpu.append(Gpu(kind, name, ts, ts + dur, pid, stream, args.get("correlation"), args.get("External id"),
                           _kept(args, COMM_KEYS, seen) if "Collective name" in args else NO_ARGS, dur))
        elif kind == "runtime":
            corr = args.get("correlation")
            if corr is not None:
                launches[corr] = Launch(name, ts, ts + dur, thread, corr, args.get("External id"),
                                        text(args.get("kernel"), ""))
        elif kind == "annotation":
            t.annotations.append(Span(name, ts, ts + dur, thread, "user_annotation"))
        elif kind == "gpu_annotation":
            t.gpu_annotations.append(Span(name, ts, ts + dur, thread, "gpu_user_annotation"))
        elif kind == "python" and name.startswith("nn.Module:"):
            t.modules.append(Span(name, ts, ts + dur, thread, "python_function"))
    if skipped:
        n = sum(skipped.values())
        why = "; ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        t.notices.append(f"{n} event(s) of {p.name} were skipped, their time not counted ({why}).")
    if fields:
        t.notices.append(f"{fields} malformed field(s) of {p.name} (External id, correlation, stream not a string "
                         "or whole number; Input Dims, Input type or Concrete Inputs not a list) were ignored.")
    t._events = n_events
    return _finish(t, p, n_events) if finish else t


def _finish(t: Trace, p: Path, n_events: int) -> Trace:
    ops, gpu = t.ops, t.gpu
    if not ops and not gpu:
        raise RooflineError(f"trace {p} holds no ops and no GPU activity ({n_events} events): "
                            "was the profiler stopped before the work ran, or are these steps outside its "
                            "schedule? Record with roofline.capture or torch.profiler around the work.")
    gpu.sort(key=lambda g: (g.ts, g.end))
    t._index()
    t.join()
    return t


def trace_files(path) -> list[Path]:
    """A trace file, or the trace files of a folder, sorted: *.pt.trace.json[.gz] (what
    torch.profiler.tensorboard_trace_handler, vLLM and SGLang write) when there are any, else every
    *.json and *.json.gz."""
    p = Path(path)
    if not p.exists():
        raise RooflineError(f"trace {p} does not exist.")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    named = [f for f in files if ".pt.trace.json" in f.name]   # the TensorBoard handler's (and vLLM's) names
    files = named or files
    if not files:
        raise RooflineError(f"folder {p} holds no trace files (*.json or *.json.gz).")
    return files


def read_traces(path) -> list[Trace]:
    """Every trace of a file or folder, by rank (``distributedInfo.rank``; file order when absent)."""
    files = trace_files(path)
    traces = [read_trace(f) for f in files]
    if len(traces) > 1 and len({t.rank for t in traces}) < len(traces):
        for i, t in enumerate(traces):   # no distributedInfo: ranks in file-name order
            t.notices.append(f"{t.path.name} names no distinct rank (distributedInfo); taken as rank {i} by "
                             "file name.")
            t.rank = i
    return sorted(traces, key=lambda t: t.rank)


# ---------------------------------------------------------------- time

def union_us(intervals) -> float:
    """Length of the union of (start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def gpu_time(t: Trace) -> dict:
    """GPU time in seconds: kernel sum, busy (union of all GPU activity), idle in the window, copies."""
    kernels = [g for g in t.gpu if g.kind == "kernel"]
    if not t.gpu:
        roots = [(op.ts, op.end) for op in t.ops if op.parent is None]
        busy = union_us(roots)
        window = (max(e for _, e in roots) - min(s for s, _ in roots)) if roots else 0.0
        return {"kind": "cpu", "busy_s": busy * US, "op_sum_s": sum(e - s for s, e in roots) * US,
                "window_s": window * US, "idle_s": max(window - busy, 0.0) * US, "kernels": 0}
    busy = union_us((g.ts, g.end) for g in t.gpu)
    start, end = min(g.ts for g in t.gpu), max(g.end for g in t.gpu)
    graph = [g for g in kernels if g.graph is not None]
    return {"kind": "gpu", "kernel_sum_s": sum(g.dur for g in kernels) * US,
            "kernel_busy_s": union_us((g.ts, g.end) for g in kernels) * US, "busy_s": busy * US,
            "window_s": (end - start) * US, "idle_s": max(end - start - busy, 0.0) * US,
            "memcpy_s": sum(g.dur for g in t.gpu if g.kind == "memcpy") * US,
            "memset_s": sum(g.dur for g in t.gpu if g.kind == "memset") * US,
            "kernels": len(kernels), "graph_kernels": len(graph),
            "graph_launches": len({g.graph for g in graph}),
            "unattributed_s": sum(g.dur for g in t.gpu if g.op is None and g.graph is None and not g.early) * US,
            "before_window": sum(1 for g in t.gpu if g.early),
            "before_window_s": sum(g.dur for g in t.gpu if g.early) * US,
            "streams": len({(g.device, g.stream) for g in t.gpu}), "devices": len({g.device for g in t.gpu})}


def work_items(t: Trace):
    """(op or None, seconds, gpu activity or None) for every piece of time in the trace.

    GPU trace: one item per GPU activity, charged to its launching op (None: unattributed
    or a graph replay). CPU trace: one item per op, its self time (duration less its
    children's), so the items add up to the union of the top-level ops on each thread.
    """
    if t.gpu:
        for g in t.gpu:
            yield g.op, g.dur * US, g
        return
    for op in t.ops:
        own = op.end - op.ts - op.children_us
        if own > 0:
            yield op, own * US, None
