"""Did the change do what its rule predicted? Findings from a before/after ``Comparison`` (pure).

The rules register in ``roofline.verdicts.findings``, scope ``change`` (a ``Comparison``), in this order;
``roofline.verdicts.diagnosis.change_findings`` runs them for a compare result (``roofline diagnose
OUT/compare.json``, or ``roofline diagnose AFTER --baseline BEFORE``); a comparison with a side measured on a
busy host gets ``compare-noisy`` and its summary only:

* ``change-summary``   what changed between the files (``Comparison.changed``) and how many ops
                       and steps moved beyond the noise (``roofline.verdicts.change``'s rule).
* ``<change>-effect``  per phase: the step's bytes and FLOPs before/after, the time the roofline
                       predicts for it (``Step.predicted_s``: max(FLOPs / peak, bytes / bandwidth)
                       summed over its ops) and the time measured. The rule is named for the
                       change (``RULES``): weight quantization predicts decode bytes down by the
                       weights' shrink and the weight-bound decode step down with them, prefill
                       (compute-bound) about unchanged. A step did what was predicted when it moved
                       beyond the noise the predicted way and realised at least ``REALISED`` of the
                       predicted gain; "partly" when it moved less; "not" when it did not move.
* ``change-regressions`` ops that got slower beyond the noise, the largest losses first.
* ``change-unmatched`` points only in one file, or skipped in one.
* ``change-latency``   per latency configuration, the TTFT / TPOT / ITL percentiles that moved.
* ``dequant-bound``    (weight quantization) quantized decode linears whose measured speed-up falls short
                       of what their bytes predict: the kernel spends its time dequantizing, not reading.

One file holding a float and a quantized run of the same workload (``roofline profile --weight-dtype
fp32,int8``) is the same comparison inside one file: ``in_file_comparisons`` splits it by weight (and
KV-cache) dtype and hands the halves to ``roofline.verdicts.comparison.compare``; ``measured_effect_findings``
quotes the effect on decode ("decode bytes 0.53x, step time 0.61x at batch 1; at batch 64 bytes 0.71x,
step time 0.90x: no longer weight-bound"), per backend, beside the rule's verdict and the dequant-bound
warning. It registers in scope ``run`` (order 30), so ``roofline diagnose`` prints them for such a file.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .. import units as U
from ..errors import RooflineError
from ..stats import median
from .change import FASTER, MIN_CHANGE, SAME, SLOWER
from .comparison import Comparison, compare
from .findings import DOMINANT, Finding, register

REALISED = 0.5   # half the predicted gain: kernels rarely reach the roof, but a change that realises less than
#                  half of what the cost model promised is missing something (an unfused dequantize, a new launch)

# changed key field -> (rule name, what the change is called, what its rule predicts)
RULES = {
    "weight_dtype": ("weight-quantization", "Weight quantization",
                     "decode reads every weight each step, so its bytes fall with the weights' element size and the "
                     "weight-bound decode step with them; prefill is compute-bound and should barely move"),
    "kv_dtype": ("kv-quantization", "KV-cache quantization",
                 "decode attention reads the whole KV cache each step: its bytes, and long-context decode steps, "
                 "fall with the cache's element size"),
    "dtype": ("compute-dtype", "A new compute dtype",
              "tensor-core ops run against that dtype's peak and move its element size: compute-bound prefill "
              "follows the peak, memory-bound decode the bytes"),
    "backend": ("backend-change", "The backend change",
                "the same FLOPs and bytes on other kernels: the roofline predicts no change; any move is the "
                "kernels' efficiency"),
    "tp": ("tensor-parallel", "The tensor-parallel change",
           "each rank moves its share of the weights and FLOPs, plus collectives off the HBM roof"),
}
SAME_WORKLOAD = ("same-workload", "The change",
                 "the files run the same ops with the same costs, so the roofline predicts no change: any move is "
                 "the kernels, the software or the system")


def _factor(r: float, noun: str) -> str:
    """'bytes down 1.94x' / 'bytes up 1.20x' / 'bytes unchanged'."""
    if math.isnan(r):
        return f"{noun} n/a"
    if abs(r - 1) < 0.005:
        return f"{noun} unchanged"
    return f"{noun} down {r:.2f}x" if r > 1 else f"{noun} up {1 / r:.2f}x"


def _span(xs, noun: str) -> str:
    """'step time down 1.63x' for one value, 'step time down 1.08-1.63x (median 1.57x)' for several."""
    xs = sorted(x for x in xs if not math.isnan(x))
    if not xs:
        return f"{noun} n/a"
    if len(xs) == 1 or math.isclose(xs[0], xs[-1], rel_tol=0.005):
        return _factor(xs[0], noun)
    m = median(xs)
    lo, hi = xs[0], xs[-1]
    if lo >= 1:
        return f"{noun} down {lo:.2f}-{hi:.2f}x (median {m:.2f}x)"
    if hi <= 1:
        return f"{noun} up {1 / hi:.2f}-{1 / lo:.2f}x (median {1 / m:.2f}x)"
    return f"{noun} {lo:.2f}-{hi:.2f}x of before (median {m:.2f}x; > 1 is down)"


AGAINST = "against prediction"


def step_outcome(s) -> str:
    """"as predicted", "partly", "not", "against prediction" (or "not comparable") for one StepChange.

    Against prediction, always: a step that moved beyond the noise the other way than predicted, or that moved
    when its cost predicted no change, or that was predicted slower and ended slower still by more than the noise
    (its whole speed-up range under the prediction, and under ``1 - MIN_CHANGE`` of it) -- a 20x slowdown against
    a predicted 0.9x is not "as predicted" for having the same sign. A predicted gain realised in part is "partly".
    """
    if not s.comparable:
        return "not comparable"
    pred, got, v = s.predicted_speedup, s.time.speedup, s.time.verdict
    _, hi = s.time.interval                   # speed-up range from both sides' p20-p80
    if math.isnan(pred) or abs(pred - 1) < MIN_CHANGE:
        return "as predicted" if v == SAME else AGAINST
    want = FASTER if pred > 1 else SLOWER
    if v == SAME:
        return "not"
    if v != want or (want == SLOWER and hi < pred and got < pred * (1 - MIN_CHANGE)):
        return AGAINST                          # the other way, or slower still than a predicted slowdown
    realised = (got - 1) / (pred - 1)
    return "as predicted" if realised >= REALISED else "partly"


def _rule(c: Comparison) -> tuple:
    for k in ("weight_dtype", "kv_dtype", "dtype", "backend", "tp"):
        if k in c.changed:
            return RULES[k]
    return SAME_WORKLOAD


def compare_noisy(c: Comparison, src: str = "") -> Finding:
    """``compare-noisy``: a side was measured on a busy host; nothing is judged on its times."""
    return Finding("compare-noisy", c.noise_note, "; ".join(
        f"{w}: {a.noise_note}" for w, a in (("before", c.before), ("after", c.after)) if a.noise_note),
        "measure both runs again when the machine is quiet", src)


# ---------------------------------------------------------------- weight quantization: what the bytes promised

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
WEIGHT_BOUND = DOMINANT   # a step is weight-bound when half its time is in memory-bound linears


def short_fall(o) -> bool:
    """A decode linear, memory-bound before, whose measured speed-up realises under ``REALISED`` of the gain its
    bytes predict (before bytes / after bytes: a memory-bound op's time should follow its bytes)."""
    b, a = o.before, o.after
    if b.point.op not in LINEARS or b.point.phase != "decode" or b.label != "memory" or not a.point.cost.bytes:
        return False
    pred = b.point.cost.bytes / a.point.cost.bytes
    if pred < 1 + MIN_CHANGE:
        return False
    got = o.time.speedup
    return not math.isnan(got) and (got - 1) / (pred - 1) < REALISED


def _dequant_bound(c: Comparison, src: str):
    if "weight_dtype" not in c.changed:
        return None
    short = [o for o in c.ops if short_fall(o)]
    if not short:
        return None
    lin = [o for o in c.ops if o.before.point.op in LINEARS and o.before.point.phase == "decode"]
    short.sort(key=lambda o: o.time.speedup * o.after.point.cost.bytes / o.before.point.cost.bytes)
    _, new = c.changed["weight_dtype"]
    promise = lambda o: o.before.point.cost.bytes / o.after.point.cost.bytes  # noqa: E731
    ev = "; ".join(f"{o.title}: bytes {1 / promise(o):.2f}x, time {1 / o.time.speedup:.2f}x (the bytes predict "
                   f"{promise(o):.2f}x faster)" for o in short[:4])
    impl = {o.after.m.config.get("impl") for o in short} - {None}
    if impl:
        ev += f"; kernel: {', '.join(sorted(impl))}"
    return Finding("dequant-bound", f"{len(short)} of {len(lin)} {new} decode linears run slower than their bytes "
                   f"predict: a dequantization-bound kernel (the speed-up realises under {REALISED:.0%} of the "
                   "bytes' promise).", ev,
                   "the kernel spends its time unpacking and converting weights, not reading them: use a kernel that "
                   "dequantizes in registers on the tensor-core path (the triton backend on a GPU), 16-bit "
                   "activations (torch's CPU int8 GEMM is fast only for bf16/fp16), or keep these layers in the float "
                   "dtype", src, {"ops": [o.title for o in short]})


def in_file_comparisons(rf) -> list:
    """[(field, Comparison)]: for weight_dtype and kv_dtype, each quantized value against the float run (the
    activation dtype) of the same file, when the file holds both (``roofline.verdicts.comparison.compare`` on its halves)."""
    out = []
    ms = rf.measurements
    for name in ("weight_dtype", "kv_dtype"):
        parts: dict = {}
        for m in ms:
            parts.setdefault(getattr(m.point, name) if getattr(m.point, name) != m.point.dtype else "", []).append(m)
        if "" not in parts or len(parts) < 2:
            continue
        base = replace(rf, measurements=parts.pop(""), _analysis=None)
        for v, sub in sorted(parts.items(), key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else 9, kv[0])):
            try:
                out.append((name, compare(base, replace(rf, measurements=sub, _analysis=None))))
            except RooflineError:
                continue
    return out


