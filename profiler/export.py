"""Result-file exports and the end-of-sweep table (stdout-friendly, no rich).

* ``write_csv(result_file, path)``: one row per measurement with the derived figures
  (median, p20/p80, spread, achieved FLOP/s and bytes/s, roof fraction, bound, label).
* ``phase_table(result_file)``: a short plain-text table of phase verdicts, from
  ``roofline.analysis.phase_summaries`` when it is there, else a minimal one computed here.
"""

from __future__ import annotations

import csv
import math

from roofline import units as U
from roofline.records import ABOVE_ROOF

CSV_COLUMNS = ("model", "op", "phase", "batch", "new_tokens", "context", "dtype", "backend", "status", "reason",
               "flops", "bytes", "intensity", "median_s", "p20_s", "p80_s", "spread", "wide_spread", "reps",
               "achieved_flops", "achieved_bytes_per_s", "roof_fraction", "bound", "label", "timer", "l2_policy",
               "flags")


def measurement_row(m, device) -> dict:
    p = m.point
    row = {"model": p.model, "op": p.op, "phase": p.phase, "batch": p.batch, "new_tokens": p.new_tokens,
           "context": p.context, "dtype": p.dtype, "backend": p.backend, "status": m.status, "reason": m.reason,
           "flops": p.cost.flops, "bytes": p.cost.bytes, "intensity": p.cost.intensity, "reps": len(m.times_s),
           "timer": m.timer, "l2_policy": m.l2_policy, "flags": ";".join(m.all_flags)}
    if m.ok:
        row.update(median_s=m.median_s, p20_s=m.p20_s, p80_s=m.p80_s, spread=m.spread, wide_spread=m.wide_spread,
                   achieved_flops=m.achieved_flops, achieved_bytes_per_s=m.achieved_bytes_per_s)
        try:
            row.update(roof_fraction=m.roof_fraction(device), bound=m.bound(device), label=m.label(device))
        except Exception:  # noqa: BLE001 - a device without this dtype's peak: leave the cells empty
            pass
    return row


def write_csv(result_file, path) -> int:
    """Write every measurement of ``result_file`` to ``path``; returns the row count."""
    dev = result_file.header.device
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for m in result_file.measurements:
            w.writerow(measurement_row(m, dev))
    return len(result_file.measurements)


def phase_table(result_file) -> str:
    try:
        from roofline.analysis import phase_summaries
    except ImportError:
        return _minimal_table(result_file)
    rows = phase_summaries(result_file)
    if not rows:
        return "no phase verdicts: no op was measured."
    head = f"{'phase':<8}{'backend':<8}{'batch':>6}{'context':>8}{'step':>11}{'FLOP/B':>9}{'roof':>7}  verdict"
    out = [head, "-" * len(head)]
    above = False
    for s in rows:
        star = "*" if s.roof_fraction > ABOVE_ROOF else ""
        above = above or bool(star)
        out.append(f"{s.phase:<8}{s.backend:<8}{s.batch:>6}{s.context:>8}{U.seconds(s.time_s):>11}"
                   f"{U.intensity(s.intensity):>9}{U.percent(s.roof_fraction):>7}  {s.label}{star}"
                   + (f" (by op mix: {s.bound_by_mix})" if s.bound_by_mix != s.bound_by_sum else ""))
    if above:
        out.append("* above its roof: no kernel can beat the roof, so either the byte count is too high or the "
                   "working set was served from cache, not DRAM; the label is the roofline's, the speed is not.")
    return "\n".join(out)


def _minimal_table(result_file) -> str:
    """Per (phase, backend, batch, context): the layer op's time and verdict (no analysis module)."""
    dev = result_file.header.device
    head = f"{'phase':<8}{'backend':<8}{'batch':>6}{'context':>8}{'layer':>11}{'FLOP/B':>9}{'roof':>7}  verdict"
    out = [head, "-" * len(head)]
    for m in result_file.measurements:
        if m.point.op != "layer" or not m.ok:
            continue
        p = m.point
        frac = m.roof_fraction(dev)
        out.append(f"{p.phase:<8}{p.backend:<8}{p.batch:>6}{p.context:>8}{U.seconds(m.median_s):>11}"
                   f"{U.intensity(m.intensity):>9}{U.percent(frac) if not math.isnan(frac) else 'n/a':>7}  "
                   f"{m.label(dev)}")
    return "\n".join(out)
