"""A profiler trace as result records: op instances costed, grouped by phase and shape, GPU time.

``analyze_trace(trace, ...)`` (pure; ``roofline trace`` and the tests call it) turns one
joined ``roofline.traces.events.Trace`` into ``TraceResult``: ``Measurement``s of the same
format ``roofline profile`` writes (timer "trace", or "trace-cpu" for a CPU trace), so
``roofline.analysis`` judges them against the same roofs, and a summary of where the time
went.

Instances. Each piece of time (a GPU activity, or a CPU op's self time on a CPU trace) is
charged to the *outermost costed op* around the op that launched it: ``aten::linear`` ->
``aten::addmm`` gives one ``addmm`` instance; a split-K GEMM's two kernels are one instance
whose time is their sum; SDPA's kernels (and the copies inside it) are one attention
instance. Wrappers (``linear``, ``matmul``, ``clone``, ``_to_copy``, ``c10d::`` ...) are
costed from their own shapes only when they launched a kernel with nothing costed below
them. An op that moves no data (a view, an allocation) is "framework": zero cost, its time
is overhead (on a GPU trace it launches nothing, so it has no time). Anything else is
*uncosted*, named by its outermost op the table does not know (or, for a kernel with no op,
"unattributed <category>"), with its time counted and flagged, never a cost.

Measurements. Instances of the same phase, op and signature (shapes and dtypes) are one
measurement: its samples are the instance times, its ``count`` is instances per step
(instances / the phase's steps), so ``analysis`` gives each phase a step time that is the
traced time of one average step. Every point of a phase shares its ``StepKey`` (backend
"trace", the run dtype), so each phase is one step with one verdict; the op's own dtype
sets its peak (``compute_dtype``).
"""

from __future__ import annotations

import gc
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .. import units as U
from .. import workload as W
from ..bounds import analyze_phase
from ..cost import ZERO, Cost
from ..errors import RooflineError
from ..records import Measurement, WorkloadPoint
from .cost import FRAMEWORK, OpCost, cost_kernel, cost_op, is_wrapper
from .opcost import ReplayKernels
from .engine_steps import find_steps
from .registry import kernel_rule_for
from .events import US, gpu_time, work_items
from .experts import expert_loads
from .graphs import ReplayMap, graph_launches, kernel_category
from .idle import idle_causes, launch_stats
from .phases import FORWARD, PLAN_PHASES, plan_phases

UNCOSTED, COMMUNICATION = "uncosted", "communication"
NOT_MODELLED = ("cast", "copy", "fill", "framework")   # work the cost model's step does not have
_UNSET = object()
NO_DETAIL: dict = {}


class Instance:
    """One op instance: its cost (None: uncosted), time, launch point and kernels."""

    __slots__ = ("name", "signature", "category", "cost", "dtype", "compute_dtype", "note", "detail", "t", "thread",
                 "graph", "seconds", "kernels", "off", "rule")

    def __init__(self, name, oc: OpCost | None, category, t, thread, graph=None, off=""):
        self.name, self.category, self.t, self.thread, self.graph, self.off = name, category, t, thread, graph, off
        self.signature = oc.signature if oc else ""
        self.cost = oc.cost if oc else None
        self.dtype = oc.dtype if oc else ""
        self.compute_dtype = oc.compute_dtype if oc else "fp32"
        self.note = oc.note if oc else ""
        self.detail = oc.detail if oc else NO_DETAIL     # shared with the memoised cost: read, never written
        self.rule = oc.rule if oc else ""
        self.seconds, self.kernels = 0.0, {}


@dataclass
class TraceResult:
    measurements: list                    # Measurement, file order: prefill first
    summary: dict                         # gpu time, shares, top ops, phases: JSON-ready
    dtype: str                            # the run dtype (dominant GEMM input dtype)
    notes: list = field(default_factory=list)
    instances: list = field(default_factory=list)


def run_dtype(trace) -> str:
    """The activation dtype most GEMM inputs use (fp32 when the trace has no GEMM)."""
    c, seen = Counter(), {}
    for op in trace.ops:
        if op.name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"):
            k = (op.name, id(op.args))     # ops with equal kept args share one args dict (events._kept)
            d = seen.get(k, _UNSET)
            if d is _UNSET:
                oc = cost_op(op.name, op.args)
                d = seen[k] = oc.dtype if isinstance(oc, OpCost) else None
            if d in ("fp32", "bf16", "fp16", "fp8"):
                c[d] += 1
    return c.most_common(1)[0][0] if c else ("bf16" if trace.is_gpu else "fp32")


