"""Speculative decoding from our own measured steps (``roofline explain --spec K --acceptance A --from RESULTS``):
the curve ``roofline.explain.spec_curve`` prices at the roof, computed instead from a sweep's decode and verify
steps (``roofline profile --spec K``), read through ``roofline.analysis`` (never parsed here).

Per batch the sweep measured, at one context (the one asked, else the sweep's nearest, said), for each backend and
dtypes of the sweep:

* plain decode time = the measured decode step at that batch and context;
* verify time = the measured verify step of K drafts at that batch over that context;
* speedup = E x decode / (verify + draft), E = ``formulas.expected_tokens(a, K)``; the draft's time is the
  roofline's (``roofline.speculative.speculation_round``: not measured) when a draft is costed (--draft, --mtp),
  else 0; rejection sampling is not measured and not counted (a greedy verify is an argmax compare);
* the batch where speculation stops paying: the first measured batch whose speedup is under 1, interpolated
  linearly in batch between it and the measured batch before it (where the speedup is still at least 1);
* whether each verify step is compute-bound: its own recorded FLOPs / bytes (``Step.intensity``) against the
  ridge of the sweep's measured ceilings (``Step.ridge``), and its step label (``Step.label``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from . import units as U
from .bounds import COMPUTE, MEMORY
from .errors import RooflineError


def _rerun(model: str, k: int) -> str:
    return f"roofline profile --model {model} --spec {k} --batches 1,2,4,8 --contexts 1024"


def check_sweep(analysis, k: int, model_name: str) -> None:
    """Refuse, in one line naming what to run, a sweep of another model or without verify steps of ``k`` drafts."""
    have = analysis.header.model_name
    path = getattr(analysis.rf, "path", None) or "the results file"
    if have != model_name:
        raise RooflineError(f"{path} was measured on {have}, not {model_name}: give --model {have}, or measure "
                            f"{model_name}'s verify steps with `{_rerun(model_name, k)}`.")
    ks = sorted({s.drafts for s in analysis.steps if s.phase == "verify"})
    if k not in ks:
        held = f"verify steps of k = {', '.join(map(str, ks))} only" if ks else "no verify steps"
        raise RooflineError(f"{path} has {held}, not of k = {k}: measure them with `{_rerun(model_name, k)}` "
                            f"(or give --spec {ks[0]})." if ks else
                            f"{path} has {held} (a sweep without --spec): measure them with "
                            f"`{_rerun(model_name, k)}`.")


def _pairs(analysis, k: int) -> dict:
    """{(context, group): {batch: (decode step, verify step)}} where both were measured; group = the step key's
    backend, dtypes and parallelism."""
    def group(s):
        key = s.key
        return (key.backend, key.dtype, key.weight_dtype, key.kv_dtype, key.tp, key.ep)

    dec = {(s.context, group(s), s.batch): s for s in analysis.steps if s.phase == "decode"}
    out: dict = defaultdict(dict)
    for s in analysis.steps:
        if s.phase == "verify" and s.drafts == k:
            d = dec.get((s.cached, group(s), s.batch))
            if d is not None:
                out[(s.cached, group(s))][s.batch] = (d, s)
    return out


def measured_context(analysis, k: int, asked: int) -> tuple:
    """(context, said): ``asked`` when the sweep measured decode and verify steps of ``k`` there, else the sweep's
    nearest such context (the smaller on a tie), said so. Refused when no batch has both."""
    ctxs = sorted({c for c, _ in _pairs(analysis, k)})
    if not ctxs:
        raise RooflineError(f"the results file has verify steps of k = {k} but no decode step at the same batch and "
                            f"context to set them against: measure both with "
                            f"`{_rerun(analysis.header.model_name, k)}` (profile --spec adds verify to decode).")
    if asked in ctxs:
        return asked, f"context {asked:,} (as asked)"
    near = min(ctxs, key=lambda c: (abs(c - asked), c))
    return near, (f"context {near:,}, the sweep's nearest to the {asked:,} asked (it measured "
                  f"{', '.join(f'{c:,}' for c in ctxs)})")


@dataclass(frozen=True)
class MeasuredRound:
    """One measured batch: the plain decode step against a speculation round of the measured verify step (and the
    roofline's draft time, when a draft is costed)."""

    batch: int
    decode_s: float
    verify_s: float
    draft_s: float             # the roofline's, not measured (0 for a draft not costed)
    tokens_per_step: float
    verify_intensity: float    # the verify step's recorded FLOPs / bytes
    ridge: float               # of the sweep's measured ceilings, the run dtype
    verify_label: str          # the verify step's verdict (roofline.analysis: memory / compute / overhead)
    missing: tuple = ()        # ops of the model not measured ok in either step

    @property
    def round_s(self) -> float:
        return self.verify_s + self.draft_s

    @property
    def speedup(self) -> float:
        return self.tokens_per_step * self.decode_s / self.round_s

    @property
    def verify_bound(self) -> str:
        return COMPUTE if self.verify_intensity >= self.ridge else MEMORY

    def to_dict(self) -> dict:
        b = self.batch
        return {"batch": b, "decode_s": self.decode_s, "verify_s": self.verify_s, "draft_s": self.draft_s,
                "round_s": self.round_s, "tokens_per_step": self.tokens_per_step,
                "plain_tokens_per_s_user": 1 / self.decode_s, "plain_tokens_per_s_device": b / self.decode_s,
                "spec_tokens_per_s_user": self.tokens_per_step / self.round_s,
                "spec_tokens_per_s_device": b * self.tokens_per_step / self.round_s, "speedup": self.speedup,
                "verify_intensity": self.verify_intensity, "ridge": self.ridge, "verify_bound": self.verify_bound,
                "verify_label": self.verify_label, "missing": list(self.missing)}


def stops_paying(rows) -> dict:
    """Where the measured speedup falls under 1 (``rows`` by batch): {"batch": the interpolated batch or None,
    "between": (b0, b1) the measured batches around it, "never_pays": under 1 at the smallest measured batch}."""
    rows = sorted(rows, key=lambda r: r.batch)
    for i, r in enumerate(rows):
        if r.speedup < 1:
            if i == 0:
                return {"batch": None, "between": None, "never_pays": True}
            p = rows[i - 1]
            b = p.batch + (p.speedup - 1) * (r.batch - p.batch) / (p.speedup - r.speedup)
            return {"batch": b, "between": [p.batch, r.batch], "never_pays": False}
    return {"batch": None, "between": None, "never_pays": False}


def measured_curve(analysis, k: int, tokens_per_step: float, context: int, draft_s_at=None) -> list:
    """The measured curve of every (backend, dtypes) group of the sweep at ``context``: [{"backend", "dtype",
    "weight_dtype", "kv_dtype", "tp", "ep", "rows", "stops_paying", "compute_bound_batch"}, ...];
    ``draft_s_at(batch)``: the roofline's draft time per round, None for a draft not costed."""
    out = []
    for (ctx, grp), by_batch in sorted(_pairs(analysis, k).items()):
        if ctx != context:
            continue
        rows = []
        for b in sorted(by_batch):
            d, v = by_batch[b]
            rows.append(MeasuredRound(b, d.time_s, v.time_s, draft_s_at(b) if draft_s_at else 0.0, tokens_per_step,
                                      v.intensity, v.ridge, v.label, tuple(sorted(set(d.missing) | set(v.missing)))))
        compute = next((r.batch for r in rows if r.verify_bound == COMPUTE), None)
        backend, dtype, wdt, kvdt, tp, ep = grp
        out.append({"backend": backend, "dtype": dtype, "weight_dtype": wdt, "kv_dtype": kvdt, "tp": tp, "ep": ep,
                    "rows": [r.to_dict() for r in rows], "stops_paying": stops_paying(rows),
                    "compute_bound_batch": compute})
    return out


def measured_data(analysis, k: int, tokens_per_step: float, context: int, context_said: str,
                  draft_s_at=None) -> dict:
    """What ``--json`` carries under "measured"."""
    return {"file": str(getattr(analysis.rf, "path", "") or ""), "device": analysis.device.name,
            "device_source": analysis.device.source, "context": context, "context_said": context_said, "k": k,
            "draft_from": "roofline" if draft_s_at else None, "noise_note": analysis.noise_note,
            "curves": measured_curve(analysis, k, tokens_per_step, context, draft_s_at)}


def measured_text(m: dict) -> str:
    """The measured curve(s) as ``roofline explain --spec --from`` prints them, after the roofline's."""
    k = m["k"]
    draft = ("the draft's time is the roofline's (not measured)" if m["draft_from"] else
             "no draft time (a draft not costed)")
    lines = [f"Measured ({m['file'] or 'the results file'}, {m['device']}, {m['device_source']} ceilings) at "
             f"{m['context_said']}: decode = the measured decode step, round = the measured verify step of {k} "
             f"drafts + draft; {draft}; rejection sampling not measured, not counted."]
    if m["noise_note"]:
        lines.append(m["noise_note"])
    for c in m["curves"]:
        quant = "".join(f", {n} {c[f]}" for n, f in (("weights", "weight_dtype"), ("KV", "kv_dtype"))
                        if c[f] != c["dtype"])
        lines.append(f"{c['backend']} backend, {c['dtype']}{quant}:")
        lines.append(f"{'batch':>6} {'decode':>10} {'verify':>10} {'round':>10} {'tok/s/user':>17} "
                     f"{'speedup':>8} {'verify FLOP/B':>14} {'ridge':>7}")
        for r in c["rows"]:
            lines.append(f"{r['batch']:>6} {U.seconds(r['decode_s']):>10} {U.seconds(r['verify_s']):>10} "
                         f"{U.seconds(r['round_s']):>10} {r['plain_tokens_per_s_user']:>7,.0f} -> "
                         f"{r['spec_tokens_per_s_user']:>6,.0f} {r['speedup']:>7.2f}x "
                         f"{U.intensity(r['verify_intensity']):>8} {r['verify_bound']:<7} "
                         f"{U.intensity(r['ridge']):>5} (step: {r['verify_label']})"
                         + (f" missing {', '.join(r['missing'])}" if r["missing"] else ""))
        bs = [r["batch"] for r in c["rows"]]
        cb = c["compute_bound_batch"]
        lines.append(f"The measured verify step is compute-bound (its recorded FLOPs / bytes at the measured ridge) "
                     f"from batch {cb:,}." if cb else
                     f"The measured verify step stays under the measured ridge at every measured batch (up to "
                     f"{bs[-1]:,}).")
        sp = c["stops_paying"]
        if sp["never_pays"]:
            lines.append(f"Measured, speculation never pays: the speedup is under 1 already at batch {bs[0]:,}, the "
                         "smallest measured.")
        elif sp["batch"] is not None:
            b0, b1 = sp["between"]
            lines.append(f"Measured, speculation stops paying at batch {sp['batch']:,.1f} (interpolated linearly "
                         f"between the measured batches {b0:,} and {b1:,}).")
        else:
            lines.append(f"Measured, speculation pays at every measured batch (up to {bs[-1]:,}).")
    return "\n".join(lines)
