"""Which phase (prefill or decode) and which step each traced op instance belongs to.

Three sources, the first that applies (``plan_phases``; the plan says which was used):

1. **Annotations**: ``record_function`` ranges whose name holds the word "prefill" or "decode"
   (any case; a whole word: no letter just before or after it, so "decode_step" and "forward decode"
   mark decode, "decoder" and "predecode" do not), or the names given with ``--phase-marker PHASE=NAME``. An instance
   belongs to the innermost marked range around its launch on the launching process;
   instances outside every marked range belong to no phase (their time is reported, not
   judged). Each marked range is a step, unless forward calls inside it say there are more.
2. **The forward sequence**: ranges whose name holds the word "forward" (``record_function``), top-level
   module calls (``nn.Module: ...`` with ``with_stack``), each ``aten::embedding`` (a forward
   begins by embedding its tokens) and each CUDA-graph replay. A forward whose embedded
   tokens are [B, S] with S > 1 is a prefill, S = 1 a decode; without token ids, a forward
   seeing more tokens (GEMM rows) than the fewest seen is a prefill, and when every forward
   sees the same count the first is the prefill and the rest decode (a generate call).
3. **Tokens per step, inferred**, only where the ops show generation (``_generation_pattern``:
   attention at one query per sequence, or GEMM rows that drop once and for good):
   each instance takes the phase of the nearest GEMM or attention before it: attention with
   one query per sequence is decode; GEMMs with the fewest rows are decode when several row
   counts appear. Stated as inferred.

When none of these tells the phases -- one plain forward, forwards that all see the same tokens
(a training step, an encoder, a recommender), GEMMs with no attention op at one query per
sequence -- the instances are **"forward (phase unknown)"** (``FORWARD``): a prefill needs a
decode after it to be one. Such a step gets no invented batch or context (both 0: unknown);
its tokens (the GEMM rows it saw) are kept, as seen.

The step shape of each phase (batch, context, cached) comes from its first attention op
(q [B, Hq, S_q, D] against S_kv keys: SDPA and its flash / efficient / cudnn / math / CPU
variants, flash-attn, one-sequence varlen flash-attn: the ops the cost rules (``rules.sdpa``)
cost), else its first attention written as matmuls (``matmul_attention``: q.k^T, a softmax over
[B, H, R, S_kv], p.v; eager attention and our torch decode path), else its GEMM rows. Paged
attention stays unread: its KV lengths are tensor values, not shapes.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from ..errors import RooflineError
DEFAULT_MARKERS = {"prefill": ("prefill",), "decode": ("decode",)}
FORWARD = "forward"                       # a forward pass whose phase the trace does not tell
PLAN_PHASES = ("prefill", "decode", FORWARD)
UNKNOWN_SHAPE = "phase unknown: batch and context are not inferred"


def phase_text(phase: str, ph: dict) -> str:
    """'decode: 3 step(s), batch 1, context 8 (how)' or 'forward (phase unknown): 2 step(s), 4,096 tokens each (...)'."""
    if phase == FORWARD:
        tok = f", {ph['tokens']:,} tokens each" if ph.get("tokens") else ""
        return f"forward (phase unknown): {ph['steps']} step(s){tok} ({ph['how']})"
    return f"{phase}: {ph['steps']} step(s), batch {ph['batch']}, context {ph['context']:,} ({ph['how']})"


@dataclass
class PhasePlan:
    phase: list                                   # per instance: "prefill" | "decode" | None
    steps: dict = field(default_factory=dict)     # phase -> steps seen (>= 1)
    method: dict = field(default_factory=dict)    # phase -> how the phase was found, in words
    shape: dict = field(default_factory=dict)     # phase -> {"batch", "context", "cached", "how"}
    notes: list = field(default_factory=list)


def parse_markers(specs) -> dict:
    """``["prefill=ctx_encode", "decode=gen_step"]`` -> {phase: (names...)} added to the defaults."""
    out = {k: list(v) for k, v in DEFAULT_MARKERS.items()}
    for spec in specs or ():
        phase, sep, name = str(spec).partition("=")
        phase = phase.strip().lower()
        if not sep or phase not in out or not name.strip():
            raise RooflineError(f"--phase-marker must be PHASE=NAME with PHASE prefill or decode (e.g. "
                                f"decode=my_decode_step), not {spec!r}.")
        out[phase].append(name.strip().lower())
    return {k: tuple(v) for k, v in out.items()}


_WORDS: dict = {}          # marker -> its whole-word pattern


def has_word(name: str, word: str) -> bool:
    """Whether ``word`` is in ``name`` as a whole word (any case): no letter just before or after it
    ("decode_step", "forward decode", "decode0" hold "decode"; "decoder", "predecode" do not)."""
    pat = _WORDS.get(word)
    if pat is None:
        pat = _WORDS[word] = re.compile(r"(?<![a-z])" + re.escape(word.lower()) + r"(?![a-z])")
    return pat.search(name.lower()) is not None


def marked_phase(name: str, markers: dict):
    """The phase an annotation's name marks (a marker is a whole word of it, any case), None if none or several."""
    hits = [p for p, names in markers.items() if any(has_word(name, n) for n in names)]
    return hits[0] if len(hits) == 1 else None


