"""Profile rules: what bounds each phase, and what to try (pure).

Registered in ``roofline.verdicts.findings``; the rule table (names, evidence, thresholds) is
``roofline.verdicts.diagnosis``'s docstring.

* scope ``phase`` (one phase of one backend, its reliable steps): ``phase-bound`` (10), ``cache-resident`` (20),
  ``communication-bound`` (30), ``decode-weight-bound`` (40), ``prefill-compute-bound`` (50),
  ``overhead-bound`` (60).
* scope ``backend``: ``decode-batch`` (10).
"""

from __future__ import annotations

from collections import defaultdict

from .. import units as U
from ..bounds import CACHE_RESIDENT, COMMUNICATION, COMPUTE, MEMORY, OVERHEAD, OVERHEAD_FRACTION
from ..units import ms
from .advice import advice
from .findings import DOMINANT, Finding, finding

BATCH_GAIN = 1.5      # decode tokens/s at the largest batch vs the smallest: worth batching above this
LABELS = (MEMORY, COMPUTE, OVERHEAD, CACHE_RESIDENT, COMMUNICATION)


def where(steps) -> str:
    """'b1 ctx512, b8 ctx512': the steps a finding names."""
    return ", ".join(s.where for s in steps)


def phase_name(phase: str, backend: str) -> str:
    return phase.capitalize() + (f" ({backend})" if backend else "")


def _verdict(label: str) -> str:
    return "cache-resident" if label == CACHE_RESIDENT else f"{label}-bound"


def _by_label(ss) -> dict:
    return {lab: [s for s in ss if s.label == lab] for lab in LABELS}


@finding("phase", "phase-bound", order=10)
def phase_bound(phase: str, backend: str, ss, dev, src: str = ""):
    """The phase's verdict: the label most of its steps carry, with the largest step's shares as evidence."""
    name = phase_name(phase, backend)
    by_label = _by_label(ss)
    label = max(by_label, key=lambda lab: (len(by_label[lab]), sum(s.time_s for s in by_label[lab])))
    big = max(ss, key=lambda s: s.time_s)
    sh, top = big.label_shares, big.top
    at = "; ".join(f"{lab} at {where(x)}" for lab, x in by_label.items() if x)
    claim = (f"{name} is {_verdict(label)}"
             + (" at every measured batch and context." if len(by_label[label]) == len(ss) else
                f" at {len(by_label[label])} of {len(ss)} measured (batch, context) points."))
    ev = (f"{at} (each step's verdict: its summed cost against the roof). Largest step, batch {big.batch} "
          f"context {big.context}: {U.percent(big.roof_fraction)} of its roof; {100 * sh[MEMORY]:.0f}% of its time "
          f"in memory-bound kernels, {100 * sh[COMPUTE]:.0f}% compute-bound, {100 * sh[OVERHEAD]:.0f}% under "
          f"{OVERHEAD_FRACTION:.0%} of their roof"
          + (f", {100 * sh[CACHE_RESIDENT]:.0f}% cache-resident" if sh.get(CACHE_RESIDENT) else "")
          + f"; its largest kernel {top.op} {ms(top.instance_s)}, intensity "
          f"{top.point.cost.intensity:.1f} FLOP/B vs ridge {top.roof.ridge:.0f}, {100 * top.roof_fraction:.0f}% of "
          f"its {top.roof.level_name + ' ' if top.roof.level_name else ''}roof on {dev.name}")
    return Finding("phase-bound", claim, ev, "", src)


@finding("phase", "cache-resident", order=20)
def cache_resident(phase: str, backend: str, ss, dev, src: str = ""):
    """Steps judged against a cache level's roof (``roofline.bounds.roof_for``), or None."""
    cr = [s for s in ss if s.roof.level is not None]
    if not cr:
        return None
    levels = ", ".join(f"{s.where} in the {s.roof.level_name} ({U.nbytes(s.working_set_bytes)} of "
                       f"{U.nbytes(s.roof.level.size_bytes)}, {U.bandwidth(s.achieved_bytes_per_s)})" for s in cr)
    dram = U.bandwidth(cr[0].roof.dram_bandwidth)
    return Finding("cache-resident", f"{phase_name(phase, backend)} ran from cache at {where(cr)}: faster than the "
                   f"{dram} DRAM roof allows, so each is judged against the roof of the cache level that held its "
                   "working set.", f"working set in cache level (of its size) and the bandwidth reached: {levels}",
                   advice("cache-resident", dev.kind), src)