def measured_effect_findings(rf, src: str = "") -> list:
    """For a file holding a float and a quantized run of one workload: the measured effect on decode per backend
    (``*-measured``), then the rule's verdict per phase (``*-effect``) and the dequant-bound warning."""
    out = []
    for name, c in in_file_comparisons(rf):
        if name not in c.changed:
            continue
        rule, label, _ = RULES[name]
        backends = sorted({s.after.backend for s in c.steps})
        for backend in backends:
            f = _quoted_effect(c, name, label, rule, backend if len(backends) > 1 else "", src)
            if f:
                out.append(f)
        out += [f for f in _effects(c, src) + [_dequant_bound(c, src)] if f]
    return out


def _quoted_effect(c: Comparison, name: str, label: str, rule: str, backend: str, src: str):
    """"decode bytes 0.53x, step time 0.61x at batch 1; at batch 64 bytes 0.71x, step time 0.90x: no longer
    weight-bound" (after / before), at the context holding the most decode batches."""
    ss = [s for s in c.steps if s.phase == "decode" and s.comparable and (not backend or s.after.backend == backend)]
    if not ss:
        return None
    by_ctx: dict = {}
    for s in ss:
        by_ctx.setdefault(s.after.context, []).append(s)
    ctx = max(by_ctx, key=lambda k: (len(by_ctx[k]), -k))
    row = sorted(by_ctx[ctx], key=lambda s: s.after.batch)
    lo, hi = row[0], row[-1]

    def b(s):
        return 1 / s.bytes_ratio if s.bytes_ratio else math.nan

    def t(s):
        return 1 / s.time.speedup if s.time.speedup else math.nan

    def weight_bound(s):
        return s.before.weight_memory_share >= WEIGHT_BOUND

    old, new = c.changed[name]
    on = f", {backend}" if backend else ""
    claim = (f"{label} measured in this file ({FIELD[name]} {old} -> {new}{on}): decode bytes {b(lo):.2f}x, step time "
             f"{t(lo):.2f}x at batch {lo.after.batch}" + ("" if weight_bound(lo) else ": not weight-bound"))
    if hi is not lo:
        claim += (f"; at batch {hi.after.batch} bytes {b(hi):.2f}x, step time {t(hi):.2f}x"
                  + (": still weight-bound" if weight_bound(hi) else ": no longer weight-bound"))
    claim += f" (context {ctx:,})."
    predicted = ", ".join(f"{1 / s.predicted_speedup:.2f}x at b{s.after.batch}" for s in row)
    shares = ", ".join(f"{100 * s.before.weight_memory_share:.0f}% at b{s.after.batch}" for s in row)
    ev = (f"after / before per decode step, both runs in this file; the roofline predicted step time {predicted}; "
          f"share of the {old} step in memory-bound linears: {shares}")
    pf = [1 / s.time.speedup for s in c.steps if s.phase == "prefill" and s.comparable and s.time.speedup
          and (not backend or s.after.backend == backend)]
    if pf:
        ev += f"; prefill step time {min(pf):.2f}-{max(pf):.2f}x of before"
    return Finding(f"{rule}-measured", claim, ev, "", src,
                   {"field": name, "before": old, "after": new, "context": ctx, "backend": backend or None,
                    "steps": [{"batch": s.after.batch, "bytes_ratio": b(s), "time_ratio": t(s),
                               "predicted_ratio": 1 / s.predicted_speedup if s.predicted_speedup else math.nan,
                               "weight_bound_before": weight_bound(s)} for s in row]})


