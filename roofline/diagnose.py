"""Diagnosis: evidence from result files -> what bounds each phase -> what to try next (pure).

``diagnose(result_files)`` reads profile files (measurements) and latency files
(``request`` and ``latency-summary`` lines) and returns ``Finding``s: a claim, the
evidence line it rests on, and an action from the seed's table ("Choose a change from
evidence"):

* ``latency-split``      where TTFT and E2E go: queue, prefill, delivery, decode.
* ``queue-dominates``    queueing is most of TTFT: faster prefill will not help.
* ``chunk-stalls``       ITL spikes coincide with other requests' prefill chunks: smaller chunk budget.
* ``prefix-reuse``       prompts share full blocks the run did not reuse: turn prefix caching on.
* ``phase-bound``        per phase (and backend), the steps' verdicts from ``roofline.analysis`` (memory /
                         compute / overhead: under ``OVERHEAD_FRACTION`` of the roof is overhead).
* ``decode-weight-bound`` memory-bound linear layers dominate decode: quantize weights or more bandwidth.
* ``prefill-compute-bound`` compute-bound kernels dominate prefill: more compute.
* ``overhead-bound``     a phase far under its roof: launches and latency, not the hardware limits.
* ``cache-resident``     steps whose working set fit a cache level and ran above the DRAM roof
                         (``roofline.bounds``): judged against that level; the figures do not carry over to
                         a model or batch that does not fit.
* ``decode-batch``       decode throughput grows with batch: batch more, but check TPOT against its target.
* ``latency-floor``      TTFT p50 and TPOT p50 against the roofline floor of their stage (``roofline.floor``) on
                         the device given (or the ceilings of a profile run on the same device): how far above
                         what the hardware allows, and which roof; the split and decode-batch findings quote it.
* ``trace-uncosted``     a traced phase spends over ``TRACE_UNCOSTED`` of its time in ops the cost model does not
                         know: the verdict covers only the rest; name them.
* ``trace-not-modelled`` a traced phase spends over ``TRACE_EXTRA`` of its time in casts, copies, fills and
                         framework work the model's step does not need.
* ``trace-gpu-idle``     the traced GPU sits idle over ``TRACE_IDLE`` of its window; the cause holding half of the
                         idle time (``roofline.trace_idle``: host-bound, synchronisation, other) is named, and
                         "host-bound" is claimed only when the idle split says so.
* ``trace-collectives``  collectives take over ``TRACE_EXTRA`` of a traced phase, with their bus bandwidth.
* ``communication-bound`` tensor-parallel steps whose collectives take at least half of the step
                         (``roofline.bounds.COMM_DOMINANT``): the interconnect, not HBM, sets the step.
* ``expert-bound``       a mixture of experts' decode step dominated by its memory-bound experts op below the
                         batch from which every expert is loaded: expert weights, not the batch's tokens, set the
                         step; the batch where reuse recovers, and what to try.
* ``expert-imbalance``   the experts op ran over ``diagnose_experts.IMBALANCE_MARGIN`` x the time its uniform-routing cost predicts at
                         the run's own typical efficiency, at a point whose recorded routing sent one expert at
                         least ``IMBALANCE_MIN`` x the mean tokens: one expert's blocks set the grouped GEMM's time.
                         On a trace (``roofline trace --model``): the tokens per expert its expert GEMMs recorded,
                         summed per phase and MoE layer, one expert at least ``IMBALANCE_MIN`` x the mean of the
                         experts hit, that mean at least ``diagnose_experts.TRACE_MIN_MEAN`` tokens.
* ``weight-quantization-measured`` / ``kv-quantization-measured``, with ``*-effect`` and ``dequant-bound``:
                         a file holding a float and a quantized run of the same workload quotes the
                         measured effect against the roofline's prediction (``roofline.compare_rules``).

Actions fit the device kind (``advice``): a CPU is never told to use CUDA graphs.

Thresholds are named constants below, each with its reason.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from . import units as U
from .analysis import analyze
from .bounds import CACHE_RESIDENT, COMMUNICATION, COMPUTE, MEMORY, OVERHEAD, OVERHEAD_FRACTION
from .errors import RooflineError
from .latency import LatencySummary, latency_runs
from .stats import median
from .units import ms

DOMINANT = 0.5        # a share of time above half "dominates"
SPIKE_FACTOR = 2.0    # an ITL gap over 2x the pooled median is a spike (a skipped beat, not noise)
MIN_GAPS = 4          # fewer clean gaps than this: no baseline, no call
BATCH_GAIN = 1.5      # decode tokens/s at the largest batch vs the smallest: worth batching above this
BLOCK = 16            # prefix-cache block (tokens) when a file does not say


@dataclass(frozen=True)
class Finding:
    rule: str
    claim: str
    evidence: str
    action: str = ""
    source: str = ""
    data: dict = field(default_factory=dict)   # the numbers behind the claim, for --json (latency-floor)

    def to_dict(self) -> dict:
        d = {"rule": self.rule, "claim": self.claim, "evidence": self.evidence, "action": self.action,
             "source": self.source}
        if self.data:
            d["data"] = dict(self.data)
        return d

    def text(self) -> str:
        out = [f"- {self.claim}", f"    evidence: {self.evidence}"]
        if self.action:
            out.append(f"    try: {self.action}")
        return "\n".join(out)


def diagnose(result_files, *, model=None, device=None, dtype: str | None = None) -> list:
    """All findings for ``result_files`` (``records.ResultFile``), file by file.

    Latency runs get a floor (``latency-floor``) when a model config and a device with ceilings
    are known: ``model`` / ``device`` / ``dtype`` as given, else the file's own model and dtype
    and the ceilings of a profile file given alongside that ran on the same device.
    """
    out, floors = [], {}
    for rf in result_files:
        src = str(getattr(rf, "path", ""))
        noisy = noise_finding(rf, src)
        if noisy:
            out.append(noisy)             # said first: what follows rests on a busy machine's numbers
        if rf.measurements:
            out += profile_findings(rf, src)
        if rf.requests:
            ctx = floor_context(rf, result_files, model, device, dtype)
            out += latency_findings(rf, src, ctx, floors)
    return _with_tpot_targets(out, result_files, floors)


def floor_context(rf, result_files, model=None, device=None, dtype=None):
    """(model config, device, dtype) for the floors of latency file ``rf``, or None when one is unknown."""
    cfg = model if model is not None else rf.header.model
    dev = device
    if dev is None:
        same = [o.device for o in result_files if o.measurements and o.device.name == rf.device.name]
        dev = same[0] if same else None
    if cfg is None or dev is None or not dev.bandwidth > 0 or not dev.peak_flops:
        return None
    if dtype:
        return cfg, dev, dtype, "given with --dtype"
    return cfg, dev, rf.header.dtype, rf.header.settings.get("dtype_from") or "recorded by the run"


def _with_tpot_targets(findings, result_files, floors=None) -> list:
    """A decode-batch finding quotes the TPOT the latency runs given alongside measured, its target and floor."""
    notes = []
    floors = floors or {}
    for rf in result_files:
        for run in latency_runs(rf):
            s = run.summary
            target = s.slo.get("tpot")
            fl = [r for r in floors.get((str(getattr(rf, "path", "")), run.config), ()) if r.metric == "TPOT"]
            notes.append(f"[{run.config}] TPOT p90 {ms(s.tpot.get('p90', math.nan))}"
                         + (f" vs target {ms(target)}" if target else " (no TPOT target given)")
                         + (f"; p50 {fl[0].ratio:.1f}x its floor at {fl[0].floor.shape}" if fl else ""))
    if not notes:
        return findings
    out = []
    for f in findings:
        if f.rule == "decode-batch":
            f = Finding(f.rule, f.claim, f.evidence + "; latency runs: " + "; ".join(notes), f.action, f.source)
        out.append(f)
    return out


# ----------------------------------------------------------------- latency rules

def latency_findings(rf, src: str = "", floor_ctx=None, floors=None) -> list:
    """Findings per configuration; ``floor_ctx`` = (model config, device, dtype) adds the floors (kept in
    ``floors`` by (source, configuration) for the other rules)."""
    out = []
    runs = latency_runs(rf)
    others = [r.summary for r in runs]
    for run in runs:
        cfg, ts, s = run.config, list(run.timelines), run.summary
        tag = f"[{cfg}] " if cfg else ""
        ratios = []
        if floor_ctx is not None:
            f, ratios = _floors(tag, ts, s, floor_ctx, src)
            out += f
            if floors is not None:
                floors[(src, cfg)] = ratios
        if not run.complete:
            out.append(Finding("latency-interrupted", f"{tag}This configuration was interrupted: {len(ts)} requests "
                               "finished before it stopped, and the findings below use only those.",
                               f"no summary line for attempt {run.attempt} in the file",
                               "resume the run (the command printed at the interrupt, or the same command with "
                               "--resume) to measure it completely", src))
        out += [f for f in (_failures(tag, ts, s, src), _split(tag, ts, s, src, ratios), _outside(tag, ts, s, src),
                            _queue(tag, s, src), _stalls(tag, ts, s, src, others),
                            _prefix(tag, ts, s, rf.header.settings, src, others)) if f]
    return out


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


def _floors(tag, ts, s: LatencySummary, ctx, src) -> tuple:
    """([latency-floor findings], [FloorRatio]) for one configuration."""
    from .floor import latency_floors

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


# ----------------------------------------------------------------- profile rules

def _where(steps) -> str:
    return ", ".join(s.where for s in steps)


def noise_finding(rf, src: str = ""):
    """A "noisy-run" Finding when a large share of ``rf`` was measured on a busy host (``RunAnalysis.noisy``)."""
    try:
        a = analyze(rf)
    except RooflineError:
        return None
    if not a.noisy:
        return None
    held = [s for s in a.steps if not s.reliable]
    ev = (f"{len(held)} of {len(a.steps)} steps have no verdict (over a quarter of their time host-busy): "
          + ", ".join(f"{s.phase} {s.where}" for s in held[:6]) + ("..." if len(held) > 6 else "")
          if held else "flags host-busy on the points, the ceilings or the latency configurations")
    return Finding("noisy-run", a.noise_note, ev, "measure again when the machine is quiet (on a shared machine, "
                   "--threads one below the cores keeps OpenMP from waiting on a busy core)", src)


def profile_findings(rf, src: str = "") -> list:
    """Phase verdicts and what to try, from ``roofline.analysis`` steps: one set per backend when a
    file measured several (a triton and a torch step are different steps, never summed)."""
    try:
        a = analyze(rf)
    except RooflineError as e:
        return [Finding("phase-bound", "Cannot say what bounds each phase: the device has no ceilings.", str(e),
                        "run `roofline ceilings` and profile again, or pass a device with known peaks", src)]
    from .diagnose_experts import expert_findings   # it builds on this module's Finding and advice

    out = []
    several = len(a.backends) > 1
    for phase in ("prefill", "decode"):
        for backend in a.backends:
            ss = [s for s in a.phase_steps(phase, backend) if s.reliable]   # unreliable: said by noise_finding
            if ss:
                out += _phase_findings(phase, backend if several else "", ss, a.device, src)
    for backend in a.backends:
        f = decode_batch_finding(a, backend if several else "", src)
        if f:
            out.append(f)
        out += expert_findings(a, backend, several, src)
    if rf.header.kind == "trace":
        out += trace_findings(a, src)
    if rf.header.kind == "counters":
        out += counters_findings(a, src)
    from .compare_rules import measured_effect_findings   # it builds on this module's Finding

    out += measured_effect_findings(rf, src)
    return out


ADVICE = {   # (rule, device kind) -> what to try; "gpu" is also the advice for a device of unknown kind
    ("overhead-bound", "gpu"): "look at launches, synchronisation and small shapes: CUDA graphs, fused kernels, a "
                               "larger batch; more bandwidth or FLOP/s will not show",
    ("overhead-bound", "cpu"): "look at threads and call sizes: set the thread count to the physical cores "
                               "(torch.set_num_threads, OMP_NUM_THREADS; fewer threads for small shapes), pin the "
                               "OpenMP threads (OMP_PROC_BIND=close), a larger batch per call, bf16 only where the "
                               "CPU has fast paths for it (AMX, AVX512-BF16; else fp32); more bandwidth or FLOP/s "
                               "will not show",
    ("prefill-compute-bound", "gpu"): "more compute helps prefill (a faster GPU, tensor-core dtypes); reverse this "
                                      "if queueing or decode dominate what users wait for",
    ("prefill-compute-bound", "cpu"): "more compute helps prefill: all physical cores as threads "
                                      "(torch.set_num_threads), bf16 or int8 matmuls where the CPU has fast paths "
                                      "(AMX, AVX512-BF16/VNNI), or a GPU; reverse this if queueing or decode "
                                      "dominate what users wait for",
    ("cache-resident", "gpu"): "these steps ran from the L2, not HBM: profile the model and batch you will serve "
                               "(a working set past the L2 falls to the HBM roof) before trusting their times",
    ("cache-resident", "cpu"): "these steps ran from the CPU's cache, not DRAM: their times hold only while the "
                               "working set fits; profile the model and batch you will serve (a larger one falls "
                               "to the DRAM roof), and keep the thread count fixed (each core's cache is its own)",
    ("expert-bound", "gpu"): "expert parallelism (whole experts per GPU: each reads only its own experts' "
                             "weights, at the price of two all-to-alls per layer), or quantized experts (int8 / int4 "
                             "weights halve or quarter the expert bytes; check output quality)",
    ("expert-bound", "cpu"): "quantized experts (int8 / int4 weights halve or quarter the expert bytes; check output "
                             "quality); expert parallelism needs a second memory system (another socket or a GPU) to "
                             "spread the experts over",
}


def advice(rule: str, kind: str) -> str:
    """What to try for ``rule`` on a device of ``kind`` ("cpu" or "gpu")."""
    return ADVICE.get((rule, kind)) or ADVICE[(rule, "gpu")]


def _verdict(label: str) -> str:
    return "cache-resident" if label == CACHE_RESIDENT else f"{label}-bound"


def _cache_finding(name: str, ss, dev, src):
    """Steps judged against a cache level's roof (``roofline.bounds.roof_for``), or None."""
    cr = [s for s in ss if s.roof.level is not None]
    if not cr:
        return None
    levels = ", ".join(f"{s.where} in the {s.roof.level_name} ({U.nbytes(s.working_set_bytes)} of "
                       f"{U.nbytes(s.roof.level.size_bytes)}, {U.bandwidth(s.achieved_bytes_per_s)})" for s in cr)
    dram = U.bandwidth(cr[0].roof.dram_bandwidth)
    return Finding("cache-resident", f"{name} ran from cache at {_where(cr)}: faster than the {dram} DRAM roof "
                   "allows, so each is judged against the roof of the cache level that held its working set.",
                   f"working set in cache level (of its size) and the bandwidth reached: {levels}",
                   advice("cache-resident", dev.kind), src)


