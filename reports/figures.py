"""Assemble the report's figures: which plots, on which axes, with which caption.

``run_figures(rf)`` returns ``ReportFigure``s for one result file (roofline, time
breakdown, sweep view, predicted vs measured, expert bytes against batch for a mixture of
experts, decode against context beside the dense counterpart for a hybrid or sparse-attention model; or the
latency section for a latency run);
``compare_figures(rfs)`` the side-by-side view of several runs. Each figure is a
``matplotlib.figure.Figure`` on an Agg canvas; ``reports.style.save`` writes it.
"""

from __future__ import annotations

from matplotlib.patches import Patch

from roofline import units as U
from roofline.analysis import analyze
from roofline.bounds import OVERHEAD_FRACTION

from .captions import BOUNDED_NOTE, predicted_caption, roofline_caption  # noqa: F401
from .comm_plot import balance_caption, has_collectives, plot_collectives
from .context_plot import context_caption, has_context_curve, plot_context, report_curve
from .expert_plot import expert_caption, expert_sweep, has_experts, plot_experts
from .idle_plot import has_idle_timeline, idle_figure
from .latency_figures import latency_section
from .report_figure import ReportFigure
from .roofline_plot import plot_roofline
from .style import CATEGORY_COLORS, category_color, new_figure, op_color, op_names, run_model
from .sweep_plot import plot_compare, plot_fraction_sweep, plot_intensity_sweep, style_note, sweep_slices
from .time_plot import align_diagonals, plot_predicted_vs_measured, plot_time_breakdown, predicted, step_times


def _op_legend(fig, rf, ops):
    """The op legend, in the run's model's order (``reports.style.op_names``)."""
    model = run_model(rf)
    handles = [Patch(color=op_color(o, model), label=o) for o in op_names(model) if o in ops]
    if not handles:                  # no op a model has (a counters run's kernels): no empty legend
        return
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="op")


def roofline_figure(rf) -> ReportFigure:
    fig, ax = new_figure(10, 6.4)
    plot_roofline(ax, rf)
    return ReportFigure("roofline", "Roofline", fig, roofline_caption(rf))


def time_figure(rf, phase) -> ReportFigure | None:
    keys, per = step_times(rf, phase)
    if not keys:
        return None
    fig, ax = new_figure(min(4 + 0.45 * len(keys), 13), 4.2)
    plot_time_breakdown(ax, rf, phase)
    ops = [o for o in dict.fromkeys(op for k in keys for op in per[k])]
    _op_legend(fig, rf, ops)
    note = analyze(rf).noise_note       # the table's WARNING, first (bars marked "unreliable" have no verdict)
    cap = ((f"WARNING: {note} " if note else "")
           + f"{phase.capitalize()}: each bar is one step of the sweep; segments are each op's share of the measured "
           "step time (median x instances per step; per-layer ops count n_layers times). The whole-layer op, "
           "when measured, is not stacked.")
    return ReportFigure(f"time_{phase}", f"Where {phase} time goes", fig, cap)


def sweep_figure(rf) -> ReportFigure | None:
    slices = sweep_slices(rf)
    if not slices:
        return None
    fig, axes = new_figure(12.5, 3.4 * len(slices), nrows=len(slices), ncols=2, squeeze=False)
    ops = set()
    for row, (phase, vary, fixed) in zip(axes, slices):
        plot_intensity_sweep(row[0], rf, phase, vary, fixed)
        plot_fraction_sweep(row[1], rf, phase, vary, fixed)
        ops |= {ln.get_label() for ln in row[1].lines if not ln.get_label().startswith("_")}
    _op_legend(fig, rf, ops)
    cap = ("Left: each op's arithmetic intensity along the sweep; the horizontal lines are the ridges "
           f"({rf.header.dtype} solid, fp32 dotted for vector ops); a star marks where an op first reaches its "
           "ridge, i.e. turns compute-bound. Right: the fraction of its roof each op reaches; under "
           f"{U.percent(OVERHEAD_FRACTION)} it is limited by launches, latency or the kernel, not by memory."
           + style_note(rf))
    return ReportFigure("sweep", "Sweep view", fig, cap)


def predicted_figure(rf) -> ReportFigure:
    fig, ax = new_figure(7.6, 6.2)
    plot_predicted_vs_measured(ax, rf, align=False)     # aligned once the legend is in (below)
    if rf.header.kind == "trace":      # a trace's points are coloured by op category (its op names are not the model's)
        cats = {r.m.config.get("category", "") for r in predicted(analyze(rf))}
        fig.legend(handles=[Patch(color=category_color(c), label=c) for c in CATEGORY_COLORS if c in cats],
                   loc="outside right center", frameon=False, title="op category")
    else:
        ops = {r.op for r in analyze(rf).ok}
        _op_legend(fig, rf, ops)
    align_diagonals(ax)          # the legend moved the axes: the diagonals' labels follow their lines
    return ReportFigure("predicted", "Measured vs predicted", fig, predicted_caption(rf))


