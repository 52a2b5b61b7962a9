"""Tokens per expert in a traced mixture of experts, read from the experts' GEMM shapes (pure).

    from roofline.traces.experts import expert_loads
    ex = expert_loads(trace, instances, phases, model)     # None: a dense model or no model given
    ex.sentence, ex.to_json()

What a trace records of the routing (checked on torch.profiler captures with record_shapes=True of
transformers 5.24's tiny Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 and GPT-OSS, and of our own model's
torch path; tests/test_trace_experts.py):

* **An expert loop** (transformers' ``experts_implementation="eager"``, ``kernels.moe.torch_moe``): per expert
  hit, ``aten::select`` of the 3-D expert weight [E, a, b] on dim 0 -- its index is a Concrete Input --
  then the projection's GEMM (``aten::linear`` / ``matmul`` / ``mm`` / ``addmm``) whose weight is that
  [a, b] slice and whose input is [tokens_e, in]. Each expert's tokens are its first projection's rows,
  **by expert index**. Without Concrete Inputs (older torch) the experts are numbered in loop order
  (**by order**, said so).
* **torch's CPU ``aten::_grouped_mm``** (transformers' ``grouped_mm`` on a CPU): the op records the same
  select + ``mm`` per expert below it, so the counts are read as above (an expert given no tokens shows
  as 0 rows: not hit).
* **A grouped GEMM with no per-expert ops** (``aten::_grouped_mm`` on a GPU, vLLM's ``fused_moe_kernel`` /
  ``fused_experts`` / ``moe_forward``, our Triton ``_moe_gate_up_kernel``) or a **per-assignment gather**
  (transformers' ``batched_mm``: ``aten::index`` of the [E, ...] weight, then ``bmm`` over T*k rows): the
  expert of each row is a tensor value, not a shape, so **the trace does not hold per-expert counts**;
  only the rows in all (a ``_grouped_mm``'s input) are known. Said so, never guessed. (The vLLM and
  Triton names are from their sources, not from a capture here.)

A CUDA-graph replay (vLLM, SGLang decode) has no CPU ops of its own: with its capture trace
(``--capture-trace``) the replayed kernels map to the captured ops (``graphs.ReplayMap``), and the router
GEMM and grouped MoE ops are read from those (each once per replay, in kernel order; checked on a
vLLM gpt-oss layout: ``nn.Linear(2880, 32)`` router, ``vllm::moe_forward`` over triton_kernels'
``_matmul_ogs``, tests/test_trace_honest_experts.py). Without the capture, no router is seen: said so.

A MoE layer's pass starts at its **router GEMM** ([T, hidden] x [hidden, n_experts]: T is the tokens
routed). Passes are numbered in order within their phase (``roofline.traces.phases``' phase of the
router's instance): pass i is step i // L, MoE layer ``model.moe_layers[i % L]`` (L MoE layers; a
trace that starts mid-forward shifts these labels). Every assignment is visible when the counts sum
to T x k (the model's experts per token). Imbalance = the largest count / the mean count over the
experts hit (as ``roofline.verdicts.expert_rules`` reads it).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

GEMMS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm")
WEIGHT_INPUT = {"aten::addmm": 2}            # which input holds the weight (else input 1)
GROUPED_OPS = ("aten::_grouped_mm", "fused_moe", "fused_experts", "moe_forward")   # name substrings
GROUPED_KERNELS = ("fused_moe", "_moe_gate_up_kernel", "_moe_down_kernel", "matmul_ogs")   # matmul_ogs: triton_kernels
GATHERS = ("aten::index", "aten::index_select")
BY_INDEX, BY_ORDER, GROUPED, NOT_FOUND = "by index", "by order", "grouped", "not found"
MAX_PASSES = 128                             # passes listed one by one in the JSON (the rest in by_layer only)


@dataclass
class LayerPass:
    """One MoE layer's pass in one step: the tokens its router saw and what each expert got."""

    phase: str
    step: int                     # 0-based within the phase
    layer: int
    tokens: int                   # the router GEMM's rows
    k: int                        # experts per token (the model's)
    counts: dict = field(default_factory=dict)    # expert (index, or loop position) -> tokens
    how: str = NOT_FOUND          # BY_INDEX | BY_ORDER | GROUPED | NOT_FOUND
    grouped: str = ""             # the grouped op or kernel seen, when the counts are not recorded
    grouped_rows: int = 0         # rows of a grouped GEMM (T x k), when its input shape says
    mismatched: int = 0           # projections whose rows differ from their expert's first one
    first_weight: tuple = field(default=(), repr=False)   # by order: the pass's first projection's weight shape

    @property
    def hit(self) -> int:
        return sum(1 for n in self.counts.values() if n > 0)

    @property
    def routed(self) -> int:
        return sum(self.counts.values())

    @property
    def expected(self) -> int:
        return self.tokens * self.k

    @property
    def complete(self) -> bool:
        return self.how in (BY_INDEX, BY_ORDER) and self.routed == self.expected

    @property
    def imbalance(self) -> float | None:
        """max / mean tokens over the experts hit; None without counts."""
        n = [c for c in self.counts.values() if c > 0]
        return max(n) * len(n) / sum(n) if n else None

    def to_json(self) -> dict:
        return {"phase": self.phase, "step": self.step, "layer": self.layer, "tokens": self.tokens,
                "routed": self.routed, "expected": self.expected, "complete": self.complete, "how": self.how,
                "experts_hit": self.hit, "counts": {str(e): n for e, n in sorted(self.counts.items())},
                "imbalance": self.imbalance, "grouped": self.grouped, "grouped_rows": self.grouped_rows}