def _phase_findings(phase: str, backend: str, ss, dev, src) -> list:
    name = phase.capitalize() + (f" ({backend})" if backend else "")
    by_label = {lab: [s for s in ss if s.label == lab]
                for lab in (MEMORY, COMPUTE, OVERHEAD, CACHE_RESIDENT, COMMUNICATION)}
    label = max(by_label, key=lambda lab: (len(by_label[lab]), sum(s.time_s for s in by_label[lab])))
    big = max(ss, key=lambda s: s.time_s)
    sh, top = big.label_shares, big.top
    where = "; ".join(f"{lab} at {_where(x)}" for lab, x in by_label.items() if x)
    claim = (f"{name} is {_verdict(label)}"
             + (" at every measured batch and context." if len(by_label[label]) == len(ss) else
                f" at {len(by_label[label])} of {len(ss)} measured (batch, context) points."))
    ev = (f"{where} (each step's verdict: its summed cost against the roof). Largest step, batch {big.batch} "
          f"context {big.context}: {U.percent(big.roof_fraction)} of its roof; {100 * sh[MEMORY]:.0f}% of its time "
          f"in memory-bound kernels, {100 * sh[COMPUTE]:.0f}% compute-bound, {100 * sh[OVERHEAD]:.0f}% under "
          f"{OVERHEAD_FRACTION:.0%} of their roof"
          + (f", {100 * sh[CACHE_RESIDENT]:.0f}% cache-resident" if sh.get(CACHE_RESIDENT) else "")
          + f"; its largest kernel {top.op} {ms(top.instance_s)}, intensity "
          f"{top.point.cost.intensity:.1f} FLOP/B vs ridge {top.roof.ridge:.0f}, {100 * top.roof_fraction:.0f}% of "
          f"its {top.roof.level_name + ' ' if top.roof.level_name else ''}roof on {dev.name}")
    out = [Finding("phase-bound", claim, ev, "", src)]
    cache = _cache_finding(name, ss, dev, src)
    if cache:
        out.append(cache)
    cb = by_label[COMMUNICATION]
    if cb:
        shares = ", ".join(f"{s.where} {100 * s.comm_share:.0f}%" + (f" at {U.bandwidth(s.bus_bandwidth)} bus "
                                                                      "bandwidth" if s.wire_bytes else "")
                           for s in cb)
        link = next((s.link for s in cb if s.link is not None), None)
        out.append(Finding("communication-bound", f"{name} waits on collectives at {_where(cb)}: the interconnect, "
                           "not memory or compute, sets the step.",
                           f"share of the step in collectives: {shares}"
                           + (f"; the link: {U.bandwidth(link.bandwidth)} per direction ({link.source} {link.name})"
                              if link is not None else ""),
                           "use fewer tensor-parallel ranks for this model size (or pipeline parallelism), a larger "
                           "batch per step so each all-reduce carries more tokens, or a faster link (NVLink over "
                           "PCIe); custom all-reduce kernels cut the per-collective latency at small batch", src))
    if phase == "decode":
        wb = [s for s in ss if s.weight_memory_share >= DOMINANT]
        if wb:
            shares = ", ".join(f"{s.where} {100 * s.weight_memory_share:.0f}%" for s in wb)
            out.append(Finding("decode-weight-bound", f"{name} is waiting on weight movement at {_where(wb)}.",
                               f"share of the decode step in memory-bound linear layers (bytes dominated by "
                               f"weights): {shares}",
                               "test weight quantization (w8/w4) or a device with more memory bandwidth, checking "
                               "output quality and latency under the same workload", src))
    if phase == "prefill":
        cb = [s for s in ss if s.label_shares[COMPUTE] >= DOMINANT]
        if cb:
            shares = ", ".join(f"{s.where} {100 * s.label_shares[COMPUTE]:.0f}%" for s in cb)
            out.append(Finding("prefill-compute-bound", f"{name} is limited by arithmetic at {_where(cb)}.",
                               f"share of the prefill step in compute-bound kernels: {shares}",
                               advice("prefill-compute-bound", dev.kind), src))
    ob = [s for s in ss if s.label_shares[OVERHEAD] >= DOMINANT]
    if ob:
        shares = ", ".join(f"{s.where} {100 * s.label_shares[OVERHEAD]:.0f}%" for s in ob)
        out.append(Finding("overhead-bound", f"{name} kernels run far under their roof at {_where(ob)}: "
                           "neither bandwidth nor compute is the limit there.",
                           f"share of the step in kernels under {OVERHEAD_FRACTION:.0%} of their roof: {shares}",
                           advice("overhead-bound", dev.kind), src))
    return out


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