FIELD = {"weight_dtype": "weights", "kv_dtype": "KV cache"}
ORDER = ("fp8", "int8", "int4")   # the quantized runs of a file, the larger element first


def summary(c: Comparison, src: str = "") -> Finding:
    b, a = c.before.rf.path, c.after.rf.path
    what = c.change_text or "no recorded setting (the same sweep: kernels, software or system changed)"
    counts = {v: sum(o.time.verdict == v for o in c.ops) for v in (FASTER, SLOWER, SAME)}
    steps = {v: sum(s.verdict == v for s in c.steps) for v in (FASTER, SLOWER, SAME)}
    claim = f"{a} against {b}: changed {what}"
    if not c.judged:          # a side ran on a busy host: no count of faster or slower, as the tables and chart say
        return Finding("change-summary", claim + f"; {len(c.ops)} op(s), {len(c.steps)} step(s) and "
                       f"{len(c.latency)} latency percentile(s) matched, not judged (host-busy).",
                       "a side was measured on a busy machine: its times moved with the load", "", src,
                       {"changed": {k: list(v) for k, v in c.changed.items()},
                        "settings": {k: list(v) for k, v in c.settings.items()}})
    if c.ops:
        claim += (f"; {counts[FASTER]} op(s) faster, {counts[SLOWER]} slower, {counts[SAME]} unchanged of "
                  f"{len(c.ops)} matched")
    if c.steps:
        claim += f"; steps: {steps[FASTER]} faster, {steps[SLOWER]} slower, {steps[SAME]} unchanged of {len(c.steps)}"
    if c.latency:
        moved = sum(x.change.verdict in (FASTER, SLOWER) for x in c.latency)
        claim += (f"; {moved} of {len(c.latency)} latency percentiles moved over "
                  f"{len({x.config for x in c.latency})} configuration(s)")
    claim += "."
    ev = ("speed-up = before / after time per step, its range from both files' p20-p80 samples; inside that range, "
          f"or under {MIN_CHANGE:.0%}, is no change")
    return Finding("change-summary", claim, ev, "", src, {"changed": {k: list(v) for k, v in c.changed.items()},
                                                          "settings": {k: list(v) for k, v in c.settings.items()}})


