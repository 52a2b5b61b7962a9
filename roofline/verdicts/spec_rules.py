"""Diagnosis rules for speculative decoding (issue 34): ``speculation-pays`` and ``speculation-does-not-pay``.

On the user's measured decode steps (whole steps of a profile file whose model is known, one device), the cost
model prices one verify step of ``SPEC_K`` drafts (``roofline.speculative.verify_step``) against one decode step at
the same batch and context, both at the roof of the run's device, and solves for the break-even acceptance: the
per-token acceptance a at which ``formulas.expected_tokens(a, K)`` tokens per round equal the round's cost in
decode steps (verify + rejection sampling; the draft's own cost NB: not counted, so a draft model or MTP layer
raises the bar: ``roofline explain --spec K --draft MODEL`` prices it).

* ``speculation-pays``: memory-bound measured steps whose break-even acceptance is at most
  ``SPEC_ACCEPTANCE``: the headroom under the ridge (ridge / intensity) absorbs the verify step's K extra tokens.
* ``speculation-does-not-pay``: compute-bound measured steps, or memory-bound ones whose break-even acceptance
  is above ``SPEC_ACCEPTANCE`` (or past any: the round costs K + 1 decode steps or more).

Steps far under their roof (overhead) or cache-resident are not judged here: the roof does not time them. Registered
in ``roofline.verdicts.findings``, scope ``backend`` at order 30 (after ``expert``).

* ``speculation-measured`` (scope ``latency``, order 80): a latency configuration that recorded speculation
  (``LatencySummary.speculation``: in process, or a server's counters) says its measured acceptance and tokens per
  verify step, what independent acceptance at that rate would give (``formulas.expected_tokens``), and, beside the
  same requests run without speculation (``roofline.latency.plain_counterpart``), the TPOT speedup and what a round
  cost in plain decode steps (tokens per step x TPOT with / TPOT without): speculation pays while the tokens per
  step exceed it.
"""

from __future__ import annotations

from .. import formulas as F
from .. import units as U
from ..bounds import COMPUTE, MEMORY, roof_for
from ..errors import RooflineError
from ..speculative import seconds, verify_step
from ..latency import plain_counterpart
from .expert_rules import moe_decode_phase
from .findings import Finding, finding, register

SPEC_K = 3              # drafts per verify step priced: the setting EAGLE and MTP deployments commonly run
SPEC_ACCEPTANCE = 0.7   # a per-token acceptance a good draft commonly reaches (EAGLE-class drafts and DeepSeek-V3's
                        # MTP report 0.6-0.9): speculation "pays" when it breaks even at or below this


def break_even(ratio: float, k: int = SPEC_K, tol: float = 1e-9) -> float | None:
    """The acceptance a with expected_tokens(a, k) = ``ratio`` (a round's cost in decode steps): 0 when the round
    costs at most one step, None when it costs k + 1 or more (no acceptance pays); bisection, E grows with a."""
    if ratio <= 1:
        return 0.0
    if ratio >= k + 1:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if F.expected_tokens(mid, k) < ratio else (lo, mid)
    return hi


def _price(model, s, settings, device):
    """(round cost in decode steps, break-even acceptance) for step ``s`` at the roof of ``device``."""
    dec = moe_decode_phase(model, s.key, settings)
    k = s.key
    opts = dict(weight_dtype=k.weight_dtype, act_dtype=k.dtype, kv_dtype=k.kv_dtype)
    if k.weight_dtype == "int4":
        opts.update(group_size=settings.get("group_size"), zero_point=bool(settings.get("zero_point")))
    ver = verify_step(model, s.batch, s.context, SPEC_K, **opts)
    reject = roof_for(device, "fp32", k.dtype).predicted_s(F.rejection_sampling(s.batch, SPEC_K, model.vocab))
    ratio = (seconds(ver, device) + reject) / seconds(dec, device)
    return ratio, break_even(ratio)