def latency_figures(rf) -> list[ReportFigure]:
    """The latency engineer's section (``reports.latency_figures.latency_section``)."""
    return [ReportFigure(f"latency_{i + 1}", str(title), fig, str(caption))
            for i, (title, fig, caption) in enumerate(latency_section(rf))]


def figure_builders(rf) -> list:
    """[(name, build)] for one result file, in report order; ``build()`` returns a list of ReportFigure.

    Building is deferred so a report can draw its figures in several processes (reports.render).
    """
    out = []
    if rf.requests or rf.summaries:
        out.append(("latency", lambda: latency_figures(rf)))
    if analyze(rf).ok and rf.header.kind == "trace":   # a trace's ops are not the workload's: a top-ops table
        out += [("roofline", lambda: [roofline_figure(rf)])]
        if predicted(analyze(rf)):        # no costed op (a replay without its capture): no empty chart
            out.append(("predicted", lambda: [predicted_figure(rf)]))
    elif analyze(rf).ok:
        out += [("roofline", lambda: [roofline_figure(rf)]),
                ("time_prefill", lambda: [f for f in (time_figure(rf, "prefill"),) if f]),
                ("time_decode", lambda: [f for f in (time_figure(rf, "decode"),) if f]),
                ("sweep", lambda: [f for f in (sweep_figure(rf),) if f]),
                ("predicted", lambda: [predicted_figure(rf)])]
    if analyze(rf).ok and rf.header.kind != "trace" and has_experts(rf):   # a mixture of experts: reuse vs batch
        out.append(("experts", lambda: [f for f in (expert_figure(rf),) if f]))
    if has_context_curve(rf):                # linear-attention or sparse layers: decode against context vs dense
        out.append(("context", lambda: [f for f in (context_figure(rf),) if f]))
    if has_idle_timeline(rf):                # a GPU trace: its idle gaps by cause
        out.append(("idle", lambda: [idle_figure(rf)]))
    if has_collectives(rf):                  # tensor parallelism: the collectives under the interconnect roof
        out.append(("interconnect", lambda: [interconnect_figure(rf)]))
    return out


def expert_figure(rf) -> ReportFigure | None:
    """A mixture of experts' decode: expert bytes and step time against batch, the dense equivalent beside."""
    sweep = expert_sweep(rf)
    if sweep is None:
        return None
    fig, (left, right) = new_figure(13, 4.8, ncols=2)
    plot_experts(left, right, sweep)
    return ReportFigure("experts", "Expert weights against batch", fig, expert_caption(sweep))


def context_figure(rf) -> ReportFigure | None:
    """A hybrid's (or sparse-attention model's) decode against context beside its dense counterpart
    (``reports.context_plot``); None when the device's ceilings cannot time a step."""
    curve = report_curve(rf)
    if curve is None:
        return None
    fig, (left, right) = new_figure(13, 5.0, ncols=2)
    plot_context(left, right, curve)
    return ReportFigure("context", "Decode against context, beside the dense counterpart", fig, context_caption(curve))


def interconnect_figure(rf) -> ReportFigure:
    fig, ax = new_figure(9, 5.6)
    plot_collectives(ax, rf)
    cap = ("Each measured collective (one point per rank) at (message bytes, bus bandwidth = bytes on the wire / "
           "median time; ring all-reduce puts 2(N-1)/N of the message on the wire per rank, all-gather (N-1)/N: "
           "nccl-tests' busbw). The roof is the link's bandwidth per direction, bent at small messages by its "
           "latency (time = latency + wire / bandwidth); solid: the link the run classifies with (measured by "
           "`roofline ceilings --collective` where it ran), dashed: the datasheet's. Collectives are kept off the "
           "HBM roofline; a step whose collectives take at least half its time is communication-bound."
           + balance_caption(rf))
    return ReportFigure("interconnect", "Collectives against the interconnect roof", fig, cap)


def run_figures(rf) -> list[ReportFigure]:
    """Every figure for one result file, in report order."""
    return [f for _, build in figure_builders(rf) for f in build()]


def compare_figures(rfs) -> list[ReportFigure]:
    """Several runs side by side, one colour per run/device."""
    phases = [p for p in ("decode", "prefill") if any(analyze(rf).phase_steps(p) for rf in rfs)]
    if len(rfs) < 2 or not phases:
        return []
    fig, axes = new_figure(12, 3.8 * len(phases), nrows=len(phases), ncols=2, squeeze=False)
    for row, phase in zip(axes, phases):
        plot_compare(row[0], rfs, phase, "time")
        plot_compare(row[1], rfs, phase, "fraction")
    cap = ("Each run in its own colour: the measured step time (sum of the measured ops, median x instances) and "
           "the step's fraction of its roof, against batch (decode, at the context most runs share) and "
           "prompt tokens (prefill). Each run is judged against its own device's ceilings.")
    return [ReportFigure("compare", "Runs side by side", fig, cap)]
