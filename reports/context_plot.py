"""A hybrid's decode against context beside its dense counterpart (issue 32): the report's decode-vs-context figure.

Drawn for a result file whose header's model has linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5) or
sparse attention (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5), on the header's device (its ceilings) at
batch 1 in the header's activation dtype. The numbers are ``roofline.context_curve.context_curve``'s, the same
formulas ``roofline explain --vs-context`` prints: analytic, since ``profile`` cannot run these layers yet (its
runners refuse them in one line), so no sweep holds a hybrid's measured points and the roofline figure has none
to mark by kind. A trace's result file names such a model with ``roofline trace ... --model M --device D``; an
endpoint's (``latency --endpoint``) has a device without ceilings, so no curve.

``plot_context(ax_bytes, ax_time, curve)`` draws it; artists carry gids ("context:model:bytes",
"context:dense:bytes", "context:model:kv", "context:model:state" or "context:model:index", "context:dense:kv",
"context:model:weights", "context:model:time", "context:dense:time", "context:faster:<x>") so tests read back what
was drawn. Rendering never measures.
"""

from __future__ import annotations

from matplotlib.ticker import NullLocator

from roofline import units as U
from roofline.context_curve import ContextCurve, context_curve
from roofline.errors import RooflineError
from roofline.explain import ExplainSpec

from .figure_kinds import has_context_curve
from .style import styled

MODEL_COLOR = "#1f77b4"
DENSE_COLOR = "#d62728"
CROSS_COLOR = "#2ca02c"
FLOATS = ("fp32", "bf16", "fp16")


def report_curve(rf) -> ContextCurve | None:
    """The curve for ``rf``'s model on its device (batch 1, the header's dtype); None when the device lacks the
    ceilings to time a step (no bandwidth or no peak) or the model is too short for a curve."""
    if not has_context_curve(rf):
        return None
    dtype = rf.header.dtype if rf.header.dtype in FLOATS else "bf16"
    try:
        return context_curve(ExplainSpec(model=rf.header.model, device=rf.header.device, act_dtype=dtype))
    except RooflineError:
        return None


def _label(curve: ContextCurve) -> str:
    return "state" if curve.kind == "linear" else "indexer keys"


