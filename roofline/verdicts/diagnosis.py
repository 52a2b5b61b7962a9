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
                         idle time (``roofline.traces.idle``: host-bound, synchronisation, other) is named, and
                         "host-bound" is claimed only when the idle split says so.
* ``trace-collectives``  collectives take over ``TRACE_EXTRA`` of a traced phase, with their bus bandwidth.
* ``communication-bound`` tensor-parallel steps whose collectives take at least half of the step
                         (``roofline.bounds.COMM_DOMINANT``): the interconnect, not HBM, sets the step.
* ``expert-bound``       a mixture of experts' decode step dominated by its memory-bound experts op below the
                         batch from which every expert is loaded: expert weights, not the batch's tokens, set the
                         step; the batch where reuse recovers, and what to try.
* ``expert-imbalance``   the experts op ran over ``expert_rules.IMBALANCE_MARGIN`` x the time its uniform-routing cost predicts at
                         the run's own typical efficiency, at a point whose recorded routing sent one expert at
                         least ``IMBALANCE_MIN`` x the mean tokens: one expert's blocks set the grouped GEMM's time.
                         On a trace (``roofline trace --model``): the tokens per expert its expert GEMMs recorded,
                         summed per phase and MoE layer, one expert at least ``IMBALANCE_MIN`` x the mean of the
                         experts hit, that mean at least ``expert_rules.TRACE_MIN_MEAN`` tokens.
* ``speculation-pays`` / ``speculation-does-not-pay``: on whole measured decode steps (one device), a verify step
                         of ``spec_rules.SPEC_K`` drafts priced against the decode step at the roof: memory-bound
                         steps whose break-even acceptance is at most ``spec_rules.SPEC_ACCEPTANCE`` would gain from
                         speculative decoding; compute-bound ones, or those needing more, would not (the draft's own
                         cost not counted: ``explain --spec --draft`` prices it).
* ``weight-quantization-measured`` / ``kv-quantization-measured``, with ``*-effect`` and ``dequant-bound``:
                         a file holding a float and a quantized run of the same workload quotes the
                         measured effect against the roofline's prediction (``roofline.verdicts.change_rules``).

Actions fit the device kind (``roofline.verdicts.advice``): a CPU is never told to use CUDA graphs.

The rules live in their own modules and register in ``roofline.verdicts.findings`` (each in a scope: what it is
run over); this module only runs them. First, ``across-models`` when the files (and the given model and device)
are not one setup and the user asked for it anyway (``roofline.verdicts.same_setup``). Per file: ``noisy-run``
first (what follows rests on a busy machine's numbers); for measurements, the ``phase`` rules per phase (prefill, decode) and backend, the ``backend`` rules
per backend, then the ``run`` rules; for requests, per configuration its ``latency-floor`` findings, then the
``latency`` rules. Within a scope the registry's order holds (ascending ``order``, ties by name).
``change_findings`` runs the ``change`` rules on a before/after comparison (``roofline diagnose compare.json``).
Thresholds are named constants in the rule modules, each with its reason.
"""

from __future__ import annotations

import math

from ..analysis import analyze
from ..errors import RooflineError
from ..latency import latency_runs
from ..units import ms
from . import counter_rules, expert_rules, phase_rules, spec_rules, trace_rules  # noqa: F401 (they register)
from .change_rules import compare_noisy, summary
from .findings import Finding, run
from .latency_rules import ConfigRun, floor_findings
from .same_setup import Setup, check_same_setup, device_name, setup_of

PHASES = ("prefill", "decode")


def diagnose(result_files, *, model=None, device=None, dtype: str | None = None, across_models: bool = False) -> list:
    """All findings for ``result_files`` (``records.ResultFile``), file by file.

    Latency runs get a floor (``latency-floor``) when a model config and a device with ceilings
    are known: ``model`` / ``device`` / ``dtype`` as given, else the file's own model and dtype
    and the ceilings of a profile file given alongside that ran on the same device.

    Files of different models or devices, or a ``model`` / ``device`` other than the files', are refused in one
    line (``roofline.verdicts.same_setup``, the rule ``compare`` follows), unless ``across_models``: then an
    ``across-models`` finding says so first.
    """
    out, floors = across_findings(result_files, model, device, across_models), {}
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


def latency_findings(rf, src: str = "", floor_ctx=None, floors=None) -> list:
    """Findings per configuration; ``floor_ctx`` = (model config, device, dtype) adds the floors (kept in
    ``floors`` by (source, configuration) for the other rules)."""
    out = []
    runs = latency_runs(rf)
    others = tuple(r.summary for r in runs)
    for r in runs:
        ratios = []
        if floor_ctx is not None:
            tag = f"[{r.config}] " if r.config else ""
            f, ratios = floor_findings(tag, list(r.timelines), r.summary, floor_ctx, src)
            out += f
            if floors is not None:
                floors[(src, r.config)] = ratios
        out += run("latency", ConfigRun(r, src, rf.header.settings, others, tuple(ratios)))
    return out


def across_findings(result_files, model=None, device=None, across_models: bool = False) -> list:
    """[] when the files and the given model and device are one setup; else RooflineError, or (``across_models``)
    one ``across-models`` finding saying what differs."""
    setups = [setup_of(rf) for rf in result_files]
    if model is not None:
        setups.append(Setup("--model", model=model.name))
    if device is not None:
        setups.append(Setup("--device", device=device_name(device)))
    notes = check_same_setup(setups, across_models=across_models, what="diagnosed together")
    if not notes:
        return []
    return [Finding("across-models", " ".join(notes), "; ".join(f"{s.where}: {s.model or 'model unknown'} on "
                                                            f"{s.device or 'device unknown'}" for s in setups),
                    "read each finding against its own file's model and device")]


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
    out = []
    several = len(a.backends) > 1
    for phase in PHASES:
        for backend in a.backends:
            ss = [s for s in a.phase_steps(phase, backend) if s.reliable]   # unreliable: said by noise_finding
            if ss:
                out += run("phase", phase, backend if several else "", ss, a.device, src)
    for backend in a.backends:
        out += run("backend", a, backend, several, src)
    return out + run("run", rf, a, src)


def change_findings(c, src: str = "") -> list:
    """Every finding about comparison ``c`` (``roofline.verdicts.change_rules``): a comparison with a noisy side
    is said first and not judged (its summary only)."""
    if c.noise_note:
        return [compare_noisy(c, src), summary(c, src)]
    return run("change", c, src)