class _Coster:
    """Per-op costs and the outermost-costed-op rule, cached across a trace and its capture traces."""

    def __init__(self, dtype: str, gpu: bool, launched: set):
        self.dtype, self.gpu, self.launched = dtype, gpu, launched
        self.memo: dict = {}
        self.below: set = set()        # ids of ops with a costed (non-wrapper) op below them

    def cost(self, op):
        # a trace repeats its shapes step after step: cost each (name, kept args) once. Ops with equal kept args
        # (the inputs, and a collective's fields) share one args dict (events._kept), so its id is the key
        # (no per-op cache: a 1 GB trace holds 1.3 million ops)
        sig = (op.name, id(op.args))
        c = self.memo.get(sig, _UNSET)
        if c is _UNSET:
            c = self.memo[sig] = cost_op(op.name, op.args, self.dtype)
        return c

    def mark(self, ops) -> None:
        for op in ops:
            c = self.cost(op)
            if isinstance(c, OpCost) and not is_wrapper(op.name):
                p = op.parent
                while p is not None and id(p) not in self.below:
                    self.below.add(id(p))
                    p = p.parent

    def costable(self, op) -> bool:
        c = self.cost(op)
        if not isinstance(c, OpCost):
            return False
        if is_wrapper(op.name):
            if id(op) in self.below:
                return False
            return c.category == COMMUNICATION or (self.gpu and id(op) in self.launched)
        return True

    def place(self, op):
        """(instance op, OpCost | FRAMEWORK | None) for time charged to ``op``."""
        outer = None
        for a in op.chain():
            if self.costable(a):
                outer = a
        if outer is not None:
            return outer, self.cost(outer)
        c = self.cost(op)
        if c == FRAMEWORK or (is_wrapper(op.name) and id(op) in self.below) or (
                isinstance(c, OpCost) and is_wrapper(op.name)):
            return op, FRAMEWORK
        unknown = op
        for a in op.chain():
            if self.cost(a) is None:
                unknown = a
        return unknown, None


class _Kernels:
    """Kernel-rule costs (``cost.cost_kernel``) for kernels whose op no rule costs, or that no op launched: each
    with the engine step around its launch, ``--model``, and its place in the step and under its op."""

    def __init__(self, steps, model, dtype: str, tp: int):
        self.steps, self.model, self.dtype, self.tp = steps, model, dtype, tp
        self.memo: dict = {}
        self.seen = Counter()        # (step, rule) -> launches so far: an attention kernel's layer
        self.under = Counter()       # (graph, op, rule) -> launches so far under that op (a fused MoE's two)
        self.last = 0                # the last costed kernel's place under its op: one instance per launch
        self.replays: dict = {}      # id(kernel) -> (ReplayKernels, index) for graph-replayed kernels
        self.notes: list = []        # the rules' sentences about the trace (KernelArgs.say)

    def add_replay(self, kernels, seqs: dict) -> None:
        """Remember one graph launch's kernels (in start order) for the rules that read the whole replay."""
        key = tuple((g.name, g.stream) for g in kernels)
        seq = seqs.get(key)
        if seq is None:
            seq = seqs[key] = ReplayKernels(tuple(n for n, _ in key), tuple(s for _, s in key))
        for n, g in enumerate(kernels):
            self.replays[id(g)] = (seq, n)

    def cost(self, g, op, graph):
        if g is None or g.kind != "kernel":
            return None
        r = kernel_rule_for(g.name)
        if r is None or r.cost is None or r.names or r.pattern is not None:
            return None
        launch = g.launch
        step = self.steps.at(launch.ts if launch is not None else g.ts,
                             launch.thread[0] if launch is not None else None) if self.steps.steps else None
        k1, k2 = (id(step), r.label), (graph, id(op), r.label)
        nth, nth_in_op = self.seen[k1], self.under[k2]
        self.last = nth_in_op
        self.seen[k1] += 1
        self.under[k2] += 1
        layer = nth % self.model.n_layers if self.model is not None and self.model.n_layers else nth
        seq, pos = self.replays.get(id(g), (None, None)) if graph is not None else (None, None)
        key = (g.name, id(op.args) if op is not None else None, step.key if step is not None else None, layer,
               nth_in_op, id(seq), pos)
        c = self.memo.get(key, _UNSET)
        if c is _UNSET:
            c = self.memo[key] = cost_kernel(g.name, op, meta=g.args, step=step, model=self.model, nth=layer,
                                             nth_in_op=nth_in_op, tp=self.tp, default_dtype=self.dtype, replay=seq,
                                             position=pos, notes=self.notes)
        return c


