"""Diagnosis rules for mixtures of experts (issue 21): ``expert-bound`` and ``expert-imbalance``.

On a trace (``roofline trace --model``) ``expert-imbalance`` reads the tokens per expert the trace's expert GEMMs
recorded (``roofline.traces.experts``, the header's ``experts``): summed per phase and MoE layer over the steps,
one expert at least ``IMBALANCE_MIN`` x the mean of the experts hit, where that mean is at least
``TRACE_MIN_MEAN`` tokens (so a uniform router's chance spread, about 1 + 2.1 / sqrt(mean), stays near 1.25x).

Registered in ``roofline.verdicts.findings``, scope ``backend`` at order 20 (after ``decode-batch``); the rules,
their evidence and thresholds are documented in ``roofline.verdicts.diagnosis``'s table. ``moe_decode_phase`` prices a step through the cost
model (the report's expert chart uses it too).
"""

from __future__ import annotations

from .. import explain   # read at call time: FULL_SHARE is a setting a caller may change
from .. import units as U
from ..bounds import MEMORY
from ..errors import RooflineError
from ..stats import median
from ..units import ms
from ..workload import decode
from .advice import advice
from .findings import DOMINANT, Finding, finding

IMBALANCE_MARGIN = 1.5   # the experts op 1.5x slower than its uniform-routing expectation: more than timing noise
IMBALANCE_MIN = 1.5      # one expert with 1.5x the mean tokens (of the experts touched): its blocks run longest
IMBALANCE_POINTS = 3     # the experts op's typical efficiency is a median: at least three points for one
TRACE_MIN_MEAN = 64      # a trace's counts: at least 64 tokens per expert hit before max/mean is judged


def moe_decode_phase(model, key, settings=None):
    """The cost model's decode ``Phase`` for a step's key (batch, context, dtypes, tp; int4 group size from the
    run's settings): what a MoE finding or figure prices the step with."""
    settings = settings or {}
    q = ({"group_size": settings.get("group_size"), "zero_point": bool(settings.get("zero_point"))}
         if key.weight_dtype == "int4" else {})
    return decode(model, key.batch, key.context, weight_dtype=key.weight_dtype, act_dtype=key.dtype,
                  kv_dtype=key.kv_dtype, tp=key.tp, **q)


def _experts_op(s):
    return next((r for r in s.ops if r.op == "experts"), None)


def _touched(r):
    """The distinct experts the point's own routing touched (the experts measurement's config), or None."""
    n = r.m.config.get("experts_touched")
    return int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 else None


@finding("backend", "expert", order=20)
def expert_findings(a, backend: str, several: bool = False, src: str = "") -> list:
    """``expert-bound`` and ``expert-imbalance`` for one backend's decode steps of a mixture of experts."""
    model = a.header.model
    if model is None or not model.n_experts:
        return []
    if a.header.kind == "trace":
        f = _trace_imbalance(a.header.settings.get("experts") or {}, src)
        return [f] if f else []
    ss = [s for s in a.phase_steps("decode", backend) if s.reliable and _experts_op(s) is not None]
    if not ss:
        return []
    on = f" ({backend})" if several else ""
    return [f for f in (_expert_bound(a, ss, on, src), _expert_imbalance(ss, on, src)) if f]


def _expert_bound(a, ss, on: str, src: str):
    model = a.header.model
    full = next((b for b in range(1, 1 << 16) if explain.phase_at_share(model, b) >= explain.FULL_SHARE), None)
    hit = []
    for s in ss:
        ex = _experts_op(s)
        share = ex.time_s / s.time_s if s.time_s > 0 else 0.0
        if ex.label == MEMORY and share >= DOMINANT and (full is None or s.batch < full):
            try:
                ph = moe_decode_phase(model, s.key, a.header.settings)
            except RooflineError:
                continue
            hit.append((s, ex, share, ph))
    if not hit:
        return None
    s, ex, share, ph = max(hit, key=lambda h: (h[0].batch, h[0].context))
    E = model.n_experts
    until = (f"every expert is loaded from batch {full:,}, after which batching reuses them" if full else
             "every expert is not loaded before batch 65,536")
    claim = (f"Decode{on} is bound by expert weights: at batch {s.batch} a step reads "
             f"{U.nbytes(ph.expert_weight_bytes)} of expert weights ({ph.experts_touched:.2f} of {E} experts per "
             f"layer); {until}.")
    parts = []
    for s_, ex_, sh_, ph_ in hit:
        n = _touched(ex_)
        parts.append(f"{s_.where}: experts op {100 * sh_:.0f}% of the step, {U.percent(ex_.roof_fraction)} of its "
                     f"roof, {U.nbytes(ph_.expert_weight_bytes)} of expert weights ({ph_.experts_touched:.2f} "
                     f"experts per layer expected" + (f", {n} touched by this point's routing)" if n else ")"))
    ev = ("memory-bound experts op over half the decode step, below the every-expert batch (uniform routing, "
          f"k = {model.n_active}, at least {explain.FULL_SHARE:.0%} of the experts per layer): " + "; ".join(parts))
    action = ((f"a larger decode batch, up to {full:,} (below it each added token mostly brings new experts' "
               "weights; from it on they are reused, as in a dense model); " if full else "")
              + advice("expert-bound", a.device.kind))
    return Finding("expert-bound", claim, ev, action, src)