def _forwards(trace, instances) -> tuple[list, str]:
    """Forward-call start times (µs, sorted), their token shapes, and what marked them."""
    spans = [a for a in trace.annotations if has_word(a.name, "forward")]
    if spans:
        return sorted((a.ts, a.end, None) for a in spans), "forward annotations"
    mods = sorted(trace.modules, key=lambda m: (m.ts, -m.end))
    top, last_end = [], -1.0
    for m in mods:
        if m.ts >= last_end:
            top.append((m.ts, m.end, None))
            last_end = m.end
    if top:
        return top, "top-level module calls"
    emb = sorted((op.ts, op) for op in trace.ops if op.name == "aten::embedding")
    starts = [(ts, None, _ids_shape(op)) for ts, op in emb]
    launches = sorted({i.t for i in instances if i.graph is not None})
    starts += [(t, None, None) for t in launches]
    starts.sort(key=lambda x: x[0])
    what = " and ".join(w for w, on in (("embedding calls", emb), ("graph replays", launches)) if on)
    return starts, what


def _ids_shape(op):
    dims = (op.args.get("Input Dims") or [None, None]) if op.args else [None, None]
    s = dims[1] if len(dims) > 1 else None
    return tuple(s) if isinstance(s, list) and s and all(isinstance(x, int) for x in s) else None


def _tokens(inst) -> int | None:
    d = inst.detail
    if inst.category == "gemm" and d.get("m"):
        return d["m"]
    if inst.category == "attention" and d.get("s_q"):
        return d["batch"] * d["s_q"]
    return None


# a serving engine's step (``engine_steps.EngineStep.mode``) -> the phase it counts in: a mixed step (continuous
# batching: a prefill chunk beside decode sequences) counts as prefill, the phase its chunk's tokens dominate
ENGINE_PHASE = {"prefill": "prefill", "decode": "decode", "mixed": "prefill"}