def build_instances(trace, dtype: str, captures=(), steps=None, model=None) -> tuple[list, dict, dict]:
    """Op instances of one trace (see the module docstring), the graph-replay mapping stats, and the replayed
    kernels mapped to captured ops ({id(kernel): op})."""
    by_kernel = _Kernels(steps if steps is not None else find_steps(trace), model, dtype, max(trace.world_size, 1))
    launched = {id(g.op) for g in trace.gpu if g.op is not None}
    coster = _Coster(dtype, trace.is_gpu, launched)
    coster.mark(trace.ops)
    replay = None
    if captures:
        replay = ReplayMap(captures)
        for c in captures:
            coster.launched |= {id(g.op) for g in c.gpu if g.op is not None}
            coster.mark(c.ops)
    mapped: dict = {}
    seqs: dict = {}
    for corr, kernels in graph_launches(trace).items():
        ops = replay.map_launch(kernels) if replay is not None else ()
        for g, op in zip(kernels, ops):
            mapped[id(g)] = op
        if not any(op is not None for op in ops):     # no capture maps it: the rules that read the whole replay
            by_kernel.add_replay(kernels, seqs)
    inst: dict = {}
    names: dict = {}
    att = Counter()          # seconds of GPU activity by how it was attributed
    for op, seconds, g in work_items(trace):
        graph = g.graph if g is not None else None
        if g is not None and graph is not None:
            op = mapped.get(id(g))
            if op is not None:
                att["replay_mapped"] += seconds
        if op is None and graph is not None:
            i, how = _replay_instance(trace, inst, g, by_kernel.cost(g, None, graph))
            att[how] += seconds
        elif op is None and (kc := by_kernel.cost(g, None, graph)) is not None:
            att["before_window" if g.early else "unattributed"] += seconds
            i = inst[("kernel", graph, id(g))] = Instance(kc.name, kc, kc.category, g.launch.ts if g.launch else g.ts,
                                                          g.launch.thread if g.launch else (None, None), graph,
                                                          COMMUNICATION if kc.category == COMMUNICATION else "")
        elif op is None:
            cat = kernel_category(g.name, g.kind)
            what = "launched before the profiler window" if g.early else "unattributed"
            att["before_window" if g.early else "unattributed"] += seconds
            key = (what, graph, id(g))
            i = inst.get(key)
            if i is None:
                t = g.launch.ts if g.launch is not None else g.ts
                thread = g.launch.thread if g.launch is not None else (None, None)
                i = inst[key] = Instance(f"{what} {cat}", None, cat, t, thread, graph,
                                         COMMUNICATION if cat == COMMUNICATION else UNCOSTED)
        else:
            if g is not None and graph is None:
                att["op"] += seconds
            where, oc = coster.place(op)
            key = (graph, id(where))
            named = where.name
            if not isinstance(oc, OpCost) and g is not None and (kc := by_kernel.cost(g, op, graph)) is not None:
                oc, key, named = kc, (graph, id(where), g.name, by_kernel.last), kc.name   # by its kernel's rule
            i = inst.get(key)
            if i is None:
                t = where.ts if graph is None else g.launch.ts
                thread = where.thread if graph is None else g.launch.thread
                if isinstance(oc, OpCost):
                    i = Instance(named, oc, oc.category, t, thread, graph,
                                 COMMUNICATION if oc.category == COMMUNICATION else "")
                elif oc == FRAMEWORK and g is None:
                    i = Instance(where.name, None, "framework", t, thread, graph)
                    i.cost = ZERO
                else:   # not in the table, or a framework op that launched GPU work: uncosted
                    cat = kernel_category(g.name, g.kind) if g is not None else "other"
                    i = Instance(where.name, None, cat, t, thread, graph, UNCOSTED)
                    i.signature = _shape_sig(where)
                inst[key] = i
        i.seconds += seconds
        if g is not None:
            k = names.get(g.name)
            if k is None:
                k = names[g.name] = g.name[:80]     # one string per kernel name, not one slice per instance
            i.kernels[k] = i.kernels.get(k, 0) + 1
    stats = {"graph_kernels_mapped": replay.matched, "graph_kernels_unmapped": replay.unmatched} if replay else {}
    if trace.is_gpu:
        stats["attribution"] = _attribution(att)
    if by_kernel.notes:
        stats["rule_notes"] = list(by_kernel.notes)
    return list(inst.values()), stats, mapped