def _effects(c: Comparison, src: str) -> list:
    rule, name, predicts = _rule(c)
    out = []
    for phase in ("prefill", "decode"):
        ss = [s for s in c.steps if s.phase == phase and s.comparable]
        if not ss:
            continue
        outcome = [step_outcome(s) for s in ss]
        n_ok, n_against = outcome.count("as predicted"), outcome.count(AGAINST)
        if n_against:
            did = (f"went against its prediction at {n_against} of {len(ss)} steps"
                   + (f" (as predicted at {n_ok})" if n_ok else ""))
        elif n_ok == len(ss):
            did = "did what its rule predicted"
        elif n_ok or outcome.count("partly"):
            did = f"did what its rule predicted at {n_ok} of {len(ss)} steps"
        else:
            did = "did not do what its rule predicted"
        what = f" ({c.change_text})" if c.change_text else ""
        claim = (f"{name}{what} {did} in {phase}: {_span([s.bytes_ratio for s in ss], 'bytes')}, "
                 f"{_span([s.time.speedup for s in ss], 'step time')} (the roofline predicted "
                 f"{_span([s.predicted_speedup for s in ss], 'step time').removeprefix('step time ')}).")
        worst = min(ss, key=lambda s: s.time.speedup / s.predicted_speedup if s.predicted_speedup else math.inf)
        ev = (f"rule: {predicts}. {len(ss)} matched {phase} steps; "
              f"{_span([s.flops_ratio for s in ss], 'FLOPs')}; roof fraction (median) "
              f"{U.percent(median([s.before.roof_fraction for s in ss]))} -> "
              f"{U.percent(median([s.after.roof_fraction for s in ss]))}; furthest from its prediction: "
              f"{worst.title}, {worst.time.ratio_text} against {worst.predicted_speedup:.2f}x predicted")
        action = ""
        flat = all(abs(s.predicted_speedup - 1) < MIN_CHANGE for s in ss)
        if n_ok < len(ss) and flat:
            action = ("a step moved although its cost did not: the ops that moved (change-regressions, the comparison "
                      "table) explain it")
        elif n_ok < len(ss):
            action = ("the kernels did not turn the cost change into time: compare the slowest ops' roof fractions "
                      "before and after (an unfused dequantize or a slower kernel path), and check the steps marked "
                      "'partly' or 'not' in the comparison table")
        out.append(Finding(f"{rule}-effect", claim, ev, action, src,
                           {"phase": phase, "steps": len(ss), "as_predicted": n_ok,
                            "partly": outcome.count("partly"), "not": outcome.count("not"),
                            "against": n_against}))
    return out


