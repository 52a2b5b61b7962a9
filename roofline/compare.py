"""Before and after: two result files of one workload, matched point by point (pure).

    from roofline.records import read_results
    from roofline.compare import compare
    c = compare(read_results("before.jsonl"), read_results("after.jsonl"))
    for s in c.steps:                    # largest move first
        print(s.title, s.time.text)      # "Decode at batch 8, context 1,024: 1.52x faster [1.50-1.54x]"
    [o.title for o in c.flagged]         # ops that moved beyond the noise

Both files are read once, through ``roofline.analysis.analyze`` (latency files through
``roofline.latency.latency_runs``, in ``roofline.compare_latency``): nothing here re-derives a
time, a cost or a verdict; it pairs them.

* Matching. A profile point is matched by op, phase, batch, context, cached prefix, backend,
  dtypes (activation, weight, KV), tp and rank; a trace's by phase, op and shape (a traced op's
  name carries its shapes) and rank. A key field that takes one value in each file, and
  different values across them, is *the change under test* (``Comparison.changed``, e.g.
  weight_dtype bf16 -> int8, backend torch -> triton): it is dropped from the key, so int8
  weights still meet their bf16 counterparts. Steps (``roofline.analysis.Step``) are matched the
  same way; a trace's by phase.
* Speed-up = before time / after time, per step (count x instance time), so > 1 is faster.
  Its interval is [before low / after high, before high / after low], each side's (low, high)
  being its samples' p20-p80 (``OpResult.time_range``; a step's sums its ops'). A change is
  reported as "no change" when that interval holds 1, or when it is under ``MIN_CHANGE``.
* Refusals: files from different devices, of different models or of different kinds (profile,
  trace, latency) are refused with a one-line ``RooflineError`` unless ``allow_different``;
  then ``notes`` says what differs. Points only in one file, and points skipped in one of them,
  are listed, never compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import units as U
from .analysis import RunAnalysis, analyze
from .errors import RooflineError

MIN_CHANGE = 0.03   # run-to-run drift of a GPU (clocks, temperature, placement) is a few percent even when each
#                     run's repetitions agree: a move under 3% is not a change two runs can claim
FASTER, SLOWER, SAME = "faster", "slower", "no change"
UNBOUNDED = "too few samples"   # a range with no bound on one side (a p99 of 8 requests): no claim either way

POINT_FIELDS = ("op", "phase", "batch", "context", "cached", "backend", "dtype", "weight_dtype", "kv_dtype", "tp",
                "ep")
TRACE_FIELDS = ("op", "phase")                 # a traced op's name is "aten::mm [8,4096]x[4096,4096]": op and shape
STEP_FIELDS = ("phase", "backend", "batch", "context", "cached", "dtype", "weight_dtype", "kv_dtype", "tp", "ep")
CHANGE_FIELDS = ("backend", "dtype", "weight_dtype", "kv_dtype", "tp", "ep")   # what a change under test may switch
FIELD_NAMES = {"backend": "backend", "dtype": "activation dtype", "weight_dtype": "weights", "kv_dtype": "KV cache",
               "tp": "tensor-parallel ranks", "ep": "expert-parallel ranks"}


# ---------------------------------------------------------------- one number, before and after

@dataclass(frozen=True)
class Change:
    """A time (or latency) before and after, each with its (low, high) noise range, in seconds."""

    before: float
    after: float
    before_range: tuple
    after_range: tuple

    @property
    def speedup(self) -> float:
        """before / after: 2.0 is twice as fast, 0.5 twice as slow."""
        return self.before / self.after if self.after > 0 else math.nan

    @property
    def interval(self) -> tuple:
        """(low, high) of the speed-up from both sides' ranges: [before low / after high, before high / after low]."""
        (bl, bh), (al, ah) = self.before_range, self.after_range
        return (bl / ah if ah > 0 else math.nan, bh / al if al > 0 else math.inf)

    @property
    def saved(self) -> float:
        """Seconds saved (negative: lost)."""
        return self.before - self.after

    @property
    def bounded(self) -> bool:
        return all(math.isfinite(v) for v in self.before_range + self.after_range)

    @property
    def verdict(self) -> str:
        """"faster" / "slower" beyond the noise, else "no change"; "too few samples" when a moved estimate
        has an unbounded range (``roofline.stats.quantile_interval``)."""
        x = self.speedup
        if math.isnan(x) or abs(x - 1) < MIN_CHANGE:
            return SAME
        if not self.bounded:
            return UNBOUNDED
        lo, hi = self.interval
        if lo <= 1 <= hi:
            return SAME
        return FASTER if x > 1 else SLOWER

    @property
    def ratio_text(self) -> str:
        """'2.00x faster [1.96-2.04x]', '2.00x slower [1.98-2.02x]' or 'no change (1.01x, 0.98-1.03x)'."""
        x = self.speedup
        if math.isnan(x):
            return "n/a"
        lo, hi = self.interval
        rng = f"{lo:.2f}-{hi:.2f}x"
        v = self.verdict
        if v == UNBOUNDED:
            est = f"{x:.2f}x faster" if x > 1 else f"{1 / x:.2f}x slower"
            return f"too few samples (estimate {est}, its range unbounded)"
        if not self.bounded:
            return f"no change ({x:.2f}x)"
        if v == SAME:
            return f"no change ({x:.2f}x, {rng})"
        return f"{x:.2f}x faster [{rng}]" if v == FASTER else f"{1 / x:.2f}x slower [{1 / hi:.2f}-{1 / lo:.2f}x]"

    @property
    def text(self) -> str:
        return f"{U.seconds(self.before)} -> {U.seconds(self.after)}: {self.ratio_text}"