REPLAYED = "(graph replay, no capture)"           # the signature of such a kernel's instance
ATTRIBUTION = ("op", "replay_mapped", "replay_cpu_op", "replay_no_op", "before_window", "unattributed")


def _replay_instance(trace, inst: dict, g, oc):
    """The instance of a replayed kernel no capture trace mapped: the kernel itself, by its name, category and
    time (signature ``REPLAYED``, after the rule's own when costed), costed by ``oc`` where a kernel rule costs it
    (``cost.cost_kernel``, with the engine step, ``--model`` and the kernel's place in the replay), else uncosted;
    a collective as communication. How it was attributed: the CPU op around the graph launch, or none."""
    launch = g.launch
    around = trace.op_at(launch.thread, launch.ts) if launch is not None else None
    cat = oc.category if oc is not None else kernel_category(g.name, g.kind)
    i = inst[("replay", id(g))] = Instance(g.name[:80], oc, cat, launch.ts if launch else g.ts,
                                           launch.thread if launch else (None, None), g.graph,
                                           COMMUNICATION if cat == COMMUNICATION else "" if oc else UNCOSTED)
    i.signature = f"{oc.signature} {REPLAYED}" if oc is not None and oc.signature else REPLAYED
    return i, "replay_cpu_op" if around is not None else "replay_no_op"


def _attribution(att: Counter) -> dict:
    """GPU time by how it reached an op: joined to its launching op, a graph replay mapped through a capture
    trace, a replayed kernel with no capture (listed by kernel name; "replay_cpu_op" when a CPU op is around its
    launch, else "replay_no_op"), before the profiler window, none."""
    total = sum(att.values())
    out = {f"{k}_s": att[k] * 1.0 for k in ATTRIBUTION}
    replay = att["replay_mapped"] + att["replay_cpu_op"] + att["replay_no_op"]
    out.update({"total_s": total, "op_share": (att["op"] + att["replay_mapped"]) / total if total else 0.0,
                "replay_s": replay, "replay_mapped_share": att["replay_mapped"] / replay if replay else None})
    return out


def _shape_sig(op) -> str:
    dims = (op.args or {}).get("Input Dims") or []
    shapes = [d for d in (dims if isinstance(dims, list) else []) if isinstance(d, list) and d
              and all(isinstance(x, int) for x in d)]
    return "x".join("[" + ",".join(map(str, s)) + "]" for s in shapes[:3])


def analyze_trace(trace, *, model=None, markers=None, captures=(), device_name: str = "", mix=None) -> TraceResult:
    """Instances -> phases -> Measurements, and the time summary, for one trace (one rank). ``mix``: the KV
    lengths of the engine's steps (``engine_steps.parse_mix``'s syntax), where the step annotations lack them."""
    paused = gc.isenabled()
    gc.disable()          # as in read_trace: many small objects, no cyclic garbage
    try:
        return _analyze(trace, model, markers, captures, device_name, mix)
    finally:
        if paused:
            gc.enable()