@styled
def plot_context(ax_bytes, ax_time, curve: ContextCurve):
    """Bytes per decode step by kind (left) and the step's time at its roof (right) against context, the model's
    beside its dense counterpart's; returns (ax_bytes, ax_time)."""
    xs = list(curve.contexts)
    h, d = curve.hybrid, curve.dense
    kind, extra = ("state", "state_bytes") if curve.kind == "linear" else ("index", "index_bytes")
    ax_bytes.plot(xs, [p.bytes for p in h], color=MODEL_COLOR, marker="o", ms=4, lw=1.9, gid="context:model:bytes",
                  label=f"{curve.model}: every byte of the step")
    ax_bytes.plot(xs, [p.bytes for p in d], color=DENSE_COLOR, marker="s", ms=4, lw=1.9, ls="--",
                  gid="context:dense:bytes", label="dense counterpart: every byte of the step")
    ax_bytes.plot(xs, [p.kv_bytes for p in h], color=MODEL_COLOR, lw=1.1, ls=":", gid="context:model:kv",
                  label=f"{curve.model}: KV cache read")
    ax_bytes.plot(xs, [getattr(p, extra) for p in h], color=MODEL_COLOR, lw=1.1, ls="-.",
                  gid=f"context:model:{kind}", label=f"{curve.model}: {_label(curve)} read")
    ax_bytes.plot(xs, [p.kv_bytes for p in d], color=DENSE_COLOR, lw=1.1, ls=":", gid="context:dense:kv",
                  label="dense counterpart: KV cache read")
    ax_bytes.plot(xs, [p.weight_bytes for p in h], color="#444444", lw=1.0, gid="context:model:weights",
                  label=f"{curve.model}: weights read")
    ax_time.plot(xs, [p.time_s for p in h], color=MODEL_COLOR, marker="o", ms=4, lw=1.9, gid="context:model:time",
                 label=curve.model)
    ax_time.plot(xs, [p.time_s for p in d], color=DENSE_COLOR, marker="s", ms=4, lw=1.9, ls="--",
                 gid="context:dense:time", label="dense counterpart")
    for x, s, a, b in zip(xs, curve.speedups, h, d):     # the speedup above the higher of the two points
        ax_time.annotate(f"{s:.2f}x", (x, max(a.time_s, b.time_s)), xytext=(0, 7), textcoords="offset points",
                         ha="center", fontsize=7, color=MODEL_COLOR)
    for x, ctx in curve.crossings:
        if ctx is None:
            continue
        what = "as fast" if x == 1 else f"{x:g}x faster"
        for ax in (ax_bytes, ax_time):
            ax.axvline(ctx, color=CROSS_COLOR, lw=1.1, ls="--" if x == 1 else "-", gid=f"context:faster:{x:g}",
                       label=f"{what} from context {ctx:,}" if ax is ax_time else None)
        ax_time.annotate(f"{what} from {ctx:,}", (ctx, 0.97), xycoords=("data", "axes fraction"), xytext=(-3, 0),
                         textcoords="offset points", rotation=90, ha="right", va="top", fontsize=7.5,
                         color=CROSS_COLOR)
    for ax in (ax_bytes, ax_time):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x // 1024:,}k" if x % 1024 == 0 else f"{x:,}" for x in xs], rotation=30)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(xs[0] / 1.2, xs[-1] * 1.2)
        ax.set_xlabel("context (tokens already cached)")
    ax_bytes.set_yscale("log")
    ax_bytes.yaxis.set_major_formatter(lambda v, _: U.nbytes(v))
    ax_bytes.set_ylabel("bytes per decode step")
    ax_bytes.set_title(f"{curve.model} decode (batch {curve.batch}): bytes read by kind")
    ax_bytes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7, frameon=False)
    ax_time.set_ylim(0, max(p.time_s for p in d) * 1.12)
    ax_time.yaxis.set_major_formatter(lambda v, _: U.seconds(v))
    ax_time.set_ylabel(f"decode step at its roof ({curve.device})")
    ax_time.set_title("time per decode step against its dense counterpart's")
    ax_time.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7, frameon=False)
    return ax_bytes, ax_time


def context_caption(curve: ContextCurve) -> str:
    """What the figure shows, with its numbers."""
    h0, hn, dn = curve.hybrid[0], curve.hybrid[-1], curve.dense[-1]
    extra = (f"its {_label(curve)} read ({U.nbytes(hn.state_bytes)} per step at every context)" if curve.kind ==
             "linear" else f"its indexer's keys read ({U.nbytes(hn.index_bytes)} at {hn.context:,}, every cached key)")
    cap = (f"One decode step of {curve.model} at batch {curve.batch} ({curve.weights} weights, {curve.act_dtype} "
           f"activations, {curve.kv_said}) against the context, from {h0.context:,} to {hn.context:,} tokens, beside "
           f"its dense counterpart: {curve.said}. Left: every byte each step moves (solid: the model, dashed: the "
           f"counterpart), the KV cache each reads (dotted), {extra}, and the model's weights (grey). At "
           f"{hn.context:,} the model reads {U.nbytes(hn.kv_bytes)} of KV, its counterpart {U.nbytes(dn.kv_bytes)}. "
           f"Right: each step at its roof on {curve.device} ({curve.device_source} ceilings: max(FLOPs / peak, bytes "
           "/ bandwidth) per op, summed), the speedup under each point. ")
    said = []
    for x, ctx in curve.crossings:
        what = "at least as fast as its counterpart" if x == 1 else f"{x:g}x faster"
        said.append(f"{what} from context {ctx:,}" if ctx is not None else
                    f"never {what} up to context {curve.max_context - 1:,} ({curve.speedups[-1]:.2f}x there)")
    cap += ("Green: the model's step is " + "; ".join(said) + ". Analytic: the same formulas as `roofline explain "
            "--vs-context`; nothing here is measured, and `roofline profile` cannot run these layers yet, so no "
            "sweep holds a measured point of them for the roofline figure to mark by kind.")
    return cap
