"""Trace rules (``roofline trace``): what a traced run adds to the phase verdicts (pure).

Registered in ``roofline.verdicts.findings``, scope ``run`` at order 10: ``trace-uncosted``,
``trace-not-modelled``, ``trace-collectives`` per traced phase, then ``trace-gpu-idle`` (the cause the trace's
idle split holds, ``roofline.traces.idle``). The rule table is ``roofline.verdicts.diagnosis``'s docstring.
"""

from __future__ import annotations

from collections import defaultdict

from .. import units as U
from .findings import DOMINANT, Finding, finding

TRACE_UNCOSTED = 0.10   # under a tenth of a phase unknown, its verdict stands on the rest
TRACE_EXTRA = 0.10      # a tenth of a step in work the model does not need is worth removing
TRACE_IDLE = 0.20       # a GPU idle a fifth of its window is waiting on the host, not computing
_NOT_MODELLED = ("cast", "copy", "fill", "framework")


@finding("run", "trace", order=10)
def traced_run(rf, a, src: str = "") -> list:
    """The trace rules, for a trace file only."""
    return trace_findings(a, src) if rf.header.kind == "trace" else []


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
                "replays (--capture-trace), or cost the op with a rule of your own (a Python file of @rule entries, "
                "roofline.traces.registry.load_rules)", src))
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
    (``roofline.traces.idle``) shows holding at least half of it; host-bound is claimed only on that evidence."""
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