def _analyze(trace, model, markers, captures, device_name, mix=None) -> TraceResult:
    dtype = run_dtype(trace)
    engine = find_steps(trace, mix)
    instances, replay_stats, mapped = build_instances(trace, dtype, captures, engine, model)
    plan = plan_phases(trace, instances, markers, engine)
    gt = gpu_time(trace)
    timer = "trace" if trace.is_gpu else "trace-cpu"
    groups: dict = defaultdict(list)
    for i, ph in zip(instances, plan.phase):
        if ph is not None:
            groups[(ph, i.name, i.signature, i.off, i.category, i.compute_dtype)].append(i)
    ms = []
    for (ph, name, sig, off, cat, cdt), items in sorted(groups.items(), key=lambda kv: (kv[0][0] != "prefill",
                                                                                       -sum(x.seconds for x in kv[1]))):
        shape = plan.shape[ph]
        steps = plan.steps.get(ph, 1)
        first = items[0]
        cost = first.cost if first.cost is not None else ZERO
        new = 1 if ph == "decode" else shape["tokens"] if ph == FORWARD else max(shape["context"] - shape["cached"], 1)
        point = WorkloadPoint(model=model.name if model else "trace", op=f"{name} {sig}".strip(), phase=ph,
                              batch=shape["batch"] if ph == FORWARD else max(shape["batch"], 1), new_tokens=new, context=shape["context"], cost=cost,
                              dtype=dtype, backend="trace", cached=shape["cached"], weight_dtype=dtype, kv_dtype=dtype,
                              compute_dtype=cdt, tp=max(trace.world_size, 1), count=len(items) / steps)
        kernels = Counter()
        for x in items:
            kernels.update(x.kernels)
        config = {"name": name, "signature": sig, "category": cat, "instances": len(items), "steps": steps,
                  "kernels_per_instance": sum(kernels.values()) / len(items),
                  "top_kernels": [k for k, _ in kernels.most_common(3)]}
        if first.rule:
            config["rule"] = first.rule
        if first.note:
            config["note"] = first.note
        if first.detail:
            config["detail"] = dict(first.detail)
        flags = (off,) if off else ()
        times = [x.seconds for x in items if x.seconds > 0]
        if not times:
            continue
        ms.append(Measurement(point, times, timer=timer, config=config, device=device_name, flags=flags,
                              rank=trace.rank))
    summary = _summary(trace, instances, plan, gt, replay_stats)
    if engine.steps:
        summary["engine_steps"] = engine.to_json(instances)
    if trace.is_gpu:
        summary["idle"] = idle_causes(trace, markers)
        summary["launches"] = launch_stats(trace)
    experts = expert_loads(trace, instances, plan.phase, model, mapped)   # tokens per expert (a MoE model's trace)
    if experts is not None:
        summary["experts"] = {**experts.to_json(), "sentence": experts.sentence}
    engine_notes = summary["engine_steps"]["notes"] if engine.steps else engine.notes
    return TraceResult(ms, summary, dtype, list(trace.notices) + plan.notes + engine_notes
                       + replay_stats.get("rule_notes", []), instances)


def _summary(trace, instances, plan, gt, replay_stats) -> dict:
    total = sum(i.seconds for i in instances)
    by_kind = Counter()
    by_cat = Counter()
    for i in instances:
        kind = i.off or ("framework" if i.category == "framework" else "costed")
        by_kind[kind] += i.seconds
        by_cat[i.category] += i.seconds
    top = sorted(instances, key=lambda i: -i.seconds)
    agg: dict = defaultdict(lambda: [0.0, 0, ""])
    for i in instances:
        a = agg[(i.name, i.signature)]
        a[0] += i.seconds
        a[1] += 1
        a[2] = i.off or i.category
    top_ops = sorted(agg.items(), key=lambda kv: -kv[1][0])[:15]
    phases = {p: {"steps": plan.steps.get(p, 0), "method": plan.method.get(p, ""), **plan.shape.get(p, {}),
                  "time_s": sum(i.seconds for i, ph in zip(instances, plan.phase) if ph == p)}
              for p in PLAN_PHASES if p in plan.shape}
    outside = sum(i.seconds for i, ph in zip(instances, plan.phase) if ph is None)
    uncosted = by_kind[UNCOSTED]
    return {"file": str(trace.path), "rank": trace.rank, "world_size": trace.world_size, "time": gt,
            "shapes_recorded": trace.has_shapes, "instances": len(instances), "attributed_s": total,
            "costed_s": by_kind["costed"], "framework_s": by_kind["framework"], "uncosted_s": uncosted,
            "communication_s": by_kind[COMMUNICATION], "uncosted_share": uncosted / total if total else 0.0,
            "costed_share": by_kind["costed"] / total if total else 0.0,
            "by_category_s": dict(by_cat.most_common()), "outside_phases_s": outside, "phases": phases,
            "top_ops": [{"op": f"{n} {s}".strip(), "time_s": v[0], "instances": v[1], "kind": v[2],
                         "share": v[0] / total if total else 0.0} for (n, s), v in top_ops],
            "top_uncosted": [{"op": f"{i.name} {i.signature}".strip(), "time_s": i.seconds, "category": i.category}
                             for i in top if i.off == UNCOSTED][:10],
            **replay_stats}