@finding("phase", "communication-bound", order=30)
def communication_bound(phase: str, backend: str, ss, dev, src: str = ""):
    cb = _by_label(ss)[COMMUNICATION]
    if not cb:
        return None
    shares = ", ".join(f"{s.where} {100 * s.comm_share:.0f}%" + (f" at {U.bandwidth(s.bus_bandwidth)} bus "
                                                                  "bandwidth" if s.wire_bytes else "")
                       for s in cb)
    link = next((s.link for s in cb if s.link is not None), None)
    return Finding("communication-bound", f"{phase_name(phase, backend)} waits on collectives at {where(cb)}: the "
                   "interconnect, not memory or compute, sets the step.",
                   f"share of the step in collectives: {shares}"
                   + (f"; the link: {U.bandwidth(link.bandwidth)} per direction ({link.source} {link.name})"
                      if link is not None else ""),
                   "use fewer tensor-parallel ranks for this model size (or pipeline parallelism), a larger "
                   "batch per step so each all-reduce carries more tokens, or a faster link (NVLink over "
                   "PCIe); custom all-reduce kernels cut the per-collective latency at small batch", src)


@finding("phase", "decode-weight-bound", order=40)
def decode_weight_bound(phase: str, backend: str, ss, dev, src: str = ""):
    wb = [s for s in ss if s.weight_memory_share >= DOMINANT] if phase == "decode" else []
    if not wb:
        return None
    shares = ", ".join(f"{s.where} {100 * s.weight_memory_share:.0f}%" for s in wb)
    return Finding("decode-weight-bound", f"{phase_name(phase, backend)} is waiting on weight movement at "
                   f"{where(wb)}.",
                   f"share of the decode step in memory-bound linear layers (bytes dominated by weights): {shares}",
                   "test weight quantization (w8/w4) or a device with more memory bandwidth, checking "
                   "output quality and latency under the same workload", src)


@finding("phase", "prefill-compute-bound", order=50)
def prefill_compute_bound(phase: str, backend: str, ss, dev, src: str = ""):
    cb = [s for s in ss if s.label_shares[COMPUTE] >= DOMINANT] if phase == "prefill" else []
    if not cb:
        return None
    shares = ", ".join(f"{s.where} {100 * s.label_shares[COMPUTE]:.0f}%" for s in cb)
    return Finding("prefill-compute-bound", f"{phase_name(phase, backend)} is limited by arithmetic at {where(cb)}.",
                   f"share of the prefill step in compute-bound kernels: {shares}",
                   advice("prefill-compute-bound", dev.kind), src)


@finding("phase", "overhead-bound", order=60)
def overhead_bound(phase: str, backend: str, ss, dev, src: str = ""):
    ob = [s for s in ss if s.label_shares[OVERHEAD] >= DOMINANT]
    if not ob:
        return None
    shares = ", ".join(f"{s.where} {100 * s.label_shares[OVERHEAD]:.0f}%" for s in ob)
    return Finding("overhead-bound", f"{phase_name(phase, backend)} kernels run far under their roof at {where(ob)}: "
                   "neither bandwidth nor compute is the limit there.",
                   f"share of the step in kernels under {OVERHEAD_FRACTION:.0%} of their roof: {shares}",
                   advice("overhead-bound", dev.kind), src)


@finding("backend", "decode-batch", order=10)
def decode_batch(a, backend: str, several: bool, src: str = ""):
    return decode_batch_finding(a, backend if several else "", src)


def decode_batch_finding(a, backend: str = "", src: str = ""):
    """Fires when decode tokens/s at the largest measured batch beat the smallest by BATCH_GAIN
    (same backend, same context; the largest gain over the measured contexts is quoted)."""
    by_ctx = defaultdict(dict)
    for s in a.phase_steps("decode", backend or None):
        by_ctx[s.context][s.batch] = s.time_s + s.communication_s   # a tensor-parallel step waits on its collectives
    best = None
    for c, bt in by_ctx.items():
        if len(bt) < 2:
            continue
        b0, b1 = min(bt), max(bt)
        gain = (b1 / bt[b1]) / (b0 / bt[b0])
        if best is None or gain > best[0]:
            best = (gain, c, b0, bt[b0], b1, bt[b1])
    if best is None or best[0] < BATCH_GAIN:
        return None
    gain, c, b0, t0, b1, t1 = best
    on = f" ({backend})" if backend else ""
    return Finding("decode-batch", f"A larger decode batch would raise throughput{on}.",
                   f"decode{on} at context {c}: batch {b0} takes {ms(t0)} per step, batch {b1} takes {ms(t1)} "
                   f"({t1 / t0:.2f}x the time for {b1 / b0:g}x the tokens: {gain:.1f}x tokens/s)",
                   "batch more decoding sequences, but measure TPOT against its target: each user waits longer "
                   "between tokens as the step grows", src)


