"""``run_trace``: a profiler trace -> a result file (kind "trace") + its summary; what ``roofline trace`` runs.

    from profiler.trace_run import TraceRun, run_trace
    r = run_trace(TraceRun("trace.json.gz", out="roofline-trace"))
    r.path, r.summary, r.text()

Reading, joining, costing and phases are pure (``roofline.traces``); this module picks the
device and its ceilings, writes the result file with ``ResultWriter`` (the one writer),
and renders the report. Device: ``--device`` / ``--device-file`` / ``--peak-tflops`` win;
else the GPU the trace names (``deviceProperties``); a CPU trace is judged against this
machine's measured (cached) CPU ceilings. ``ceilings`` (a results file ``roofline profile``
wrote on that box) replaces the datasheet with the ceilings measured there.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from roofline import units as U
from roofline.analysis import analyze
from roofline.errors import RooflineError
from roofline.records import RunHeader, read_results
from roofline.traces.analyze import analyze_trace, attribution_lines, kernel_breakdown, model_expectation, op_rows
from roofline.traces.comms import collective_lines, collectives
from roofline.traces.device import trace_device
from roofline.traces.events import read_traces
from roofline.traces.idle import idle_sentence
from roofline.traces.phases import parse_markers, phase_text
from roofline.writer import ResultWriter


from . import ceilings as C
from . import probes
from .run import started

GRAPH_UNKNOWN_HOW = ("each replayed kernel is listed by its kernel name, time and category (costed where a "
                     "kernel-name rule applies: with --model and an engine step that says its tokens, a replay that "
                     "follows the model's layer is sized kernel by kernel from each one's place in it; else "
                     "uncosted: no shapes). For op-level detail, profile the graph "
                     "capture as well (start torch.profiler with record_shapes=True before the graphs are captured: "
                     "vLLM captures at engine start-up; or record one eager step of the same batch) and pass that "
                     "trace with --capture-trace.")


@dataclass
class TraceRun:
    trace: str                                   # a trace file or a folder of per-rank traces
    out: str = "roofline-trace"
    captures: tuple = ()                         # graph-capture traces (files or folders)
    markers: tuple = ()                          # "PHASE=NAME" specs
    model: object = None                         # ModelConfig for the expectation
    device: object = None                        # a Device that overrides the trace's
    peak_of_trace_dtype: bool = False            # device is --peak-tflops/--bandwidth-gbs: its peak is the trace's dtype's
    ceilings: str | None = None                  # a results file whose measured ceilings classify
    rank: int | None = None                      # the rank written (default: the lowest)
    mix: object = None                           # engine steps' KV lengths (roofline.traces.engine_steps.StepMix)
    mode: str = "new"
    report: bool = True
    png: bool = False                            # the report's figures as PNG too (matplotlib); else SVG only
    command: str = ""


@dataclass
class TraceRunResult:
    path: Path | None                            # None: no device to judge against, so no results file
    summaries: list                              # one summary per rank
    steps: list                                  # roofline.analysis.Step of the written rank
    header: RunHeader
    notes: list = field(default_factory=list)
    report: dict | None = None
    expectation: dict = field(default_factory=dict)
    breakdown: list = field(default_factory=list)   # (category, s, kernels) when no shapes were recorded
    collectives: dict = field(default_factory=dict)  # roofline.traces.comms.collectives across the ranks
    ops: list = field(default_factory=list)          # per traced op and shape (analyze.op_rows), the written rank
    device_from: str = ""                            # how the device was found, or what to pass when it was not
    rank: int = 0                                    # the rank written (its summary is the one shown in full)

    @property
    def judged(self) -> bool:
        """Whether the ops were put on a roofline (a device was known or given)."""
        return self.header is not None

    def to_json(self) -> dict:
        return {"results": str(self.path) if self.path else None,
                "report": str(self.report["html"]) if self.report else None,
                "device": self.header.device.name if self.header else None, "device_from": self.device_from,
                "roofline": None if self.judged else self.device_from,
                "dtype": self.header.dtype if self.header else None, "ranks": self.summaries, "ops": self.ops,
                "steps": [{"phase": s.phase, "batch": s.batch, "context": s.context, "label": s.label,
                           "roof_fraction": s.roof_fraction, "time_s": s.time_s, "traced_s": s.traced_s,
                           "uncosted_share": s.uncosted_share, "sentence": s.sentence} for s in self.steps],
                "model_expectation": self.expectation, "kernel_breakdown": self.breakdown,
                "collectives": self.collectives,
                "experts": next(x for x in self.summaries if x["rank"] == self.rank).get("experts"),
                "notes": self.notes}

    def text(self) -> str:
        return summary_text(self)


def _device(run: TraceRun, traces, say) -> tuple:
    """(classifying Device, datasheet Device | None, ceilings details, how)."""
    if run.ceilings:
        rf = read_results(run.ceilings)
        dev, sheet = rf.header.device, rf.header.datasheet
        how = f"ceilings measured by `roofline {rf.header.kind}` in {run.ceilings} ({dev.name}, {dev.source})"
        named, _ = trace_device(traces) if run.device is None else (run.device, "")
        if named is not None and sheet is not None and named.key != sheet.key:
            say(f"note: the trace ran on {named.name}, the ceilings file measured {sheet.name}: classified against "
                "the ceilings file as asked.")
        return dev, sheet, dict(rf.header.ceilings), how
    cpu_asked = run.device is not None and run.device.kind == "cpu" and not run.device.peak_flops
    if run.device is not None and not cpu_asked:
        d = run.device
        return d, d if d.source == "datasheet" else None, {}, f"{d.name} as given ({d.source})"
    dev, how = (None, "--device cpu") if cpu_asked else trace_device(traces)
    if dev is not None:
        return dev, dev, {}, how
    if any(t.is_gpu for t in traces) and not cpu_asked:     # no device: every analysis that needs none still runs
        if not how.startswith("the trace ran on"):
            how = (f"{how}: pass --device (e.g. h100, a100, mi300x) or --device-file to say which GPU it ran on, to "
                   "put its ops on the roofline.")
        return None, None, {}, how
    say("note: a CPU trace: judged against this machine's measured CPU ceilings (cached; `roofline ceilings` "
        "measures them). If the trace came from another machine, pass --ceilings or --device-file.")
    c = C.get_ceilings("cpu")
    return c.device, c.datasheet, dict(c.details), f"{how}: this machine's measured CPU ceilings"


def _retyped(dev, dtype: str):
    """A custom device whose one given peak applies to ``dtype`` (the trace's), not to the bf16 it was built for."""
    peak = next(iter(dev.peak_flops.values()))
    return replace(dev, peak_flops={dtype: peak}, provenance=dev.provenance.replace(" bf16,", f" {dtype},"))


def run_trace(run: TraceRun, say=lambda m: None) -> TraceRunResult:
    """Read, cost, write and report one trace (see the module docstring).

    The cyclic garbage collector stays off for the run: a large trace is millions of small
    acyclic objects, and a collection of that heap costs more than the parse itself.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _run(run, say)
    finally:
        if paused:
            gc.enable()


def _run(run: TraceRun, say) -> TraceRunResult:
    traces = read_traces(run.trace)
    captures = [t for c in run.captures for t in read_traces(c)]
    markers = parse_markers(run.markers)
    ranks = [t.rank for t in traces]
    rank = ranks[0] if run.rank is None else run.rank
    if rank not in ranks:
        raise RooflineError(f"--rank {rank}: the trace holds rank(s) {', '.join(map(str, ranks))}.")
    dev, sheet, details, how = _device(run, traces, say)
    results = {t.rank: analyze_trace(t, model=run.model, markers=markers, captures=captures,
                                     device_name=dev.name if dev else "", mix=run.mix) for t in traces}
    mine = results[rank]
    trace = next(t for t in traces if t.rank == rank)
    notes = list(mine.notes)
    if dev is not None and run.peak_of_trace_dtype and mine.dtype not in dev.peak_flops:
        dev = _retyped(dev, mine.dtype)
        notes.append(f"--peak-tflops is taken as the {mine.dtype} peak: the trace computes in {mine.dtype}.")
    breakdown = []
    if not trace.has_shapes:
        notes.append(f"{trace.path.name} was recorded without shapes (record_shapes=False): no op can be costed; "
                     "below is GPU time by kernel name only. Record with record_shapes=True (roofline.capture does).")
        breakdown = [list(x) for x in kernel_breakdown(trace)]
    if captures and "graph_kernels_mapped" in mine.summary:
        s = mine.summary
        notes.append(f"graph replays: {s['graph_kernels_mapped']} replayed kernel(s) mapped to captured ops by name "
                     f"and order, {s['graph_kernels_unmapped']} not (uncosted).")
    elif trace.is_gpu and mine.summary["time"].get("graph_kernels"):
        notes.append(f"{mine.summary['time']['graph_kernels']} kernel(s) ran in CUDA-graph replays with no capture "
                     f"trace: {GRAPH_UNKNOWN_HOW}")
    g = mine.summary["time"]
    if g.get("before_window"):
        notes.append(f"{g['before_window']} kernel(s), {U.seconds(g['before_window_s'])}, were launched before the "
                     "profiler window (no launch call in the trace): counted apart, charged to no op.")
    comms = collectives(traces, dev.link if dev else None)
    if dev is None:     # kernel attribution, idle time, collectives and the ops' costs: no result file, no roofline
        return TraceRunResult(None, [results[r].summary for r in sorted(results)], [], None, notes, None, {},
                              breakdown, comms, op_rows(mine.measurements), how, rank)
    expectation = model_expectation(mine, run.model, dev) if run.model is not None else {}
    settings = {"trace": str(run.trace), "rank": rank, "ranks": ranks, "world_size": trace.world_size,
                "captures": [str(c) for c in run.captures], "phase_markers": {k: list(v) for k, v in markers.items()},
                "device_from": how, "phases": mine.summary["phases"], "gpu_time": mine.summary["time"],
                "summary": {k: mine.summary[k] for k in ("attributed_s", "costed_s", "framework_s", "uncosted_s",
                                                          "communication_s", "uncosted_share", "costed_share",
                                                          "outside_phases_s",
                                                          "by_category_s", "top_uncosted")},
                "model_expectation": expectation, "idle": mine.summary.get("idle", {}),
                "launches": mine.summary.get("launches", {}), "attribution": mine.summary.get("attribution", {}),
                "collectives": comms}
    if "experts" in mine.summary:
        settings["experts"] = mine.summary["experts"]     # tokens per expert (roofline.traces.experts)
    header = RunHeader(device=dev, datasheet=sheet, ceilings=details, model=run.model, kind="trace",
                       dtype=mine.dtype, settings=settings, versions=probes.light_versions(),   # the reader's
                       git_sha=probes.git_sha(), command=run.command, started=started())
    out = Path(run.out)
    path = out / "results.jsonl"
    with ResultWriter(path, mode=run.mode) as w:
        w.begin(header)
        for m in mine.measurements:
            w.write(m)
    rf = read_results(path)
    steps = analyze(rf).steps if mine.measurements else []
    report = None
    if run.report and mine.measurements:
        from reports import write_report     # its own SVGs: matplotlib only with png
        report = write_report([rf], out, own_svg=True, png=run.png)
    return TraceRunResult(path, [results[r].summary for r in sorted(results)], steps, header, notes, report,
                          expectation, breakdown, comms, op_rows(mine.measurements), how, rank)


def _pct(x) -> str:
    return U.percent(x) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def summary_text(r: TraceRunResult) -> str:
    """What ``roofline trace`` prints: GPU time per rank, shares, phases, verdicts, top ops."""
    lines = []
    for s in r.summaries:
        g = s["time"]
        head = f"rank {s['rank']} of {s['world_size']}: " if s["world_size"] > 1 or len(r.summaries) > 1 else ""
        if g["kind"] == "gpu":
            busy = g["busy_s"]
            lines.append(f"{head}GPU busy {U.seconds(busy)} (union of {g['kernels']} kernels and copies on "
                         f"{g['streams']} stream(s)); kernel sum {U.seconds(g['kernel_sum_s'])}; idle "
                         f"{U.seconds(g['idle_s'])} of a {U.seconds(g['window_s'])} window; memcpy "
                         f"{U.seconds(g['memcpy_s'])}, memset {U.seconds(g['memset_s'])}; unattributed "
                         f"{U.seconds(g['unattributed_s'])}")
            idle = idle_sentence(s.get("idle") or {}, g["window_s"])
            if idle:
                lines.append(f"{head}{idle}")
            lines.extend(f"{head}{x}" for x in attribution_lines(s.get("attribution") or {}, g))
        else:
            lines.append(f"{head}CPU trace: ops busy {U.seconds(g['busy_s'])} (each op's own duration) in a "
                         f"{U.seconds(g['window_s'])} window")
        tot = s["attributed_s"] or 1.0
        lines.append(f"{head}costed (FLOPs and bytes known): {_pct(s['costed_share'])} of "
                     f"{'GPU' if g['kind'] == 'gpu' else 'traced'} time ({U.seconds(s['costed_s'])} of "
                     f"{U.seconds(s['attributed_s'])})")
        lines.append(f"{head}time by kind: costed {_pct(s['costed_s'] / tot)}, uncosted {_pct(s['uncosted_s'] / tot)}, "
                     f"communication {_pct(s['communication_s'] / tot)}, framework {_pct(s['framework_s'] / tot)} "
                     f"of {U.seconds(s['attributed_s'])}")
    lines.extend(collective_lines(r.collectives))
    s = next(x for x in r.summaries if x["rank"] == r.rank)
    for p, ph in s["phases"].items():
        lines.append(f"{phase_text(p, ph)}; phases by {ph['method']}")
    if r.header:
        lines.append(f"device: {r.header.device.name} ({r.header.settings['device_from']})")
    else:
        lines.append(f"roofline: not drawn: {r.device_from}")
    for st in r.steps:
        lines.append(f"[{st.label}] {st.sentence}")
    if s["top_ops"]:
        lines.append(f"{'top ops by time':<64}{'time':>10}{'share':>8}{'n':>6}  kind")
        for o in s["top_ops"][:10]:
            lines.append(f"{o['op'][:63]:<64}{U.seconds(o['time_s']):>10}{_pct(o['share']):>8}{o['instances']:>6}  "
                         f"{o['kind']}")
    for p, e in r.expectation.items():
        if "error" in e:
            lines.append(f"model expectation ({p}): {e['error']}")
            continue
        lines.append(f"model expectation ({p}, batch {e['batch']}, context {e['context']}): "
                     f"{U.flops(e['model_flops'])} and {U.nbytes(e['model_bytes'])} per step, "
                     f"{U.seconds(e['model_roof_s'])} at the roof; traced {U.flops(e['traced_flops'])}, "
                     f"{U.nbytes(e['traced_bytes'])}, {U.seconds(e['traced_step_s'])} per step, of which "
                     f"{U.seconds(e['not_modelled_s'])} in casts, copies, fills and framework the model does not need")
    if s.get("experts"):
        lines.append(s["experts"]["sentence"])
    for c, sec, n in r.breakdown:
        lines.append(f"  {c:<16}{U.seconds(sec):>10}  {n} kernel(s)")
    if r.path:
        lines.append(f"results: {r.path}")
    if r.report:
        lines.append(f"report: {r.report['html']}")
    return "\n".join(lines)