@finding("backend", "speculation", order=30)
def speculation_findings(a, backend: str, several: bool = False, src: str = "") -> list:
    """``speculation-pays`` and ``speculation-does-not-pay`` for one backend's whole measured decode steps."""
    model = a.header.model
    if model is None or a.header.kind == "trace":
        return []
    ss = [s for s in a.phase_steps("decode", backend) if s.reliable and s.label in (MEMORY, COMPUTE)
          and not s.missing and s.tp == 1]
    pays, not_pays = [], []
    for s in ss:
        try:
            ratio, a_star = _price(model, s, a.header.settings, a.device)
        except RooflineError:
            continue
        item = (s, ratio, a_star)
        (pays if s.label == MEMORY and a_star is not None and a_star <= SPEC_ACCEPTANCE else not_pays).append(item)
    on = f" ({backend})" if several else ""
    k = SPEC_K
    out = []

    def said(s, ratio, a_star):
        need = ("pays at any acceptance" if a_star == 0 else f"breaks even at acceptance {a_star:.2f}"
                if a_star is not None else f"cannot pay: a round costs more decode steps than its {k + 1} tokens")
        room = f" ({s.ridge / s.intensity:.1f}x headroom)" if s.label == MEMORY else ""
        return (f"{s.where}: {s.label}-bound at {U.intensity(s.intensity)} FLOP/B against a ridge of "
                f"{U.intensity(s.ridge)}{room}, measured {U.seconds(s.time_s)} per step; a verify step of {k + 1} "
                f"tokens costs {ratio:.2f} decode steps at the roof, so k = {k} {need}")

    if pays:
        where = ", ".join(s.where for s, _, _ in pays)
        e = F.expected_tokens(SPEC_ACCEPTANCE, k)
        out.append(Finding(
            "speculation-pays", f"Speculative decoding would pay on decode{on} at {where}: the step is memory-bound "
            f"with headroom, so {k + 1} tokens per sequence cost little more than one.",
            "; ".join(said(*x) for x in pays) + f" (at acceptance {SPEC_ACCEPTANCE:g}, {e:.2f} tokens per round: "
            + ", ".join(f"{e / r:.2f}x" for _, r, _ in pays) + " the tokens/s; the draft's own steps not counted)",
            "try speculative decoding at these batches: a small draft model of the same tokenizer, an EAGLE head or "
            f"the model's MTP layers, k = {k}; measure its acceptance on your own prompts, and price the draft with "
            f"`roofline explain --model {model.name} --spec {k} --acceptance A --draft MODEL` (or --mtp)", src,
            {"k": k, "steps": [{"where": s.where, "round_decode_steps": r, "break_even_acceptance": x}
                               for s, r, x in pays]}))
    if not_pays:
        where = ", ".join(s.where for s, _, _ in not_pays)
        out.append(Finding(
            "speculation-does-not-pay", f"Speculative decoding would not pay on decode{on} at {where}: the verify "
            f"step's {k + 1} x batch rows cost compute (or expert weights) a decode step does not.",
            "; ".join(said(*x) for x in not_pays) + f" (a good draft reaches about {SPEC_ACCEPTANCE:g}: "
            f"{F.expected_tokens(SPEC_ACCEPTANCE, k):.2f} tokens per round)",
            "at these batches the hardware is already used: batch more sequences rather than more tokens per "
            "sequence; speculation can still lower one user's latency at a smaller batch", src,
            {"k": k, "steps": [{"where": s.where, "round_decode_steps": r, "break_even_acceptance": x}
                               for s, r, x in not_pays]}))
    return out


def _measured(x) -> list:
    """``speculation-measured`` for one latency configuration (a ``latency_rules.ConfigRun``)."""
    s = x.s
    sp = s.speculation or {}
    a = sp.get("acceptance", sp.get("accept_rate"))
    y = sp.get("tokens_per_step", sp.get("accept_length"))
    if not isinstance(a, (int, float)) or not isinstance(y, (int, float)) or a != a or y != y:
        return []
    k = sp.get("k")
    kk = f"K = {k}" if isinstance(k, int) and k >= 1 else "K unknown"
    model = f"E = (1 - a^(K+1)) / (1 - a) = {F.expected_tokens(min(a, 1), k):.2f} tokens per step at independent " \
            f"acceptance {a:.3f}" if isinstance(k, int) and k >= 1 else ""
    base = plain_counterpart(s, x.others)
    tw, tb = s.tpot.get("p50", float("nan")), base.tpot.get("p50", float("nan")) if base else float("nan")
    head = f"{x.tag}Speculation measured: acceptance {a:.3f}, tokens/step {y:.2f} ({kk})"
    data = {"acceptance": a, "tokens_per_step": y, "k": k, "expected_tokens_independent":
            F.expected_tokens(min(a, 1), k) if isinstance(k, int) and k >= 1 else None}
    if base is None or not (tw > 0 and tb > 0):
        return [Finding("speculation-measured", head + ".", (model + "; " if model else "") +
                        "no run of the same requests without speculation to set it against (a server's counters, or "
                        "a file without it)", "run `roofline latency ... --spec K --draft MODEL` in process for the "
                        "TPOT beside the plain run, or price it with `roofline explain --spec K --acceptance A`",
                        x.src, data)]
    rates = [r for r in sp.get("per_position") or () if isinstance(r, (int, float)) and r == r]
    pos = " / ".join(f"{r:.2f}" for r in rates)
    speed, cost = tb / tw, y * tw / tb
    pays = speed > 1
    data.update(tpot_p50_s=tw, plain_tpot_p50_s=tb, speedup=speed, round_decode_steps=cost, plain=base.config)
    verdict = f"{speed:.2f}x the plain run's TPOT p50 ({U.seconds(tb)} -> {U.seconds(tw)}): it " + \
              ("pays" if pays else "does not pay")
    detail = (f"a round costs {cost:.2f} plain decode steps (tokens/step x TPOT with / TPOT without), so speculation "
              f"pays while the tokens per step exceed {cost:.2f}; measured {y:.2f}" + (f"; {model}" if model else "")
              + (" (more than measured: rounds that drafted fewer than K near a request's end, or acceptance "
                 "falling with the position" + (f": per position {pos}" if pos else "") + ")"
                 if data["expected_tokens_independent"] and y < data["expected_tokens_independent"] - 0.05 else ""))
    act = ("keep it; a longer draft (larger K) pays while the round's cost in decode steps stays under its tokens per "
           "step" if pays else
           "the round costs more than it yields here: a cheaper draft, a smaller K or a smaller batch (`roofline "
           "explain --spec K --acceptance A` says the batch where it stops paying)")
    return [Finding("speculation-measured", f"{head}: {verdict}.", detail, act, x.src, data)]


register("latency", "speculation-measured", _measured, order=80)