def plan_phases(trace, instances, markers=None, engine=None) -> PhasePlan:
    """Assign each instance (``.t`` launch time µs, ``.thread``, ``.category``, ``.detail``) a phase and a step:
    by the phase annotations (``markers``), and by a serving engine's step annotations (``engine``:
    ``engine_steps.EngineSteps``; vLLM's ``execute_context_N(..)_generation_M(..)``, SGLang's ``step[...]``)."""
    markers = markers or DEFAULT_MARKERS
    n = len(instances)
    plan = PhasePlan([None] * n)
    step_of = [None] * n
    marked = [(a.ts, a.end, p, a.thread[0], False) for a in trace.annotations
              if (p := marked_phase(a.name, markers))]
    stepped = [(st.ts, st.end, ENGINE_PHASE[st.mode], st.pid, True) for st in (engine.steps if engine is not None
                                                                                else ()) if st.mode in ENGINE_PHASE]
    spans = sorted(marked + stepped, key=lambda s: (s[0], -s[1], s[4]))   # an engine step over an equal span
    longest = max((s[1] - s[0] for s in spans), default=0.0)   # a search back past it can stop
    fwd, what = _forwards(trace, instances)
    starts = [f[0] for f in fwd]
    fwd_of = [None] * n
    for i, inst in enumerate(instances):
        k = bisect.bisect_right(starts, inst.t) - 1
        if k >= 0 and (fwd[k][1] is None or inst.t <= fwd[k][1]):
            fwd_of[i] = k
    if spans:
        span_starts = [s[0] for s in spans]
        for i, inst in enumerate(instances):
            best = None
            j = bisect.bisect_right(span_starts, inst.t) - 1
            while j >= 0 and best is None:   # innermost: the latest-starting marked range around t
                s = spans[j]
                if s[0] <= inst.t <= s[1] and s[3] == inst.thread[0]:
                    best = s
                j -= 1
                if inst.t - s[0] > longest:
                    break
            if best is not None:
                plan.phase[i] = best[2]
                # an engine's step is one step whatever runs in it (eager input copies, then a graph replay);
                # a phase annotation's span may hold several forwards
                step_of[i] = (best[0], None if best[4] else fwd_of[i])
        for p in ("prefill", "decode"):
            plan.method[p] = "annotations (record_function names containing " + " / ".join(
                repr(m) for m in markers[p]) + ")"
            if any(sp[2] == p for sp in stepped):
                plan.method[p] = (f"{engine.steps[0].engine} step annotations"
                                  + (" (a mixed step counts as prefill)" if p == "prefill" and any(
                                      st.mode == "mixed" for st in engine.steps) else "")
                                  + ("; and " + plan.method[p] if any(sp[2] == p for sp in marked) else ""))
        outside = sum(1 for ph in plan.phase if ph is None)
        if outside:
            plan.notes.append(f"{outside} op instance(s) ran outside every prefill/decode annotation: their time is "
                              "counted in the totals, not in a phase.")
    elif fwd:
        toks: dict = {}
        for i, inst in enumerate(instances):
            k = fwd_of[i]
            if k is not None and k not in toks:
                t = _tokens(inst)
                if t:
                    toks[k] = t
        shapes = {k: f[2] for k, f in enumerate(fwd) if f[2]}
        low = min(toks.values()) if toks else None
        same = len(set(toks.values())) <= 1
        phase_of = {}
        for k in range(len(fwd)):
            if k in shapes and len(shapes[k]) >= 2:
                phase_of[k] = "prefill" if shapes[k][-1] > 1 else "decode"
            elif k in toks and not same:
                phase_of[k] = "prefill" if toks[k] > low else "decode"
        generation = "decode" in phase_of.values()      # a prefill is one only with decode steps after it
        for k in range(len(fwd)):
            if not generation:
                phase_of[k] = FORWARD
            elif k not in phase_of:                      # no tokens seen: its place in a generate call
                phase_of[k] = "prefill" if k == 0 else "decode"
        for i in range(n):
            if fwd_of[i] is not None:
                plan.phase[i] = phase_of[fwd_of[i]]
                step_of[i] = (0, fwd_of[i])
        how = ("token ids [B, S]: S > 1 is prefill" if shapes else "tokens per forward: more than the fewest is "
               "prefill")
        if generation:
            for p in ("prefill", "decode"):
                plan.method[p] = f"forward sequence ({what}; {how})"
        else:
            plan.method[FORWARD] = (f"forward sequence ({what}): no forward with fewer tokens follows (no decode "
                                    "step), so no phase is told")
            plan.notes.append(_UNKNOWN_NOTE)
        before = sum(1 for k in fwd_of if k is None)
        if before:
            plan.notes.append(f"{before} op instance(s) ran before the first forward call: counted in the totals, "
                              "not in a phase.")
    else:
        _infer_by_tokens(instances, plan, step_of)
    for p in PLAN_PHASES:
        steps = {s for ph, s in zip(plan.phase, step_of) if ph == p}
        if steps:
            plan.steps[p] = max(len(steps), 1)
    _shapes(instances, plan, fwd, engine)
    return plan