@dataclass
class ExpertLoads:
    n_experts: int
    k: int
    layers: tuple                 # the model's MoE layers
    passes: list                  # LayerPass, in trace order
    notes: list = field(default_factory=list)

    @property
    def how(self) -> str:
        """BY_INDEX / BY_ORDER when every pass has counts, GROUPED when none has, NOT_FOUND without passes."""
        hows = {p.how for p in self.passes}
        if not hows:
            return NOT_FOUND
        if hows <= {BY_INDEX}:
            return BY_INDEX
        if hows <= {BY_INDEX, BY_ORDER}:
            return BY_ORDER
        return GROUPED if hows <= {GROUPED} else "mixed"

    def by_layer(self) -> list:
        """Per (phase, layer): the counts summed over its steps, the tokens, and the summed imbalance."""
        agg: dict = {}
        for p in self.passes:
            if p.how not in (BY_INDEX, BY_ORDER):
                continue
            a = agg.setdefault((p.phase, p.layer), {"phase": p.phase, "layer": p.layer, "steps": 0, "tokens": 0,
                                                     "routed": 0, "counts": defaultdict(int)})
            a["steps"] += 1
            a["tokens"] += p.tokens
            a["routed"] += p.routed
            for e, n in p.counts.items():
                a["counts"][e] += n
        out = []
        for a in agg.values():
            n = [c for c in a["counts"].values() if c > 0]
            out.append({**a, "counts": {str(e): c for e, c in sorted(a["counts"].items())}, "experts_hit": len(n),
                        "imbalance": max(n) * len(n) / sum(n) if n else None})
        return out

    @property
    def sentence(self) -> str:
        return expert_sentence({**self.to_json(), "passes": [p.to_json() for p in self.passes]})

    def to_json(self) -> dict:
        return {"how": self.how, "n_experts": self.n_experts, "k": self.k, "layers": list(self.layers),
                "passes": [p.to_json() for p in self.passes[:MAX_PASSES]], "n_passes": len(self.passes),
                "by_layer": self.by_layer(), "notes": list(self.notes)}


def _dims(op, i):
    d = (op.args or {}).get("Input Dims") or []
    s = d[i] if i < len(d) else None
    return tuple(s) if isinstance(s, list) and all(type(x) is int for x in s) else None


def _concrete(op, i):
    c = (op.args or {}).get("Concrete Inputs") or []
    v = c[i] if i < len(c) else ""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _rows(shape) -> int:
    n = 1
    for x in shape[:-1]:
        n *= x
    return n


def _under_gemm(op) -> bool:
    p = op.parent
    while p is not None:
        if p.name in GEMMS:
            return True
        p = p.parent
    return False


def _gemm_event(op, E: int, H: int):
    """("router" | "gemm", (rows, weight shape)) of a GEMM op with a 2-D weight, else None."""
    x, w = _dims(op, 0), _dims(op, WEIGHT_INPUT.get(op.name, 1))
    if x and w and len(w) == 2:
        return ("router" if x[-1] == H and w in ((E, H), (H, E)) else "gemm"), (_rows(x), w)
    return None


