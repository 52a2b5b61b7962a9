"""Latency rules: where a configuration's TTFT and E2E go, queueing, stalls, prefix reuse, floors (pure).

Registered in ``roofline.verdicts.findings``, scope ``latency`` (one ``ConfigRun`` each):
``latency-interrupted`` (10), ``requests-failed`` (20), ``latency-split`` in-process (30) and from outside a
server (40), ``queue-dominates`` (50), ``chunk-stalls`` (60), ``prefix-reuse`` (70). ``floor_findings``
(``latency-floor``) is run first by the consumer, since ``latency-split`` quotes its ratios. The rule table is
``roofline.verdicts.diagnosis``'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import units as U
from ..errors import RooflineError
from ..floor import latency_floors
from ..latency import LatencySummary
from ..stats import median
from ..units import ms
from .findings import DOMINANT, Finding, register

SPIKE_FACTOR = 2.0    # an ITL gap over 2x the pooled median is a spike (a skipped beat, not noise)
MIN_GAPS = 4          # fewer clean gaps than this: no baseline, no call
BLOCK = 16            # prefix-cache block (tokens) when a file does not say


@dataclass(frozen=True)
class ConfigRun:
    """One latency configuration, as the ``latency`` rules see it."""

    run: object                 # roofline.latency.LatencyRun
    src: str = ""               # the result file
    settings: dict = field(default_factory=dict)   # the file header's settings
    others: tuple = ()          # every configuration's LatencySummary in the file (this one included)
    ratios: tuple = ()          # its floors (roofline.floor.FloorRatio), when known

    @property
    def tag(self) -> str:
        return f"[{self.run.config}] " if self.run.config else ""

    @property
    def ts(self) -> list:
        return list(self.run.timelines)

    @property
    def s(self) -> LatencySummary:
        return self.run.summary


def _interrupted(x: ConfigRun):
    if x.run.complete:
        return None
    return Finding("latency-interrupted", f"{x.tag}This configuration was interrupted: {len(x.ts)} requests "
                   "finished before it stopped, and the findings below use only those.",
                   f"no summary line for attempt {x.run.attempt} in the file",
                   "resume the run (the command printed at the interrupt, or the same command with "
                   "--resume) to measure it completely", x.src)


def _failures(tag, ts, s: LatencySummary, src):
    """Failed requests, counted by reason (the recorded error's kind), with one full reason each."""
    failed = [t for t in ts if not t.ok]
    if not failed:
        return None
    kinds: dict = {}
    for t in failed:
        kinds.setdefault(t.error.split(":")[0] or "no reason recorded", t.error)
    counts = {k: sum((t.error.split(":")[0] or "no reason recorded") == k for t in failed) for k in kinds}
    why = "; ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    every = len(failed) == len(ts)
    claim = (f"{tag}All {len(ts)} requests failed ({why}): there is no latency to diagnose." if every else
             f"{tag}{len(failed)} of {len(ts)} requests failed ({why}); the findings below use the "
             f"{len(ts) - len(failed)} that did not.")
    ev = "first of each: " + "; ".join(f"request {next(t.id for t in failed if t.error == e)}: {e[:160]}"
                                       for e in kinds.values())
    action = ("fix what the reasons name (the server's address, key, model or limits) and run again" if every else
              "check the reasons: failed requests are left out of every metric")
    return Finding("requests-failed", claim, ev, action, src)


def _outside(tag, ts, s: LatencySummary, src):
    """The TTFT / TPOT / ITL / queue story of a run measured from outside a server (no server-side stages)."""
    ok = [t for t in ts if t.ok and t.deliveries and not math.isnan(t.sent)]
    if not ok or not math.isnan(s.stages.get("queue", math.nan)):      # in-process: _split tells it
        return None
    queue = sum(t.sent - t.arrival for t in ok) / len(ok)
    server = sum(t.ttft for t in ok) / len(ok)
    ttft = queue + server
    decode = sum(t.finish - t.deliveries[0] for t in ok) / len(ok)
    e2e = ttft + decode
    pct = lambda x, tot: f"{100 * x / tot:.0f}%" if tot > 0 else "n/a"  # noqa: E731
    itl = s.chunk_itl or s.itl
    claim = (f"{tag}Mean TTFT {ms(ttft)} = client queue {ms(queue)} ({pct(queue, ttft)}) + server {ms(server)} "
             f"({pct(server, ttft)}); mean E2E {ms(e2e)} = TTFT {pct(ttft, e2e)}, decode {pct(decode, e2e)}; TPOT p50 "
             f"{ms(s.tpot.get('p50', math.nan))}, ITL p50 {ms(itl.get('p50', math.nan))}, p99 "
             f"{ms(itl.get('p99', math.nan))}.")
    ev = (f"{len(ok)} ok requests ({s.failed} failed), measured from the client: client queue = scheduled arrival -> "
          "request sent (the wait for a concurrency slot), server = sent -> first output chunk (the server's own "
          "queue, prefill and the first token's trip; the client cannot split them), decode = first -> last chunk")
    action = ""
    if ttft > 0 and queue / ttft >= DOMINANT:
        action = ("the client's own concurrency limit holds requests back: raise --max-concurrency or lower the rate "
                  "to measure the server rather than the queue in front of it")
    return Finding("latency-split", claim, ev, action, src)


def floor_findings(tag, ts, s: LatencySummary, ctx, src) -> tuple:
    """([latency-floor findings], [FloorRatio]) for one configuration; ``ctx`` = (model config, device, dtype,
    where the dtype came from). The consumer runs it first: the other rules quote its ratios."""
    model, device, dtype, dtype_from = ctx
    try:
        ratios = latency_floors(s, ts, model, device, dtype)
    except RooflineError as e:
        return [Finding("latency-floor", f"{tag}No roofline floor for this run: {e}", f"model {model.name}, device "
                        f"{device.name}, dtype {dtype} ({dtype_from})", "give the --model the server runs", src)], []
    out = []
    for r in ratios:
        f = r.floor
        notes = f" ({'; '.join(f.notes)})" if f.notes else ""
        ev = (f"floor = sum over the ops of {model.name} ({dtype}, {dtype_from}) of max(FLOPs / peak, bytes / bandwidth) x count on "
              f"{device.name} ({device.source} ceilings){notes}: {f.flops:.3g} FLOP and {f.bytes:.3g} B for "
              f"{f.shape}; {100 * f.memory_share:.0f}% of the floor's time is bytes")
        if r.metric == "TPOT":
            ev += ("; batch = requests decoding at once averaged over every output token after the first, "
                   "context = tokens cached at those steps")
        else:
            ev += "; prompt = mean served prompt (its cached prefix reused), alone"
        out.append(Finding("latency-floor", f"{tag}{r.sentence}.", ev, r.action, src, r.to_dict()))
    return out, ratios


def _split(tag, ts, s: LatencySummary, src, ratios=()):
    st = s.stages
    if not st or math.isnan(st.get("queue", math.nan)):
        return None
    ttft = st["queue"] + st["prefill"] + st["delivery"]
    e2e = ttft + st["decode"]
    pct = lambda x, tot: f"{100 * x / tot:.0f}%" if tot > 0 else "n/a"  # noqa: E731
    claim = (f"{tag}Mean TTFT {ms(ttft)} = queue {ms(st['queue'])} ({pct(st['queue'], ttft)}) + prefill "
             f"{ms(st['prefill'])} ({pct(st['prefill'], ttft)}) + delivery {ms(st['delivery'])}; mean E2E {ms(e2e)} "
             f"= queue {pct(st['queue'], e2e)}, prefill {pct(st['prefill'], e2e)}, decode {pct(st['decode'], e2e)}.")
    ev = (f"{s.requests - s.failed} ok requests ({s.failed} failed); stages from each request's timestamps: queue = "
          f"arrival -> first prefill chunk, prefill = first chunk -> first token selected, decode = first -> last delivery")
    pf = [r for r in ratios if r.metric == "TTFT"]
    if pf:
        f = pf[0].floor
        ev += (f"; the prefill floor on {f.device} is {U.seconds(f.seconds)} for {f.shape}: the prefill stage takes "
               f"{st['prefill'] / f.seconds:.1f}x that" if f.seconds > 0 else "")
    return Finding("latency-split", claim, ev, "", src)


def _queue(tag, s: LatencySummary, src):
    st = s.stages
    if not st or math.isnan(st.get("queue", math.nan)):
        return None
    ttft = st["queue"] + st["prefill"] + st["delivery"]
    if ttft <= 0 or st["queue"] / ttft < DOMINANT:
        return None
    return Finding("queue-dominates", f"{tag}Queueing dominates TTFT: faster prefill will not help much.",
                   f"queue {ms(st['queue'])} is {100 * st['queue'] / ttft:.0f}% of mean TTFT {ms(ttft)}; prefill is "
                   f"{ms(st['prefill'])} ({100 * st['prefill'] / ttft:.0f}%)",
                   "add serving capacity or admit more work per step (larger token budget, more slots), or lower the "
                   "arrival rate; tune prefill only after the queue is short", src)


def stall_evidence(ts) -> dict:
    """ITL spikes against a clean baseline, split by whether another request's prefill chunk overlaps the gap.

    baseline = median of gaps that overlap no other request's prefill; a spike is a gap over
    SPIKE_FACTOR x baseline. Spikes caused by prefill show up as a higher spike rate among
    overlapping gaps than among clean ones (noise, e.g. a busy machine, hits both alike).
    """
    over, clean, worst = [], [], None
    for t in ts:
        if not t.ok:
            continue
        for a, b in zip(t.deliveries, t.deliveries[1:]):
            toks = sum(c[2] for o in ts if o.id != t.id for c in o.chunks if c[0] < b and c[1] > a)
            (over if toks else clean).append((b - a, t.id, toks))
    out = {"gaps": len(over) + len(clean), "overlapping_gaps": len(over), "spikes": 0, "overlapping": 0,
           "clean_spikes": 0, "baseline": math.nan, "worst": None}
    if len(clean) < MIN_GAPS:
        return out
    baseline = median(g for g, _, _ in clean)
    spikes_o = [x for x in over if x[0] > SPIKE_FACTOR * baseline]
    spikes_c = [x for x in clean if x[0] > SPIKE_FACTOR * baseline]
    worst = max(spikes_o, default=None)
    out.update(baseline=baseline, spikes=len(spikes_o) + len(spikes_c), overlapping=len(spikes_o),
               clean_spikes=len(spikes_c), worst=worst,
               rate_overlapping=len(spikes_o) / len(over) if over else 0.0, rate_clean=len(spikes_c) / len(clean))
    return out


def _budget(s: LatencySummary) -> float:
    b = s.settings.get("chunk_budget")
    return math.inf if b in (None, "none") else float(b)


def _stalls(tag, ts, s: LatencySummary, src, others=()):
    e = stall_evidence(ts)
    if not e["overlapping"] or e["overlapping"] < DOMINANT * e["spikes"] or \
            e["rate_overlapping"] < SPIKE_FACTOR * e["rate_clean"]:
        return None
    gap, rid, toks = e["worst"]
    budget = s.settings.get("chunk_budget")
    now = f" (now {budget} tokens per step)" if budget else ""
    ev = (f"{e['overlapping']} of {e['overlapping_gaps']} gaps that overlap another request's prefill "
          f"chunk exceed {SPIKE_FACTOR:g}x the clean median ITL {ms(e['baseline'])}, against "
          f"{e['clean_spikes']} of {e['gaps'] - e['overlapping_gaps']} other gaps; worst {ms(gap)} in "
          f"request {rid}, during {toks} prefill tokens")
    # the same file may hold the experiment: the next smaller budget with the same prefix-cache setting
    same = [o for o in others if _budget(o) < _budget(s)
            and bool(o.settings.get("prefix_cache")) == bool(s.settings.get("prefix_cache"))]
    if same:
        o = max(same, key=_budget)
        ev += (f"; at chunk budget {o.settings.get('chunk_budget')} in this file: ITL p99 {ms(s.itl['p99'])} -> "
               f"{ms(o.itl['p99'])}, TTFT p90 {ms(s.ttft['p90'])} -> {ms(o.ttft['p90'])}")
        action = (f"a smaller prefill chunk budget{now} shortens these stalls at the cost of TTFT, as measured here; "
                  "pick the largest budget whose ITL meets the target")
    elif others and all(_budget(o) >= _budget(s) for o in others) and len({_budget(o) for o in others}) > 1:
        action = (f"this is the smallest budget tried{now}: a smaller one shortens the stalls further but lengthens "
                  "TTFT more; check both against their targets")
    else:
        action = (f"inspect the scheduler timeline and try a smaller prefill chunk budget{now}: it shortens the "
                  "stalls and lengthens TTFT (sweep it with --sweep-chunks)")
    return Finding("chunk-stalls", f"{tag}Long prompts interrupt running streams: inter-token gaps spike while "
                   "other requests prefill.", ev, action, src)


def _prefix(tag, ts, s: LatencySummary, settings: dict, src, others=()):
    block = int(s.settings.get("block_size") or settings.get("block_size") or BLOCK)
    seen, shared_tokens, sharing = set(), 0, 0
    for t in sorted(ts, key=lambda t: t.arrival):
        k = 0
        for h in t.block_hashes:
            if h not in seen:
                break
            k += 1
        if k:
            sharing += 1
            shared_tokens += min(k * block, max(t.prompt_tokens - 1, 0))
        seen.update(t.block_hashes)
    cached = sum(t.cached_tokens for t in ts)
    if not sharing or cached >= DOMINANT * shared_tokens:
        return None
    ev = (f"{sharing} of {len(ts)} requests begin with full {block}-token blocks seen in an earlier prompt "
          f"({shared_tokens} reusable tokens in all), but {cached} prompt tokens came from the prefix cache")
    twin = [o for o in others if o.cached_tokens and _budget(o) == _budget(s)]
    if twin:
        o = twin[0]
        ev += (f"; with the cache on in this file: TTFT p50 {ms(s.ttft['p50'])} -> {ms(o.ttft['p50'])}, TPOT p50 "
               f"{ms(s.tpot['p50'])} -> {ms(o.tpot['p50'])}, prefilled tokens {s.prefilled_tokens} -> "
               f"{o.prefilled_tokens}")
    return Finding("prefix-reuse", f"{tag}Prompts share a prefix the run recomputed: prefix reuse would cut TTFT.", ev,
                   "enable prefix caching (only full blocks are reused; the last prompt token is always recomputed); "
                   "expect TTFT to fall and TPOT to stay", src)


register("latency", "latency-interrupted", _interrupted, order=10)
register("latency", "requests-failed", lambda x: _failures(x.tag, x.ts, x.s, x.src), order=20)
register("latency", "latency-split", lambda x: _split(x.tag, x.ts, x.s, x.src, x.ratios), order=30)
register("latency", "latency-split-outside", lambda x: _outside(x.tag, x.ts, x.s, x.src), order=40)
register("latency", "queue-dominates", lambda x: _queue(x.tag, x.s, x.src), order=50)
register("latency", "chunk-stalls", lambda x: _stalls(x.tag, x.ts, x.s, x.src, x.others), order=60)
register("latency", "prefix-reuse", lambda x: _prefix(x.tag, x.ts, x.s, x.settings, x.src, x.others), order=70)