def op_rows(ms) -> list:
    """Per traced op and shape (one ``Measurement``): phase, op, category, the rule that costed it, instances,
    time, and FLOPs and bytes per instance (None when uncosted) -- what ``roofline trace --json`` lists."""
    out = []
    for m in ms:
        p, c = m.point, m.config
        off = m.flags[0] if m.flags else ""
        costed = off != UNCOSTED
        out.append({"phase": p.phase, "op": p.op, "category": c.get("category", ""), "kind": off or "costed",
                    "rule": c.get("rule"), "instances": c.get("instances", len(m.times_s)),
                    "per_step": p.count, "time_s": sum(m.times_s), "mean_s": m.instance_s,
                    "flops": p.cost.flops if costed else None, "bytes": p.cost.bytes if costed else None,
                    "intensity": p.cost.intensity if costed and p.cost.bytes else None,
                    "kernels": c.get("top_kernels", [])})
    return out


def model_expectation(result: TraceResult, model, device) -> dict:
    """Per phase: the cost model's step for ``model`` (at the trace's batch and context) beside the traced step.

    The model's step is ``roofline.workload``'s prefill/decode op list at the run dtype; the traced
    step is the costed instances per step. "not_modelled_s" is traced time per step in work the
    model's step does not have (casts, copies, fills, framework overhead); GPU idle is in the summary.
    """
    out = {}
    for ph, shape in result.summary["phases"].items():
        if ph == FORWARD:          # no phase, no batch or context: nothing to build the model's step from
            continue
        steps = max(shape.get("steps", 1), 1)
        dt = result.dtype if result.dtype in ("fp32", "bf16", "fp16") else "bf16"
        try:
            if ph == "prefill":
                step = W.prefill(model, shape["batch"], max(shape["context"], 1), shape.get("cached", 0),
                                 weight_dtype=dt, act_dtype=dt, kv_dtype=dt)
            else:
                step = W.decode(model, shape["batch"], max(shape["context"], 1), weight_dtype=dt, act_dtype=dt,
                                kv_dtype=dt)
            roof = analyze_phase(step, device).time_s      # each op at its roof (bounds.roof_for), x count
        except RooflineError as e:   # a shape the model cannot take (context past its maximum): say so
            out[ph] = {"error": str(e)}
            continue
        traced = [m for m in result.measurements if m.point.phase == ph]
        costed = [m for m in traced if not m.flags]
        cost = sum((m.point.cost * m.point.count for m in costed), ZERO)
        t = sum(m.instance_s * m.point.count for m in traced)
        extra = sum(m.instance_s * m.point.count for m in costed if m.config.get("category") in NOT_MODELLED)
        out[ph] = {"batch": shape["batch"], "context": shape["context"], "model_flops": step.total.flops,
                   "model_bytes": step.total.bytes, "model_roof_s": roof, "traced_flops": cost.flops,
                   "traced_bytes": cost.bytes, "traced_step_s": t, "not_modelled_s": extra, "steps": steps}
    return out


def per_step_cost(ms, phase: str) -> Cost:
    """Summed cost per step of a phase's costed measurements (count x instance cost)."""
    return sum((m.point.cost * m.point.count for m in ms if m.point.phase == phase and not m.flags), ZERO)


def kernel_breakdown(trace) -> list:
    """[(category, seconds, kernels)] of a trace's GPU activity by kernel name: the view of a shapeless trace."""
    agg: dict = defaultdict(lambda: [0.0, 0])
    for g in trace.gpu:
        a = agg[kernel_category(g.name, g.kind)]
        a[0] += g.dur * US
        a[1] += 1
    return sorted(((c, v[0], v[1]) for c, v in agg.items()), key=lambda x: -x[1])


def _share(x) -> str:
    return U.percent(x) if isinstance(x, (int, float)) and x == x else "-"


def attribution_lines(a: dict, g: dict) -> list:
    """'GPU time attributed to ops 100% (...)', graph replays with no capture, kernels before the window."""
    if not a or not a.get("total_s"):
        return []
    out = [f"GPU time attributed to ops: {_share(a['op_share'])} of {U.seconds(a['total_s'])}"
           + (f" (replayed graph kernels mapped through the capture: {_share(a['replay_mapped_share'])})"
              if a.get("replay_mapped_s") else "")]
    unknown = a["replay_cpu_op_s"] + a["replay_no_op_s"]
    if unknown:
        out.append(f"graph replays with no capture: {U.seconds(unknown)} of replayed kernels listed by kernel name "
                   "(--capture-trace maps them to ops)")
    if g.get("before_window"):
        out.append(f"launched before the profiler window: {g['before_window']} kernel(s), "
                   f"{U.seconds(g['before_window_s'])}, counted apart")
    return out