def _replayed(mapped: dict, trace, E: int, H: int) -> list:
    """Events of graph-replayed kernels mapped to captured ops (``analyze.build_instances``): a replay has no CPU
    ops of its own, its router GEMM and grouped MoE ops are in the capture trace. Each captured GEMM (its outermost
    GEMM op) or grouped op counts once per replay, at its first kernel's start, on the launching thread; its phase
    is read at the graph launch."""
    ev, seen = [], set()
    for g in trace.gpu:
        op = mapped.get(id(g)) if g.graph is not None else None
        if op is None or g.launch is None:
            continue
        outer = next((a for a in reversed(list(op.chain())) if a.name in GEMMS), None)
        if outer is not None:
            if (g.graph, id(outer)) not in seen:
                seen.add((g.graph, id(outer)))
                e = _gemm_event(outer, E, H)
                if e is not None:
                    ev.append((g.launch.thread, g.ts, e[0], e[1], g.launch.ts))
            continue
        grouped = next((a for a in op.chain() if any(k in a.name for k in GROUPED_OPS)), None)
        if grouped is not None and (g.graph, id(grouped)) not in seen:
            seen.add((g.graph, id(grouped)))
            ev.append((g.launch.thread, g.ts, "grouped", (grouped.name, 0), g.launch.ts))
    return ev


def _events(trace, E: int, H: int, mapped=None):
    """(thread, ts, kind, payload, phase ts) of every router GEMM, expert select, expert projection, grouped op or
    kernel and per-assignment gather -- the trace's own ops and the captured ops its graph replays ran
    (``mapped``) -- by thread then time. The phase ts is when its instance was launched."""
    ev = _replayed(mapped, trace, E, H) if mapped else []
    for op in trace.ops:
        name = op.name
        if name in GEMMS:
            if _under_gemm(op):
                continue
            e = _gemm_event(op, E, H)
            if e is not None:
                ev.append((op.thread, op.ts, e[0], e[1], op.ts))
        elif name == "aten::select":
            s = _dims(op, 0)
            if s and len(s) == 3 and s[0] == E and _concrete(op, 1) in (0, None):
                ev.append((op.thread, op.ts, "select", (_concrete(op, 2), s[1:]), op.ts))
        elif name in GATHERS:
            s = _dims(op, 0)
            if s and len(s) == 3 and s[0] == E:
                ev.append((op.thread, op.ts, "grouped", (f"{name} of the [{E}, ...] expert weights", 0), op.ts))
        elif ("moe" in name or "expert" in name or "grouped_mm" in name) and any(g in name for g in GROUPED_OPS):
            x = _dims(op, 0)
            ev.append((op.thread, op.ts, "grouped", (name, _rows(x) if name == "aten::_grouped_mm" and x else 0),
                       op.ts))
    for g in trace.gpu:
        if g.launch is not None and g.op is None and any(k in g.name for k in GROUPED_KERNELS):
            if mapped and id(g) in mapped:      # a replayed kernel whose captured op is counted above
                continue
            at = g.ts if g.graph is not None else g.launch.ts     # a replay's kernels share one launch time
            ev.append((g.launch.thread, at, "grouped", (g.name[:60], 0), g.launch.ts))
    ev.sort(key=lambda e: (str(e[0]), e[1], e[2] != "router"))
    return ev


def _phase_lookup(instances, phases):
    """thread -> (sorted launch times, phases) of the instances, to give a router op its instance's phase."""
    by: dict = defaultdict(list)
    for i, ph in zip(instances, phases):
        by[i.thread].append((i.t, ph or "outside phases"))
    return {t: ([x[0] for x in sorted(v)], [x[1] for x in sorted(v)]) for t, v in by.items()}