def time_change(before, after) -> Change:
    """The per-step time of two OpResults or two Steps, with their p20-p80 ranges."""
    return Change(before.time_s, after.time_s, before.time_range, after.time_range)


# ---------------------------------------------------------------- matched ops and steps

@dataclass(frozen=True)
class OpChange:
    key: tuple          # the matching key (``Comparison.point_fields`` values, then rank)
    before: object      # roofline.analysis.OpResult
    after: object
    time: Change        # per step: count x instance time

    @property
    def title(self) -> str:
        p = self.after.point
        return f"{p.phase} {p.op} b{p.batch} c{p.context}" + (f" {p.backend}" if p.backend != "torch" else "")


@dataclass(frozen=True)
class StepChange:
    key: tuple
    before: object      # roofline.analysis.Step
    after: object
    time: Change
    ops: tuple          # OpChange of this step
    only_before: tuple  # op names measured in the before step only
    only_after: tuple

    @property
    def title(self) -> str:
        return self.after.title

    @property
    def comparable(self) -> bool:
        """Both steps sum the same ops (an op skipped or missing on one side makes their times unlike)."""
        return not self.only_before and not self.only_after

    @property
    def verdict(self) -> str:
        return self.time.verdict if self.comparable else "not comparable"

    @property
    def phase(self) -> str:
        return self.after.phase

    @property
    def bytes_ratio(self) -> float:
        """before bytes / after bytes of the summed step cost: 2.0 = half the bytes moved."""
        return self.before.cost.bytes / self.after.cost.bytes if self.after.cost.bytes else math.nan

    @property
    def flops_ratio(self) -> float:
        return self.before.cost.flops / self.after.cost.flops if self.after.cost.flops else math.nan

    @property
    def predicted_speedup(self) -> float:
        """What the roofline predicts: before step time at the roof / after step time at the roof."""
        return self.before.predicted_s / self.after.predicted_s if self.after.predicted_s > 0 else math.nan


@dataclass
class Comparison:
    before: RunAnalysis
    after: RunAnalysis
    changed: dict                  # field -> (before value, after value): the change under test
    point_fields: tuple            # the fields points were matched by
    ops: list                      # OpChange, largest |time saved per step| first
    steps: list                    # StepChange, largest |time saved per step| first
    only_before: list              # OpResult with no match in after
    only_after: list
    skipped: list                  # (key, before OpResult, after OpResult): not ok on one side
    steps_only_before: list = field(default_factory=list)   # Step
    steps_only_after: list = field(default_factory=list)
    latency: list = field(default_factory=list)             # roofline.compare_latency.LatencyChange
    notes: list = field(default_factory=list)

    @property
    def flagged(self) -> list:
        """Ops that moved beyond the noise."""
        return [o for o in self.ops if o.time.verdict != SAME]

    @property
    def noise_note(self) -> str:
        """'' when both runs were quiet; else which side was measured on a busy host (``RunAnalysis.noisy``):
        such a comparison is said first and not judged (``roofline.compare_rules``)."""
        sides = [w for w, a in (("before", self.before), ("after", self.after)) if a.noisy]
        if not sides:
            return ""
        return (f"The {' and the '.join(sides)} run{'s were' if len(sides) > 1 else ' was'} measured on a busy "
                "machine (host-busy: other processes took the CPUs), so the times moved with the load, not only with "
                "the change: this comparison is not judged. Measure both again on a quiet machine.")

    @property
    def change_text(self) -> str:
        """'weights bf16 -> int8' (or '' when both files ran the same configuration)."""
        return ", ".join(f"{FIELD_NAMES.get(k, k)} {b} -> {a}" for k, (b, a) in self.changed.items())


def _is_trace(a: RunAnalysis) -> bool:
    return a.header.kind == "trace"


def _values(results, name: str) -> set:
    return {getattr(r.point, name) for r in results}


