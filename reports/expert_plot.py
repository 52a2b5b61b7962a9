"""Mixtures of experts at decode: expert weight bytes and step time against batch (issue 21).

``expert_sweep(rf)`` reads the decode steps of a MoE run (``roofline.analysis``) along batch, at the context
the sweep view uses, and prices each with the cost model (``roofline.workload.decode``):

* expert bytes: the routed-expert weights a step reads in expectation under uniform routing (the distinct
  experts its tokens touch, each read once);
* the dense equivalent: the same model's active parameters read once per step (every non-expert weight plus
  k experts per MoE layer), what a dense model of the same active size reads at any batch;
* this run's routing: the distinct experts each point's own routing touched (the experts measurement's
  ``experts_touched``), priced at the same bytes per expert;
* the measured step time per backend, beside the step at its roof and the dense equivalent at its roof
  (the experts op's roof time with only k experts' weights per layer);
* the batch from which every expert is loaded (``roofline.explain.expert_curve``: at least ``FULL_SHARE``
  of the experts per layer, in expectation).

``plot_experts(ax_bytes, ax_time, sweep)`` draws it; artists carry gids ("experts:bytes", "experts:dense",
"experts:full", "experts:time:<backend>", ...) so tests read back what was drawn. Rendering never measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from matplotlib.ticker import LogLocator, NullFormatter, NullLocator

from roofline import units as U
from roofline import workload as W
from roofline.analysis import analyze
from roofline.bounds import predicted_time
from roofline.cost import Cost
from roofline.verdicts.expert_rules import moe_decode_phase
from roofline.errors import RooflineError
from roofline.explain import FULL_SHARE, expert_curve

from .style import device_color, styled
from .sweep_plot import STYLES, sweep_slices, variant

EXPERT_COLOR = "#9467bd"   # the cost model's expert bytes (backends take device_color)
FULL_COLOR = "#d62728"     # the every-expert batch


@dataclass(frozen=True)
class ExpertPoint:
    backend: str
    variant: str                 # "" or "w-int8", ... (reports.sweep_plot.variant)
    batch: int
    experts_expected: float      # distinct experts per MoE layer, uniform routing (cost model)
    experts_measured: int | None  # this point's own routing (the experts measurement), None when not recorded
    expert_bytes: float          # routed-expert weight bytes per step, expected
    routing_bytes: float | None  # the same at this point's own routing
    weight_bytes: float          # every weight the step reads, expected
    dense_bytes: float           # the dense equivalent: the active parameters read once
    time_s: float                # measured step time (roofline.analysis.Step.time_s)
    floor_s: float               # the step at its roof (the ops' roof times summed)
    dense_floor_s: float         # the dense equivalent at its roof (NaN when the experts op was not measured)


@dataclass(frozen=True)
class ExpertSweep:
    model: str
    context: int
    n_experts: int
    k: int
    full_batch: int | None       # every expert loaded from this batch (None: not within 65,536 tokens)
    per_expert_bytes: float      # one expert's weights over every MoE layer (one rank's under tp)
    series: dict = field(default_factory=dict)   # {(backend, variant): [ExpertPoint, ...] by batch}

    @property
    def all_expert_bytes(self) -> float:
        return self.per_expert_bytes * self.n_experts

    @property
    def batches(self) -> list:
        return sorted({p.batch for pts in self.series.values() for p in pts})


def has_experts(rf) -> bool:
    m = getattr(rf.header, "model", None)
    return bool(m is not None and m.n_experts)


def _point(model, s, settings) -> ExpertPoint | None:
    try:
        ph = moe_decode_phase(model, s.key, settings)
    except RooflineError:            # a step the cost model cannot price (an unknown dtype): left off
        return None
    touched, ebytes, per = ph.experts_touched, ph.expert_weight_bytes, ph.per_expert_bytes
    if not touched > 0:
        return None
    k = model.n_active
    ex = next((r for r in s.ops if r.op == "experts"), None)
    measured = ex.m.config.get("experts_touched") if ex is not None else None
    measured = int(measured) if isinstance(measured, (int, float)) and measured > 0 else None
    dense_floor = math.nan
    if ex is not None:                            # the experts op at its roof with only k experts per layer
        one = per / max(ph.op("experts").count, 1)
        c = ex.point.cost
        lean = Cost(c.flops, max(c.bytes - (touched - k) * one, 0.0))
        dense_floor = s.predicted_s - ex.count * (ex.predicted_s
                                                  - predicted_time(lean, ex.roof.peak, ex.roof.bandwidth))
    return ExpertPoint(s.backend, variant(s.key), s.batch, touched, measured, ebytes,
                       per * measured if measured else None, ph.weight_bytes, ph.dense_equivalent_bytes,
                       s.time_s, s.predicted_s, dense_floor)


def expert_sweep(rf) -> ExpertSweep | None:
    """The decode-against-batch view of a MoE run (module docstring); None for a dense model or a run with
    fewer than two decode batches at one context."""
    if not has_experts(rf):
        return None
    model = rf.header.model
    sl = [fixed for phase, vary, fixed in sweep_slices(rf) if (phase, vary) == ("decode", "batch")]
    if not sl:
        return None
    ctx = sl[0]
    a = analyze(rf)
    series: dict = {}
    for s in a.phase_steps("decode"):
        if s.context != ctx or s.cached:
            continue
        p = _point(model, s, rf.header.settings)
        if p is not None:
            series.setdefault((p.backend, p.variant), []).append(p)
    series = {key: sorted(v, key=lambda p: p.batch) for key, v in sorted(series.items()) if len(v) >= 2}
    if not series:
        return None
    first = next(iter(series.values()))[0]
    curve = expert_curve(lambda b: W.decode(model, b, ctx), model, batches=(1,))
    return ExpertSweep(model.name, ctx, model.n_experts, model.n_active, curve["full_batch"],
                       first.expert_bytes / first.experts_expected, series)


def _styles(sweep: ExpertSweep) -> dict:
    return {v: STYLES[i % 4] for i, v in enumerate(sorted({v for _, v in sweep.series}))}


def _label(var: str) -> str:
    return f" [{var.replace('-', ':')}]" if var else ""


@styled
def plot_experts(ax_bytes, ax_time, sweep: ExpertSweep):
    """Expert bytes (left) and step time (right) against batch; returns (ax_bytes, ax_time)."""
    ls = _styles(sweep)
    backends = sorted({b for b, _ in sweep.series})
    drawn = set()
    for (backend, var), pts in sweep.series.items():
        xs = [p.batch for p in pts]
        color = device_color(backends.index(backend))
        if var not in drawn:                       # the cost model's lines: the same for every backend
            drawn.add(var)
            ax_bytes.plot(xs, [p.expert_bytes for p in pts], color=EXPERT_COLOR, ls=ls[var], marker="o", ms=4, lw=1.8,
                          label="expert weights read per step (expected, uniform routing)" + _label(var),
                          gid="experts:bytes" + (":" + var if var else ""))
            ax_bytes.plot(xs, [p.weight_bytes for p in pts], color="#444444", ls=ls[var], lw=1.2,
                          label="all weights read per step (expected)" + _label(var),
                          gid="experts:weights" + (":" + var if var else ""))
            ax_bytes.plot(xs, [p.dense_bytes for p in pts], color="#2ca02c", ls=(0, (5, 3)), lw=1.4,
                          label=f"dense equivalent: active parameters read once ({sweep.k} of {sweep.n_experts} "
                                "experts)" + _label(var), gid="experts:dense" + (":" + var if var else ""))
            fl = [(p.batch, p.floor_s) for p in pts]
            ax_time.plot([x for x, _ in fl], [y for _, y in fl], color="#444444", ls=":", lw=1.2,
                         label="step at its roof" + _label(var), gid="experts:floor" + (":" + var if var else ""))
            df = [(p.batch, p.dense_floor_s) for p in pts if not math.isnan(p.dense_floor_s)]
            if df:
                ax_time.plot([x for x, _ in df], [y for _, y in df], color="#2ca02c", ls="-.", lw=1.2,
                             label="dense equivalent at its roof" + _label(var),
                             gid="experts:dense-floor" + (":" + var if var else ""))
        routed = [(p.batch, p.routing_bytes, p.experts_measured) for p in pts if p.routing_bytes is not None]
        if routed:
            ax_bytes.scatter([x for x, _, _ in routed], [y for _, y, _ in routed], marker="x", s=30, color=color,
                             zorder=4, label=f"this run's routing ({backend}{_label(var)}): experts touched",
                             gid=f"experts:routing:{backend}" + (":" + var if var else ""))
            for x, y, n in routed:
                ax_bytes.annotate(f"{n}/{sweep.n_experts}", (x, y), xytext=(3, -10), textcoords="offset points",
                                  fontsize=7, color=color)
        ax_time.plot(xs, [p.time_s for p in pts], color=color, ls=ls[var], marker="o", ms=4, lw=1.8,
                     label=f"measured step ({backend}{_label(var)})",
                     gid=f"experts:time:{backend}" + (":" + var if var else ""))
    ax_bytes.axhline(sweep.all_expert_bytes, color=EXPERT_COLOR, lw=0.9, ls=":", gid="experts:all",
                     label=f"all {sweep.n_experts} experts' weights: {U.nbytes(sweep.all_expert_bytes)}")
    xs = sweep.batches
    hi = max(xs)
    if sweep.full_batch:
        hi = max(hi, sweep.full_batch)
        for ax in (ax_bytes, ax_time):
            ax.axvline(sweep.full_batch, color=FULL_COLOR, lw=1.1, ls="--", gid="experts:full",
                       label=f"every expert loaded from batch {sweep.full_batch:,} (>= {FULL_SHARE:.0%})"
                       if ax is ax_bytes else None)
            ax.annotate(f"all experts from batch {sweep.full_batch:,}", (sweep.full_batch, 0.03),
                        xycoords=("data", "axes fraction"), xytext=(-3, 0), textcoords="offset points",
                        rotation=90, ha="right", va="bottom", fontsize=7.5, color=FULL_COLOR)
    for ax in (ax_bytes, ax_time):
        ax.set_xscale("log", base=2)
        ticks = list(xs)              # the sweep's batches; the every-expert batch is named on its line
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{x:,}" for x in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(min(xs) / 1.3, hi * 1.3)
        ax.set_xlabel("decode batch")
    ax_bytes.set_ylim(0, max(max(p.weight_bytes for pts in sweep.series.values() for p in pts),
                             sweep.all_expert_bytes) * 1.1)
    ax_bytes.yaxis.set_major_formatter(lambda v, _: U.nbytes(v))
    ax_bytes.set_ylabel("weight bytes per step")
    ax_bytes.set_title(f"{sweep.model} decode (context {sweep.context:,}): expert weights vs batch")
    ax_bytes.legend(loc="upper left", fontsize=7)
    ax_time.set_yscale("log")
    ax_time.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax_time.yaxis.set_major_formatter(lambda v, _: U.seconds(v))
    ax_time.yaxis.set_minor_formatter(NullFormatter())
    ax_time.set_ylabel("time per decode step")
    ax_time.set_title("measured step time vs batch, beside the roof")
    ax_time.legend(loc="best", fontsize=7)
    return ax_bytes, ax_time


def expert_caption(sweep: ExpertSweep) -> str:
    """What the figure shows, with its numbers."""
    first = next(iter(sweep.series.values()))
    lo, hi = first[0], first[-1]
    cap = (f"Decode steps of {sweep.model} at context {sweep.context:,} against batch. Left: the routed-expert "
           f"weights a step reads in expectation under uniform routing ({sweep.k} of {sweep.n_experts} experts per "
           "token; each distinct expert a step touches is read once): "
           f"{U.nbytes(lo.expert_bytes)} at batch {lo.batch} ({lo.experts_expected:.2f} experts per layer), "
           f"{U.nbytes(hi.expert_bytes)} at batch {hi.batch} ({hi.experts_expected:.2f}); every weight the step "
           f"reads (grey); and the dense equivalent (green, dashed): the same model's active parameters read once, "
           f"{U.nbytes(lo.dense_bytes)} at any batch, what a dense model of the same active size reads. ")
    if any(p.routing_bytes is not None for pts in sweep.series.values() for p in pts):
        cap += ("Crosses: the experts this run's own routing touched at each point (one layer's, counted for every "
                "MoE layer). ")
    if sweep.full_batch:
        cap += (f"Dashed red: every expert is loaded (at least {FULL_SHARE:.0%} per layer, in expectation) from batch "
                f"{sweep.full_batch:,}; below it, each added token mostly brings new experts' weights (reuse "
                "fragmentation), past it tokens reuse weights already read, as in a dense model. ")
    cap += ("Right: the measured step time per backend (the ops' medians x instances, summed), the step at its "
            "roof (dotted) and the dense equivalent at its roof (green dash-dot: the experts op reading only "
            f"{sweep.k} experts' weights per layer). Nothing here is measured at render time: bytes come from the "
            "cost model, times from the result file.")
    return cap
