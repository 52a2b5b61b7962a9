"""Before and after: two result files of one workload, matched point by point (pure).

    from roofline.records import read_results
    from roofline.verdicts.comparison import compare
    c = compare(read_results("before.jsonl"), read_results("after.jsonl"))
    for s in c.steps:                    # largest move first
        print(s.title, s.time.text)      # "Decode at batch 8, context 1,024: 1.52x faster [1.50-1.54x]"
    [o.title for o in c.flagged]         # ops that moved beyond the noise

Both files are read once, through ``roofline.analysis.analyze`` (latency files through
``roofline.latency.latency_runs``, in ``roofline.verdicts.latency_change``): nothing here re-derives a
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
* Refusals: files from different devices or of different models (``roofline.verdicts.same_setup``, the
  rule ``diagnose`` follows too), or of different kinds (profile, trace, latency), are refused with a
  one-line ``RooflineError`` unless ``across_models``; then ``notes`` says what differs, first. Points
  only in one file, and points skipped in one of them, are listed, never compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis import RunAnalysis, analyze
from ..errors import RooflineError
from ..records import KEY_FIELDS, STEP_FIELDS
from .change import NOT_JUDGED, SAME, Change, time_change
from .latency_change import latency_changes
from .same_setup import ACROSS_FLAG, check_same_setup, setup_of

# points match by the point key (``roofline.records.KEY_FIELDS``) less the model and new_tokens (it follows from the
# phase and the context); steps by the step key
POINT_FIELDS = tuple(f for f in KEY_FIELDS if f not in ("model", "new_tokens"))
TRACE_FIELDS = ("op", "phase")                 # a traced op's name is "aten::mm [8,4096]x[4096,4096]": op and shape
CHANGE_FIELDS = ("backend", "dtype", "weight_dtype", "kv_dtype", "tp", "ep")   # what a change under test may switch
FIELD_NAMES = {"backend": "backend", "dtype": "activation dtype", "weight_dtype": "weights", "kv_dtype": "KV cache",
               "tp": "tensor-parallel ranks", "ep": "expert-parallel ranks"}


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
    latency: list = field(default_factory=list)             # roofline.verdicts.latency_change.LatencyChange
    notes: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)            # recorded setting -> (before, after): every one differing

    @property
    def flagged(self) -> list:
        """Ops that moved beyond the noise."""
        return [o for o in self.ops if o.time.verdict != SAME]

    @property
    def noise_note(self) -> str:
        """'' when both runs were quiet; else which side was measured on a busy host (``RunAnalysis.noisy``):
        such a comparison is said first and not judged (``roofline.verdicts.change_rules``)."""
        sides = [w for w, a in (("before", self.before), ("after", self.after)) if a.noisy]
        if not sides:
            return ""
        return (f"The {' and the '.join(sides)} run{'s were' if len(sides) > 1 else ' was'} measured on a busy "
                "machine (host-busy: other processes took the CPUs), so the times moved with the load, not only with "
                "the change: this comparison is not judged. Measure both again on a quiet machine.")

    @property
    def judged(self) -> bool:
        """False when a side was measured on a busy host (``noise_note``): no change in it is judged."""
        return not self.noise_note

    def verdict_of(self, change: Change) -> str:
        """What every table and chart says of one of its changes: its ``Change.verdict``, or "not judged"."""
        return change.verdict if self.judged else NOT_JUDGED

    @property
    def change_text(self) -> str:
        """'weights bf16 -> int8', then every recorded setting that differs ('threads 2 -> 1, requests 8 -> 4'); ''
        when both files ran the same configuration."""
        fields_ = [f"{FIELD_NAMES.get(k, k)} {b} -> {a}" for k, (b, a) in self.changed.items()]
        settings = [f"{k} {setting_text(b)} -> {setting_text(a)}" for k, (b, a) in self.settings.items()]
        return ", ".join(fields_ + settings)


# header settings that describe rather than set a run (a text on how times are taken): never a difference
DESCRIPTIVE_SETTINGS = ("timestamps",)


def differing_settings(settings) -> tuple:
    """The recorded settings (``RunHeader.settings`` dicts) whose values are not the same in all of ``settings``,
    in first-seen order; a setting one header lacks differs from one that records it."""
    keys = list(dict.fromkeys(k for st in settings for k in st if k not in DESCRIPTIVE_SETTINGS))
    missing = object()
    return tuple(k for k in keys if len({repr(st.get(k, missing)) for st in settings}) > 1)


SETTING_TEXT = 60   # characters of one setting's value in a sentence (an op list is long)


def setting_text(v) -> str:
    """A recorded setting's value in a sentence: '1,4,16' for a list, 'absent' for a setting not recorded."""
    if v is None:
        return "absent"
    t = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return t if len(t) <= SETTING_TEXT else t[:SETTING_TEXT - 3] + "..."


def changed_settings(before, after, changed: dict) -> dict:
    """{setting: (before, after)} for every recorded header setting (``RunHeader.settings``) that differs, less the
    ones that only restate a key field of ``changed`` (``backends ['torch'] -> ['triton']`` beside backend)."""
    sb, sa = before.header.settings, after.header.settings
    out = {}
    for k in differing_settings([sb, sa]):
        b, a = sb.get(k), sa.get(k)
        one = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v,)  # noqa: E731
        if any(one(b) == (x,) and one(a) == (y,) for x, y in changed.values()):
            continue
        out[k] = (b, a)
    return out


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


def check_comparable(before: RunAnalysis, after: RunAnalysis, across_models: bool = False) -> list:
    """Notes on what differs between the files; RooflineError unless ``across_models`` when models or devices
    differ (``roofline.verdicts.same_setup``, the rule ``diagnose`` follows too) or kinds do."""
    notes = check_same_setup([setup_of(before.rf), setup_of(after.rf)], across_models=across_models,
                             what="compared as a before/after of one change")
    hb, ha = before.header, after.header
    if hb.kind != ha.kind:
        diff = f"{before.rf.path} is a {hb.kind} file and {after.rf.path} a {ha.kind} file"
        if not across_models:
            raise RooflineError(f"{diff}: that is not a before/after of one change. Pass {ACROSS_FLAG} if the "
                                "comparison is intended.")
        notes.append(f"{diff[0].upper() + diff[1:]} (compared as asked: {ACROSS_FLAG}).")
    return notes


def _key(r, fields) -> tuple:
    p = r.point
    return tuple(getattr(p, f) for f in fields) + (r.m.rank,)


def _step_key(s, fields) -> tuple:
    return tuple(getattr(s.key, f) for f in fields)


def compare(before, after, *, across_models: bool = False) -> Comparison:
    """Match ``after`` against ``before`` (``ResultFile``s or their analyses); see the module docstring."""
    b, a = analyze(before), analyze(after)
    notes = check_comparable(b, a, across_models)
    for side, x in (("BEFORE", b), ("AFTER", a)):    # what each reader says (a cut last line), as diagnose does
        notes += [f"{side}: {n}" for n in getattr(x.rf, "notices", ()) if f"{side}: {n}" not in notes]
    changed = changed_fields(b, a)
    settings = changed_settings(b, a, changed)
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
                      steps_only_after, latency, notes, settings)