# ----------------------------------------------------------------- trace rules (roofline trace)

TRACE_UNCOSTED = 0.10   # under a tenth of a phase unknown, its verdict stands on the rest
TRACE_EXTRA = 0.10      # a tenth of a step in work the model does not need is worth removing
TRACE_IDLE = 0.20       # a GPU idle a fifth of its window is waiting on the host, not computing
_NOT_MODELLED = ("cast", "copy", "fill", "framework")


def counters_findings(a, src: str = "") -> list:
    """Nsight Compute against the model (``roofline.counters_join``): ``counters-bytes-over`` (DRAM bytes over
    1.5x the model's minimum), ``counters-bytes-under`` (under 0.67x: served by the L2), ``counters-flops``
    (FLOPs off by over 25%), ``counters-tensor-idle`` (a compute-bound GEMM with no tensor-core FLOPs)."""
    from .counters_join import counter_findings

    return counter_findings(a, src)


def trace_findings(a, src: str = "") -> list:
    """What a traced run adds to the phase verdicts: unknown ops, unneeded work, idle GPU, collectives."""
    out = []
    settings = a.header.settings
    for s in a.steps:
        name = s.phase.capitalize()
        if s.uncosted_share > TRACE_UNCOSTED:
            top = [u["op"] for u in settings.get("summary", {}).get("top_uncosted", [])][:4]
            out.append(Finding(
                "trace-uncosted", f"{name}: {U.percent(s.uncosted_share)} of the traced time is in ops the cost model "
                "does not know (uncosted): the verdict covers only the rest.",
                f"{U.seconds(s.uncosted_s)} uncosted of {U.seconds(s.traced_s)} per step" +
                (f"; largest: {', '.join(top)}" if top else ""),
                "record shapes (record_shapes=True), pass the framework's graph-capture trace for CUDA-graph "
                "replays (--capture-trace), or add the op's formula to roofline/formulas.py and its entry to "
                "roofline/trace_cost.py", src))
        extra = sum(r.time_s for r in s.ops if r.m.config.get("category") in _NOT_MODELLED)
        if s.traced_s and extra / s.traced_s > TRACE_EXTRA:
            kinds = defaultdict(float)
            for r in s.ops:
                c = r.m.config.get("category")
                if c in _NOT_MODELLED:
                    kinds[c] += r.time_s
            out.append(Finding(
                "trace-not-modelled", f"{name}: {U.percent(extra / s.traced_s)} of each step is work the model's "
                "step does not need (casts, copies, fills, framework overhead).",
                ", ".join(f"{k} {U.seconds(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])) +
                f" of {U.seconds(s.traced_s)} per step",
                "keep weights and activations in one dtype (no per-step casts), write the KV cache in place "
                "instead of concatenating, fuse elementwise chains (torch.compile), and capture decode in a CUDA "
                "graph", src))
        if s.communication_s and s.traced_s and s.communication_s / s.traced_s > TRACE_EXTRA:
            wire = sum(r.m.config.get("detail", {}).get("wire_bytes", 0) * r.count for r in s.off_roof)
            bw = f"; bus bandwidth {U.bandwidth(wire / s.communication_s)}" if wire else ""
            out.append(Finding(
                "trace-collectives", f"{name}: collectives take {U.percent(s.communication_s / s.traced_s)} of "
                "each step.", f"{U.seconds(s.communication_s)} per step in collectives{bw}",
                "overlap communication with compute, or use fewer tensor-parallel ranks for this model size", src))
    f = trace_idle_finding(settings, src)
    if f is not None:
        out.append(f)
    return out


def trace_idle_finding(settings: dict, src: str = ""):
    """``trace-gpu-idle``: the GPU idle over ``TRACE_IDLE`` of its window, with the cause the trace's idle split
    (``roofline.trace_idle``) shows holding at least half of it; host-bound is claimed only on that evidence."""
    g = settings.get("gpu_time") or {}
    if g.get("kind") != "gpu" or not g.get("window_s") or g["idle_s"] / g["window_s"] <= TRACE_IDLE:
        return None
    share = U.percent(g["idle_s"] / g["window_s"])
    busy = (f"busy {U.seconds(g['busy_s'])} (union of kernels and copies) of a {U.seconds(g['window_s'])} window; "
            f"kernel sum {U.seconds(g['kernel_sum_s'])}")
    idle = settings.get("idle") or {}
    if not idle.get("by_cause_s"):      # a result file written before the idle split: the old, general finding
        return Finding("trace-gpu-idle", f"The GPU is idle {share} of the traced window.", busy,
                       "cut launch overhead and host syncs: CUDA graphs for decode, no .item()/.cpu() in the step "
                       "loop, a larger batch per launch", src)
    c = idle["by_cause_s"]
    split = ", ".join(f"{k} {U.seconds(v)}" for k, v in c.items())
    ls = settings.get("launches") or {}
    launches = (f"; launch-to-start delay p50 {U.seconds(ls['delay_p50_s'])}, {ls['short_kernels']} of "
                f"{ls['kernels']} kernels shorter than their launch call" if ls.get("kernels") else "")
    evidence = f"idle {U.seconds(g['idle_s'])}: {split}; {busy}{launches}"
    phases = [p for p in (settings.get("phases") or {}) if p in ("prefill", "decode")]
    who = phases[0].capitalize() if len(phases) == 1 else "The traced run"
    d = idle.get("dominant")
    if idle.get("dominant_share", 0.0) < DOMINANT:
        return Finding("trace-gpu-idle", f"The GPU is idle {share} of the traced window, with no single cause "
                       "holding half of it.", evidence, "see the report's largest idle gaps and their causes", src)
    if d == "host-bound":
        ops = idle.get("host_ops") or [{"op": ""}]
        top = ops[0]["op"]
        where = "Python" if top.startswith("no op") else f"the host (mostly during {top})"
        return Finding("trace-gpu-idle", f"{who} is host-bound: the GPU is idle {share} of the traced window, "
                       f"waiting on launches from {where}.", evidence,
                       "CUDA graphs (one launch per step), fewer and larger kernels (torch.compile), and move "
                       "Python work (sampling, input preparation) off the step's critical path", src)
    if d == "synchronisation":
        return Finding("trace-gpu-idle", f"The GPU is idle {share} of the traced window, mostly after host "
                       "synchronisations: the host waits for the GPU, then launches late.", evidence,
                       "remove .item(), .cpu(), .tolist() and torch.cuda.synchronize() from the step loop; copy "
                       "results back with non_blocking=True into pinned memory and read them a step later", src)
    return Finding("trace-gpu-idle", f"The GPU is idle {share} of the traced window, though its work was already "
                   "queued: it waited on other streams or events, not on the host.", evidence,
                   "look for cross-stream waits (events, collectives on their own stream) in the timeline", src)