_UNKNOWN_NOTE = ("the trace does not tell prefill from decode (no phase annotations, no decode step at one token "
                 "per sequence): its ops are one 'forward (phase unknown)' step, with no batch or context inferred. "
                 "Record with roofline.capture (or record_function('prefill') / ('decode')) to mark the phases.")


def _generation_pattern(instances, order) -> tuple:
    """Whether the ops look like generation: attention at one query per sequence; or GEMMs whose rows, in time
    order, drop once and for good: a run of prefill GEMMs, then from the first GEMM with the fewest rows to the
    end (at least two) none with as many rows as the smallest prefill GEMM (decode, whose attention GEMMs may
    have a few rows); or only one-row GEMMs (decode at batch 1). A training step (rows rise again in the
    backward), a plain forward (one row count, or a lone last-token head) is not.

    Returns (generation?, prefill rows: GEMMs with at least this many rows are prefill, or None: the fewest-row
    rule)."""
    if any(instances[i].category == "attention" and instances[i].detail.get("s_q") == 1 for i in order):
        return True, None
    rows = [instances[i].detail["m"] for i in order if instances[i].category == "gemm" and instances[i].detail.get("m")]
    if not rows:
        return False, None
    low = min(rows)
    if len(set(rows)) == 1:
        return low == 1, None
    first = rows.index(low)
    head, tail = rows[:first], rows[first:]
    ok = bool(head) and len(tail) >= 2 and max(tail) < min(head)
    return ok, (min(head) if ok else None)


def _infer_by_tokens(instances, plan: PhasePlan, step_of) -> None:
    order = sorted(range(len(instances)), key=lambda i: instances[i].t)
    generation, prefill_rows = _generation_pattern(instances, order)
    if not generation:
        for i in order:
            plan.phase[i], step_of[i] = FORWARD, (0, None)
        plan.method[FORWARD] = ("no annotations or forward calls, and the tokens per op show no generation "
                                "(prefill GEMMs, then decode GEMMs with the fewest rows to the end)")
        plan.notes.append(_UNKNOWN_NOTE)
        return
    ms = {instances[i].detail["m"] for i in order if instances[i].category == "gemm" and instances[i].detail.get("m")}
    low = min(ms) if ms else None
    cur, seg, last = None, -1, None
    for i in order:
        inst = instances[i]
        d = inst.detail
        if inst.category == "attention" and d.get("s_q"):
            cur = "decode" if d["s_q"] == 1 else "prefill"
        elif inst.category == "gemm" and d.get("m") and prefill_rows:
            cur = "decode" if d["m"] < prefill_rows else "prefill"
        elif inst.category == "gemm" and d.get("m") and len(ms) > 1:
            cur = "decode" if d["m"] == low else "prefill"
        elif inst.category == "gemm" and d.get("m") and cur is None:
            cur = "decode" if d["m"] == 1 else "prefill"
        if cur != last:
            seg, last = seg + 1, cur
        plan.phase[i] = cur
        step_of[i] = (seg, None)
    first = next((j for j, i in enumerate(order) if plan.phase[i]), None)
    if first:   # instances before the first GEMM or attention take its phase
        for i in order[:first]:
            plan.phase[i] = plan.phase[order[first]]
            step_of[i] = step_of[order[first]]
    for p in ("prefill", "decode"):
        plan.method[p] = ("inferred from tokens per step (attention with one query per sequence, or the GEMMs with "
                          "the fewest rows, is decode): no annotations or forward calls mark the phases")
    plan.notes.append("phases are inferred from the tokens each GEMM and attention op sees, not marked: record "
                      "with roofline.capture (or record_function('prefill') / ('decode')) to mark them.")


MATMUL_ATTENTION = "from its first attention by matmuls (q.k^T, softmax, p.v)"