def changed_fields(before: RunAnalysis, after: RunAnalysis) -> dict:
    """Key fields with one value in each file and different values across them (see the module docstring)."""
    out = {}
    for name in CHANGE_FIELDS:
        b, a = _values(before.results, name), _values(after.results, name)
        if len(b) == 1 and len(a) == 1 and b != a:
            out[name] = (next(iter(b)), next(iter(a)))
    return out


def check_comparable(before: RunAnalysis, after: RunAnalysis, allow_different: bool = False) -> list:
    """Notes on what differs between the files; RooflineError unless ``allow_different`` when devices, models
    or kinds differ."""
    hb, ha = before.header, after.header
    nb, na = before.rf.path, after.rf.path
    diffs = []
    if hb.device.name != ha.device.name:
        diffs.append(f"{nb} ran on {hb.device.name} and {na} on {ha.device.name}")
    if hb.model_name != ha.model_name:
        diffs.append(f"{nb} profiles {hb.model_name} and {na} {ha.model_name}")
    if hb.kind != ha.kind:
        diffs.append(f"{nb} is a {hb.kind} file and {na} a {ha.kind} file")
    if diffs and not allow_different:
        raise RooflineError("; ".join(diffs) + ": that is not a before/after of one change. Pass --allow-different "
                            "if the comparison is intended.")
    return [d[0].upper() + d[1:] + " (compared as asked: --allow-different)." for d in diffs]


def _key(r, fields) -> tuple:
    p = r.point
    return tuple(getattr(p, f) for f in fields) + (r.m.rank,)


def _step_key(s, fields) -> tuple:
    return tuple(getattr(s.key, f) for f in fields)


def compare(before, after, *, allow_different: bool = False) -> Comparison:
    """Match ``after`` against ``before`` (``ResultFile``s or their analyses); see the module docstring."""
    from .compare_latency import latency_changes

    b, a = analyze(before), analyze(after)
    notes = check_comparable(b, a, allow_different)
    for side, x in (("BEFORE", b), ("AFTER", a)):    # what each reader says (a cut last line), as diagnose does
        notes += [f"{side}: {n}" for n in getattr(x.rf, "notices", ()) if f"{side}: {n}" not in notes]
    changed = changed_fields(b, a)
    trace = _is_trace(b) or _is_trace(a)
    pfields = tuple(f for f in (TRACE_FIELDS if trace else POINT_FIELDS) if f not in changed)
    sfields = tuple(f for f in (("phase",) if trace else STEP_FIELDS) if f not in changed)
    if changed:
        notes.append(f"The files differ in {', '.join(FIELD_NAMES.get(k, k) for k in changed)} throughout "
                     f"({', '.join(f'{x} -> {y}' for x, y in changed.values())}): that is taken as the change under "
                     "test, and points are matched without it.")
    after_by = {}
    for r in a.results:
        after_by.setdefault(_key(r, pfields), r)
    seen, ops, skipped, only_before = set(), [], [], []
    for r in b.results:
        k = _key(r, pfields)
        if k in seen:
            continue
        seen.add(k)
        o = after_by.get(k)
        if o is None:
            only_before.append(r)
        elif not (r.ok and o.ok) or r.off_roof or o.off_roof:
            if r.ok and o.ok:   # both kept off the roofline (uncosted, collectives): their times still compare
                ops.append(OpChange(k, r, o, time_change(r, o)))
            else:
                skipped.append((k, r, o))
        else:
            ops.append(OpChange(k, r, o, time_change(r, o)))
    only_after = [r for r in a.results if _key(r, pfields) not in seen]

    by_op = {id(o.before): o for o in ops}
    after_steps = {_step_key(s, sfields): s for s in a.steps}
    steps, steps_only_before, matched = [], [], set()
    for s in b.steps:
        k = _step_key(s, sfields)
        t = after_steps.get(k)
        if t is None:
            steps_only_before.append(s)
            continue
        matched.add(k)
        names_b, names_a = {r.op for r in s.ops}, {r.op for r in t.ops}
        mine = tuple(by_op[id(r)] for r in s.ops if id(r) in by_op)
        steps.append(StepChange(k, s, t, time_change(s, t), mine,
                                tuple(sorted(names_b - names_a)), tuple(sorted(names_a - names_b))))
    steps_only_after = [s for s in a.steps if _step_key(s, sfields) not in matched]
    ops.sort(key=lambda o: -abs(o.time.saved))
    steps.sort(key=lambda s: -abs(s.time.saved))
    latency = latency_changes(b.rf, a.rf, notes)
    if not ops and not steps and not latency:
        raise RooflineError(f"{b.rf.path} and {a.rf.path} have no point, step or latency configuration in common: "
                            "compare two runs of the same sweep (same ops, phases, batches and contexts).")
    return Comparison(b, a, changed, pfields, ops, steps, only_before, only_after, skipped, steps_only_before,
                      steps_only_after, latency, notes)