def _regressions(c: Comparison, src: str):
    slow = sorted((o for o in c.ops if o.time.verdict == SLOWER), key=lambda o: o.time.saved)
    if not slow:
        return None
    top = "; ".join(f"{o.title} {o.time.ratio_text}, {U.seconds(-o.time.saved)} more per step" for o in slow[:5])
    return Finding("change-regressions", f"{len(slow)} op(s) got slower beyond the noise.",
                   top + (f"; and {len(slow) - 5} more" if len(slow) > 5 else ""),
                   "look at what changed in these kernels (their shapes, configs, dtypes) before keeping the change",
                   src, {"ops": [o.title for o in slow]})


def _unmatched(c: Comparison, src: str):
    parts = []
    if c.only_before:
        parts.append(f"{len(c.only_before)} only before ({_names(c.only_before)})")
    if c.only_after:
        parts.append(f"{len(c.only_after)} only after ({_names(c.only_after)})")
    if c.skipped:
        parts.append(f"{len(c.skipped)} skipped on one side ({_names([b if not b.ok else a for _, b, a in c.skipped])})")
    if not parts:
        return None
    return Finding("change-unmatched", "Some points could not be compared: " + "; ".join(parts) + ".",
                   "a point is compared only when both files measured it (same op, phase, batch, context, backend, "
                   "dtypes, tp)", "", src)


def _names(rs) -> str:
    s = ", ".join(f"{r.point.phase} {r.op} b{r.point.batch} c{r.point.context}" for r in rs[:4])
    return s + (" ..." if len(rs) > 4 else "")


def _latency(c: Comparison, src: str) -> list:
    out = []
    for cfg in dict.fromkeys(x.config for x in c.latency):
        rows = [x for x in c.latency if x.config == cfg]
        moved = [x for x in rows if x.change.verdict in (FASTER, SLOWER)]
        tag = f"[{cfg}] " if cfg else ""
        if moved:
            claim = tag + "; ".join(f"{x.metric} {x.pct} {U.ms(x.change.before)} -> {U.ms(x.change.after)} "
                                    f"({x.change.ratio_text})" for x in moved) + "."
        else:
            claim = tag + "No latency percentile moved beyond the noise."
        still = [f"{x.metric} {x.pct}" for x in rows if x.change.verdict not in (FASTER, SLOWER)]
        ev = (f"{rows[0].n_before} -> {rows[0].n_after} requests; each percentile's range is p20-p80 of where it "
              "lies given the requests (an upper bound for p90 needs 16 values, for p99 161)")
        if still:
            ev += f"; unchanged or unbounded: {', '.join(still)}"
        out.append(Finding("change-latency", claim, ev, "", src))
    return out


register("run", "measured-effect", lambda rf, a, src="": measured_effect_findings(rf, src), order=30)
register("change", "change-summary", summary, order=10)
register("change", "change-effect", _effects, order=20)
register("change", "dequant-bound", _dequant_bound, order=30)
register("change", "change-regressions", _regressions, order=40)
register("change", "change-unmatched", _unmatched, order=50)
register("change", "change-latency", _latency, order=60)