def matmul_attention(instances, idx) -> dict | None:
    """Attention written as matmuls (eager attention: transformers' "eager", our torch decode path), read from the
    first batched GEMM q.k^T [X, R, D] x [X, D, S], a softmax over [B, H, R, S] and the batched GEMM p.v
    [X, R, S] x [X, S, D] after it, in ``idx`` order: {"batch": B, "s_q": R, "s_kv": S}.

    NB: R is the query rows per head; where grouped query heads share one matmul per KV head (our torch path)
    R is G x S_q, so only S_kv (and B) are read from it with certainty: a decode's context, a prefill's length."""
    for j, i in enumerate(idx):
        qk = instances[i]
        d = qk.detail
        if qk.category != "gemm" or d.get("batch", 1) < 2 or not d.get("n"):
            continue
        x, r, dh, s = d["batch"], d["m"] // d["batch"], d["k"], d["n"]
        sm = pv = None
        for i2 in idx[j + 1:j + 64]:            # the softmax and p.v follow within a few ops (masking, casts)
            o = instances[i2]
            if sm is None and o.category == "softmax":
                shape = o.detail.get("shape") or []
                if len(shape) != 4 or shape[-1] != s or shape[-2] != r or shape[0] * shape[1] != x:
                    break
                sm = shape
            elif sm is not None and o.category == "gemm":
                e = o.detail
                if e.get("batch") == x and e.get("m") == x * r and e.get("k") == s and e.get("n") == dh:
                    pv = o
                break
        if pv is not None:
            return {"batch": sm[0], "s_q": r, "s_kv": s}
    return None


def _annotated_batch(engine, phase: str) -> tuple:
    """(batch, how) from the first engine step of ``phase`` whose annotation says its sequences (a decode step's
    decode requests, a prefill's prefill requests), or (None, "")."""
    for st in (engine.steps if engine is not None else ()):
        if ENGINE_PHASE[st.mode] != phase:
            continue
        n = st.decode_requests if phase == "decode" else st.prefill_requests
        if n:
            return n, f"{st.engine} step annotation"
    return None, ""


def _shapes(instances, plan: PhasePlan, fwd, engine=None) -> None:
    for p in PLAN_PHASES:
        idx = [i for i, ph in enumerate(plan.phase) if ph == p]
        if not idx:
            continue
        if p == FORWARD:                  # no invented batch or context: only the rows it saw
            rows = next((instances[i].detail.get("m") for i in idx if instances[i].category == "gemm"
                         and instances[i].detail.get("m")), 0)
            plan.shape[p] = {"batch": 0, "context": 0, "cached": 0, "tokens": rows, "how": UNKNOWN_SHAPE}
            continue
        att = next((instances[i].detail for i in idx if instances[i].category == "attention"), None)
        how = "from its first attention op"
        if not att:
            att = matmul_attention(instances, idx)
            how = MATMUL_ATTENTION
        if att:
            b, sq, skv = att["batch"], att["s_q"], att["s_kv"]
            shape = ({"batch": b, "context": skv, "cached": max(skv - sq, 0)} if p == "prefill" else
                     {"batch": b, "context": max(skv - 1, 0), "cached": 0})
            shape["how"] = how
        else:
            gm = next((instances[i].detail.get("m") for i in idx if instances[i].category == "gemm"), None)
            said, by = _annotated_batch(engine, p)
            if p == "prefill":
                shape = ({"batch": said, "context": gm or 1, "cached": 0,
                          "how": f"batch from its {by}, tokens from its GEMM rows"} if said else
                         {"batch": 1, "context": gm or 1, "cached": 0, "how": "from its GEMM rows (batch 1 assumed)"})
            elif said:
                shape = {"batch": said, "context": 0, "cached": 0,
                         "how": f"batch from its {by} (context unknown: no attention op with its lengths)"}
            else:
                shape = {"batch": gm or 1, "context": 0, "cached": 0,
                         "how": "from its GEMM rows (context unknown: no attention op)"}
        plan.shape[p] = shape
