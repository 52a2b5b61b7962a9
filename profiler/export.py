"""Result-file exports and the end-of-sweep table (stdout-friendly, no rich), from ``roofline.analysis``.

* ``write_csv(result_file, path)``: one row per measurement with the derived figures
  (median, p20/p80, spread, achieved FLOP/s and bytes/s, count per step, roof fraction,
  bound, label) and its step's verdict, all from ``roofline.analysis.analyze``.
* ``phase_table(result_file)``: a short plain-text table of the steps' verdicts.
"""

from __future__ import annotations

import csv

from roofline import units as U
from roofline.analysis import StepKey, analyze
from roofline.errors import RooflineError
from roofline.records import ABOVE_ROOF

CSV_COLUMNS = ("model", "op", "phase", "batch", "new_tokens", "context", "cached", "dtype", "weight_dtype",
               "kv_dtype", "backend", "tp", "rank", "status", "reason", "flops", "bytes", "intensity", "count", "median_s",
               "p20_s", "p80_s", "spread", "wide_spread", "reps", "achieved_flops", "achieved_bytes_per_s",
               "predicted_s", "roof_fraction", "bound", "label", "step_time_s", "step_label", "timer", "l2_policy",
               "flags")


def result_row(r, step=None) -> dict:
    """A CSV row of one ``OpResult`` (and the verdict of the step it belongs to)."""
    p, m = r.point, r.m
    row = {"model": p.model, "op": p.op, "phase": p.phase, "batch": p.batch, "new_tokens": p.new_tokens,
           "context": p.context, "cached": p.cached, "dtype": p.dtype, "weight_dtype": p.weight_dtype,
           "kv_dtype": p.kv_dtype, "backend": p.backend, "tp": p.tp, "rank": m.rank, "status": m.status,
           "reason": m.reason,
           "flops": p.cost.flops, "bytes": p.cost.bytes, "intensity": p.cost.intensity, "count": r.count,
           "reps": len(m.times_s), "timer": m.timer, "l2_policy": m.l2_policy, "flags": ";".join(r.flags),
           "predicted_s": r.predicted_s, "bound": r.bound, "label": r.label}
    if r.ok:
        row.update(median_s=m.median_s, p20_s=m.p20_s, p80_s=m.p80_s, spread=m.spread, wide_spread=m.wide_spread,
                   achieved_flops=m.achieved_flops, achieved_bytes_per_s=m.achieved_bytes_per_s,
                   roof_fraction=r.roof_fraction)
    if step is not None:
        row.update(step_time_s=step.time_s, step_label=step.label)
    return row


def write_csv(result_file, path) -> int:
    """Write every measurement of ``result_file`` to ``path``; returns the row count."""
    a = analyze(result_file)
    step_of = {s.key: s for s in a.steps}
    try:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in a.results:
                w.writerow(result_row(r, step_of.get(StepKey.of(r.point))))
    except OSError as e:
        raise RooflineError(f"cannot write {path}: {e.strerror or e}.") from None
    return len(a.results)


def phase_table(result_file) -> str:
    """One row per step (a verify step: "verify k=K" at the context it verifies after). Tensor-parallel steps
    add the rank count, the collectives' time and share of the step, and the per-rank balance (each rank's own
    step time, slowest / fastest)."""
    a = analyze(result_file)
    rows = a.steps
    if not rows:
        return "no phase verdicts: no op was measured."
    tp = any(s.tp > 1 for s in rows)
    quant = any(s.key.weight_dtype != s.dtype or s.key.kv_dtype != s.dtype for s in rows)
    qtext = lambda s: "".join(f" {k}:{v}" for k, v in (("w", s.key.weight_dtype), ("kv", s.key.kv_dtype))  # noqa: E731
                              if v != s.dtype).strip() or s.dtype
    qw = max((len(qtext(s)) for s in rows), default=0) + 2 if quant else 0
    ptext = lambda s: s.phase + (f" k={s.drafts}" if s.drafts else "")   # noqa: E731 (a verify step: its drafts)
    pw = max(8, max(len(ptext(s)) for s in rows) + 1)
    head = (f"{'phase':<{pw}}{'backend':<8}" + (f"{'dtypes':<{qw}}" if quant else "") + f"{'batch':>6}{'context':>8}"
            + (f"{'tp':>4}" if tp else "")
            + f"{'step':>11}{'FLOP/B':>9}{'roof':>7}"
            + (f"{'collectives':>13}{'share':>7}  {'ranks slow/fast':<17}" if tp else "") + "  verdict")
    out = ([f"WARNING: {a.noise_note}"] if a.noise_note else []) + [head, "-" * len(head)]
    above = False
    for s in rows:
        star = "*" if s.roof_fraction > ABOVE_ROOF else ""
        above = above or bool(star)
        comm = ""
        if tp:
            ts = [t for _, t in s.rank_s]
            bal = f"{U.seconds(max(ts))}/{U.seconds(min(ts))}" if ts else "-"
            comm = f"{U.seconds(s.communication_s):>13}{U.percent(s.comm_share):>7}  {bal:<17}"
        out.append(f"{ptext(s):<{pw}}{s.backend:<8}" + (f"{qtext(s):<{qw}}" if quant else "")
                   + f"{s.batch:>6}{s.cached if s.drafts else s.context:>8}"
                   + (f"{s.tp:>4}" if tp else "")
                   + f"{U.seconds(s.time_s):>11}{U.intensity(s.intensity):>9}{U.percent(s.roof_fraction):>7}"
                   + comm + f"  {s.verdict}{star if s.reliable else ''}"
                   + (f" (by op mix: {s.bound_by_mix})" if s.bound_by_mix != s.bound_by_sum and s.reliable else ""))
    if tp:
        out.append("tp > 1: step = the ops (each on its slowest rank), collectives beside it; share = collectives / "
                   "(step + collectives); ranks = each rank's own step time, slowest / fastest.")
    if above:
        out.append("* above its roof: no kernel can beat the roof, so either the byte count is too high or the "
                   "working set was served from cache, not DRAM; the label is the roofline's, the speed is not.")
    return "\n".join(out)