def _expert_imbalance(ss, on: str, src: str):
    eff = [_experts_op(s).roof_fraction for s in ss if _experts_op(s).roof_fraction > 0]
    if len(eff) < IMBALANCE_POINTS:
        return None
    typical = median(eff)
    hit = []
    for s in ss:
        ex = _experts_op(s)
        ratio = ex.m.config.get("expert_imbalance")
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not ex.roof_fraction > 0:
            continue          # no per-expert counts recorded: the time alone cannot blame the routing
        expected = ex.predicted_s / typical            # uniform routing's cost at this run's typical efficiency
        slow = ex.instance_s / expected
        if slow >= IMBALANCE_MARGIN and ratio >= IMBALANCE_MIN:
            hit.append((slow, ratio, s, ex, expected))
    if not hit:
        return None
    slow, ratio, s, ex, expected = max(hit, key=lambda h: h[0])
    claim = (f"Expert imbalance{on} at {s.where}: the experts op took {slow:.1f}x the time uniform routing predicts, "
             f"and one expert got {ratio:.1f}x the mean tokens of the experts touched.")
    each = "; ".join(f"{x.where}: {ms(r.instance_s)} against {ms(e)} expected ({sl:.1f}x), max/mean tokens per "
                     f"expert {ra:.2f}" for sl, ra, x, r, e in sorted(hit, key=lambda h: h[2].batch))
    ev = (f"{each}. Expected = the "
          f"experts op's roof time at its uniform-routing cost / its median roof fraction over this run's "
          f"{len(eff)} decode points ({U.percent(typical)}); max/mean = the recorded per-expert token counts of the "
          "point's own routing (over the experts it touched)")
    action = ("a grouped GEMM's time follows its busiest expert: check the router's load balance on real prompts "
              "(a per-expert histogram), and for a skewed load try expert parallelism with replicated hot experts "
              "or a smaller block size for the grouped GEMM")
    return Finding("expert-imbalance", claim, ev, action, src)


def _trace_imbalance(ex: dict, src: str):
    """``expert-imbalance`` from a trace's recorded tokens per expert (see the module docstring)."""
    hit = []
    for g in ex.get("by_layer") or []:
        counts = {e: n for e, n in (g.get("counts") or {}).items() if n > 0}
        ratio = g.get("imbalance")
        if not counts or not isinstance(ratio, (int, float)):
            continue
        mean = sum(counts.values()) / len(counts)
        if mean >= TRACE_MIN_MEAN and ratio >= IMBALANCE_MIN:
            top = max(counts.items(), key=lambda kv: kv[1])
            hit.append((ratio, mean, top, g))
    if not hit:
        return None
    ratio, mean, top, g = max(hit, key=lambda h: h[0])
    claim = (f"Expert imbalance in the traced {g['phase']}: at MoE layer {g['layer']}, expert {top[0]} got "
             f"{ratio:.1f}x the mean tokens of the {g['experts_hit']} experts hit.")
    ev = "; ".join(f"{x['phase']} layer {x['layer']}: expert {t[0]} {t[1]:,} of {x['routed']:,} routed over "
                   f"{x['steps']} step(s), {m:.0f} per expert hit on average, max/mean {r:.2f}"
                   for r, m, t, x in sorted(hit, key=lambda h: -h[0])[:5])
    ev += (f". Counts {ex.get('how', '')} from the experts' GEMM shapes in the trace (roofline.traces.experts), "
           f"summed over the steps; judged where the mean is at least {TRACE_MIN_MEAN} tokens per expert hit")
    action = ("check the router's load balance on real prompts (these counts are this trace's prompts); a grouped "
              "GEMM's time follows its busiest expert: for a skewed load try expert parallelism with replicated hot "
              "experts or a smaller block size for the grouped GEMM")
    return Finding("expert-imbalance", claim, ev, action, src)
