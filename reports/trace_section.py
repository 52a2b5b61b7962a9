"""The part of a report only a trace has (header kind "trace"): where the traced time went.

``trace_facts(analysis)`` gives sentences (GPU busy and idle time, the shares of costed,
uncosted, collective and framework time, the phases and how they were found, the cost
model's expectation for ``--model``); ``top_rows(analysis)`` the top ops by time per step
with their roof % and label, uncosted ones included with their share. HTML and markdown
both render these; every number comes from the header's settings (what ``roofline trace``
measured) or from ``roofline.analysis``.
"""

from __future__ import annotations

import math

from roofline import units as U
from roofline.traces import cost as trace_cost
from roofline.traces.comms import collective_lines
from roofline.traces.analyze import attribution_lines
from roofline.traces.idle import cpu_where, idle_sentence
from roofline.traces.phases import phase_text

TOP_COLUMNS = ("phase", "op", "kind", "instances / step", "time / step", "share of phase", "FLOP/byte", "roof %",
               "label")
TOP_N = 20


def is_trace(rf) -> bool:
    return rf.header.kind == "trace"


def _pct(x) -> str:
    return U.percent(x) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def trace_facts(analysis) -> list[str]:
    h = analysis.header
    st = h.settings
    g, s = st.get("gpu_time") or {}, st.get("summary") or {}
    out = [f"Trace {st.get('trace', '')} (rank {st.get('rank', 0)} of {st.get('world_size', 1)}); device: "
           f"{st.get('device_from', h.device.name)}."]
    if s.get("attributed_s"):
        share = s.get("costed_share", s["costed_s"] / s["attributed_s"])
        out.append(f"Costed (FLOPs and bytes known): {_pct(share)} of the "
                   f"{'GPU' if g.get('kind') == 'gpu' else 'traced'} time ({U.seconds(s['costed_s'])} of "
                   f"{U.seconds(s['attributed_s'])}).")
    if g.get("kind") == "gpu":
        out.append(f"GPU busy {U.seconds(g['busy_s'])} (the union of {g['kernels']} kernels and copies on "
                   f"{g['streams']} stream(s): overlapping kernels count once), idle {U.seconds(g['idle_s'])} of a "
                   f"{U.seconds(g['window_s'])} window; kernel sum {U.seconds(g['kernel_sum_s'])}; memcpy "
                   f"{U.seconds(g['memcpy_s'])}, memset {U.seconds(g['memset_s'])}; kernels that joined no op "
                   f"{U.seconds(g['unattributed_s'])}; {g.get('graph_kernels', 0)} kernel(s) in CUDA-graph replays.")
        idle = idle_sentence(st.get("idle") or {}, g["window_s"])
        if idle:
            out.append(f"{idle}.")
        gaps = (st.get("idle") or {}).get("largest") or []
        if gaps:
            out.append("Largest idle gaps (from the first GPU activity): " + "; ".join(
                f"at {U.seconds(x['at_s'])} {U.seconds(x['gap_s'])} {x['cause']}"
                + (f" ({cpu_where(x['cpu_op'])})" if x.get("cpu_op") else "") for x in gaps[:5]) + ".")
        ls = st.get("launches") or {}
        if ls.get("kernels"):
            short = (f"{ls['short_kernels']} kernel(s) ran shorter than their launch call "
                     f"({U.seconds(ls['short_s'])}): launch overhead dominates them" if ls.get("short_kernels")
                     else "no kernel ran shorter than its launch call")
            out.append(f"Kernel launches: launch-to-start delay p50 {U.seconds(ls['delay_p50_s'])}, p90 "
                       f"{U.seconds(ls['delay_p90_s'])}, max {U.seconds(ls['delay_max_s'])} over {ls['kernels']} "
                       f"kernel(s); {short}.")
        out += [f"{x[0].upper()}{x[1:]}." for x in attribution_lines(st.get("attribution") or {}, g)]
    elif g:
        out.append(f"A CPU trace: ops busy {U.seconds(g['busy_s'])} in a {U.seconds(g['window_s'])} window (each "
                   "op's own duration is its time).")
    tot = s.get("attributed_s") or 0.0
    if tot:
        out.append(f"Of {U.seconds(tot)} traced: costed {_pct(s['costed_s'] / tot)}, uncosted "
                   f"{_pct(s['uncosted_s'] / tot)} (ops the cost table does not know: counted, never costed), "
                   f"collectives {_pct(s['communication_s'] / tot)}, framework {_pct(s['framework_s'] / tot)}; "
                   f"outside the phases {U.seconds(s.get('outside_phases_s', 0.0))}.")
    out += collective_lines(st.get("collectives") or {})
    for p, ph in (st.get("phases") or {}).items():
        t = phase_text(p, ph)
        out.append(f"{t[0].upper()}{t[1:]}; found by {ph['method']}.")
    for p, e in (st.get("model_expectation") or {}).items():
        if "error" in e:
            out.append(f"The cost model for {h.model_name} ({p}): {e['error']}")
            continue
        out.append(f"The cost model for {h.model_name} ({p}, batch {e['batch']}, context {e['context']}): "
                   f"{U.flops(e['model_flops'])} and {U.nbytes(e['model_bytes'])} per step, "
                   f"{U.seconds(e['model_roof_s'])} at the roof. The trace: {U.flops(e['traced_flops'])} and "
                   f"{U.nbytes(e['traced_bytes'])} costed, {U.seconds(e['traced_step_s'])} per step, "
                   f"{U.seconds(e['not_modelled_s'])} of it in casts, copies, fills and framework work the model "
                   "does not need.")
    if (st.get("experts") or {}).get("sentence"):       # tokens per expert (roofline.traces.experts)
        out.append(st["experts"]["sentence"])
    return out


def top_rows(analysis, n: int = TOP_N):
    """(display, sort key) cells of the ops with the most time per step, every phase together."""
    rows = []
    for step in analysis.steps:
        total = step.traced_s or 1.0
        for r in list(step.ops) + list(step.off_roof):
            rows.append((step, r, r.time_s / total))
    rows.sort(key=lambda x: -x[1].time_s)
    for step, r, share in rows[:n]:
        p = r.point
        kind = r.off_roof or r.m.config.get("category", "")
        frac = r.roof_fraction
        yield [(p.phase, p.phase), (p.op, p.op), (kind, kind), (f"{r.count:.3g}", r.count),
               (U.seconds(r.time_s), r.time_s), (_pct(share), share),
               (U.intensity(p.cost.intensity) if not r.off_roof else "-", p.cost.intensity),
               (_pct(frac), frac if frac == frac else -1.0), (r.label, r.label)]


def conventions() -> str:
    """How a trace's ops are costed and where that differs from TraceLens (a rule file (roofline/traces/rules/, or your own through load_rules)'s docstring)."""
    doc = trace_cost.__doc__ or ""
    i = doc.find("The table")
    return doc[i:].strip() if i >= 0 else doc.strip()