def expert_loads(trace, instances, phases, model, mapped=None) -> ExpertLoads | None:
    """Per MoE layer pass: tokens per expert (see the module docstring); None for a dense model or no model.
    ``mapped``: {id(replayed kernel): captured op} (``analyze.build_instances``), so a graph replay's router GEMM
    and grouped MoE ops, which only its capture trace records, are found."""
    if model is None or not getattr(model, "n_experts", 0):
        return None
    E, H, k, layers = model.n_experts, model.hidden, model.n_active, tuple(model.moe_layers)
    L = max(len(layers), 1)
    look = _phase_lookup(instances, phases)
    passes: list = []
    seen: dict = defaultdict(int)       # phase -> passes so far
    notes: list = []
    cur, thread, pending, dropped = None, None, None, 0
    for th, ts, kind, val, at in _events(trace, E, H, mapped):
        if th != thread:
            thread, cur, pending = th, None, None
        if kind == "router":
            times, phs = look.get(th, ([], []))
            j = bisect.bisect_left(times, at)
            ph = phs[j] if j < len(phs) else (phs[-1] if phs else "outside phases")
            i = seen[ph]
            seen[ph] += 1
            cur = LayerPass(ph, i // L, layers[i % L] if layers else i % L, val[0], k)
            passes.append(cur)
            pending = None
        elif kind == "select":
            pending = val
        elif kind == "grouped":
            if cur is not None and not cur.counts:
                cur.how, cur.grouped, cur.grouped_rows = GROUPED, cur.grouped or val[0], cur.grouped_rows or val[1]
        elif kind == "gemm" and pending is not None:
            index, out = pending
            pending = None
            rows, w = val
            if w not in (tuple(out), tuple(out)[::-1]):
                continue
            if cur is None:
                dropped += 1
                continue
            if index is None:             # no Concrete Inputs: each of the first projection's kind is a new expert
                if cur.how != BY_ORDER:
                    cur.counts, cur.first_weight = {}, w
                if w != cur.first_weight:
                    continue
                cur.how, index = BY_ORDER, len(cur.counts)
            elif cur.how != BY_INDEX:
                cur.how, cur.counts = BY_INDEX, {}
            cur.grouped, cur.grouped_rows = "", 0
            if index in cur.counts:
                cur.mismatched += cur.counts[index] != rows
            else:
                cur.counts[index] = rows
    if dropped:
        notes.append(f"{dropped} expert projection(s) before the first router GEMM in the trace were not counted.")
    bad = sum(p.mismatched for p in passes)
    if bad:
        notes.append(f"{bad} expert projection(s) saw other rows than their expert's first projection: each "
                     "expert's count is its first projection's rows.")
    partial = [p for p in passes if p.how in (BY_INDEX, BY_ORDER) and p.routed != p.expected]
    if partial:
        notes.append(f"{len(partial)} of {len(passes)} MoE layer pass(es) show other than tokens x {k} "
                     "assignments: not every expert's GEMM is visible there (or the router is not top-"
                     f"{k}).")
    return ExpertLoads(E, k, layers, passes, notes)


def _range(xs, fmt) -> str:
    lo, hi = min(xs), max(xs)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


def expert_sentence(d: dict) -> str:
    """One line from ``ExpertLoads.to_json()`` (what the report and ``roofline trace`` print)."""
    passes, E, k = d.get("passes") or [], d.get("n_experts", 0), d.get("k", 0)
    how = d.get("how", NOT_FOUND)
    if how == NOT_FOUND or not passes:
        return (f"Expert routing: no router GEMM ([tokens, hidden] x [hidden, {E}]) in the trace, so no MoE layer "
                "pass was found: per-expert token counts are not read.")
    grouped = [p for p in passes if p["how"] == GROUPED]
    counted = [p for p in passes if p["how"] in (BY_INDEX, BY_ORDER)]
    out = []
    if counted:
        per = defaultdict(list)
        for p in counted:
            per[p["phase"]].append(p)
        parts = []
        for ph, ps in per.items():
            full = sum(1 for p in ps if p["complete"])
            worst = max(ps, key=lambda p: p["imbalance"] or 0.0)
            top = max(worst["counts"].items(), key=lambda kv: kv[1]) if worst["counts"] else ("-", 0)
            parts.append(f"{ph}: {len(ps)} layer pass(es), {_range([p['tokens'] for p in ps], str)} token(s) x "
                         f"top-{k}, {full} of {len(ps)} with every assignment seen; experts hit "
                         f"{_range([p['experts_hit'] for p in ps], str)} of {E}; max/mean tokens per expert hit "
                         f"{_range([p['imbalance'] or 0.0 for p in ps], lambda x: f'{x:.2f}')} (worst: step "
                         f"{worst['step'] + 1}, layer {worst['layer']}, expert {top[0]} with {top[1]} of "
                         f"{worst['routed']})")
        what = "by expert index" if how == BY_INDEX else "numbered in loop order (the trace records no index)"
        out.append(f"Expert routing ({what}, from the experts' GEMM shapes): " + "; ".join(parts) + ".")
    if grouped:
        ops = sorted({p["grouped"] for p in grouped})
        rows = sorted({p["grouped_rows"] for p in grouped if p["grouped_rows"]})
        out.append(f"Expert routing: this trace records the experts' GEMMs grouped or gathered per token "
                   f"({', '.join(ops)}) in "
                   f"{len(grouped)} layer pass(es): per-expert token counts are not in it"
                   + (f"; {_range(rows, str)} rows per grouped GEMM (tokens x top-{k})" if rows else "") + ".")
    missing = [p for p in passes if p["how"] == NOT_FOUND]
    if missing:
        out.append(f"{len(missing)} MoE layer pass(es) show a router GEMM but no expert GEMM the trace ties to an "
                   "expert (no select of the [E, ...] expert weights before it): their counts are not read.")
    return " ".join(out)
