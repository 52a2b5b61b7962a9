"""The sweep view, and several runs side by side.

* ``sweep_slices(result_file)``: the one-dimensional slices a sweep holds: decode against
  batch (at one context), decode and prefill against context (at one batch).
* ``plot_intensity_sweep(ax, rf, phase, vary, fixed)``: each op's intensity along the slice,
  log-log, with the ridge of the run's dtype (and of fp32, for vector ops) drawn across; a
  star marks the first sweep value at which an op reaches the ridge drawn for it (its peak over the
  DRAM bandwidth, ``drawn_ridge``: never a cache level's, which no line shows).
* ``plot_fraction_sweep(ax, ...)``: each op's roof fraction along the same slice, with the
  roof (100%) and the overhead threshold (25%) drawn.
* ``plot_compare(ax, result_files, phase, what)``: phase step time or roof fraction against
  batch (decode) or prompt tokens (prefill), one colour per run/device, each labelled apart
  (``run_labels``); a step above the fraction axis' top drawn at its edge with its value, said in a
  line; a step whose verdict is withheld (host-busy) marked "x".

A file holding several weight / KV-cache dtypes (``roofline profile --weight-dtype fp32,int8``) draws
one line per op and dtype variant, told apart by line style (``variant_styles``, said in the caption
by ``style_note``); a variant's gid ends in ":w-int8" (":kv-int8", ...).
"""

from __future__ import annotations

from collections import Counter

from matplotlib.ticker import LogLocator, NullFormatter, NullLocator

from roofline import units as U
from roofline.analysis import analyze
from roofline.workload import LAYER_OP
from roofline.bounds import OVERHEAD_FRACTION

from . import hover
from .labels import run_labels
from .style import LABEL_ZORDER, PHASE_LINESTYLE, device_color, op_color, run_model, styled


def _axis_name(vary: str) -> str:
    return {"batch": "batch", "context": "context (tokens)"}[vary]


def sweep_slices(result_file) -> list[tuple[str, str, int]]:
    """(phase, vary, fixed) slices with at least two values; vary in {batch, context}.

    The fixed value is the one with most distinct values along the slice; among ties, the
    middle context for a batch sweep and the smallest batch for a context sweep.
    """
    ms = [r.m for r in analyze(result_file).ok]
    out = []
    for phase, vary in (("decode", "batch"), ("decode", "context"), ("prefill", "context"), ("prefill", "batch")):
        other = "context" if vary == "batch" else "batch"
        per_fixed = {}
        for m in ms:
            if m.point.phase == phase:
                per_fixed.setdefault(getattr(m.point, other), set()).add(getattr(m.point, vary))
        if not per_fixed:
            continue
        most = max(len(v) for v in per_fixed.values())
        tied = sorted(k for k, v in per_fixed.items() if len(v) == most)
        fixed = tied[len(tied) // 2] if vary == "batch" else tied[0]
        if len(per_fixed[fixed]) >= 2 and not (phase == "prefill" and vary == "batch" and
                                                any(s[0] == "prefill" for s in out)):
            out.append((phase, vary, fixed))
    return out


def variant(p) -> str:
    """'' for weights and KV cache in the activation dtype, else 'w-int8', 'kv-int8', 'w-int4 kv-fp8'."""
    return " ".join(f"{n}-{v}" for n, v in (("w", p.weight_dtype), ("kv", p.kv_dtype)) if v != p.dtype)


def _series(result_file, phase, vary, fixed):
    """{(op, backend, variant): [(x, OpResult), ...]} sorted by x."""
    other = "context" if vary == "batch" else "batch"
    out: dict = {}
    for r in analyze(result_file).ok:
        p = r.point
        if p.phase == phase and getattr(p, other) == fixed:
            out.setdefault((p.op, p.backend, variant(p)), []).append((getattr(p, vary), r))
    return {k: sorted(v, key=lambda t: t[0]) for k, v in out.items()}


def _index(result_file, r) -> int:
    """The position of OpResult ``r`` in its analysis' results (the key of its hover mark and table row)."""
    return hover.result_index(analyze(result_file))[id(r)]


STYLES = ["-", "--", ":", "-."]


def variant_styles(keys) -> dict:
    """{(backend, variant): line style}: one per backend and dtype variant, in sorted order."""
    return {k: STYLES[i % 4] for i, k in enumerate(sorted(set(keys)))}


def _gid(kind: str, op: str, backend: str, var: str) -> str:
    return f"{kind}:{op}:{backend}" + (":" + var.replace(" ", ":") if var else "")


def style_note(result_file) -> str:
    """What the sweep's line styles mean, when they tell backends or dtype variants apart ('' otherwise)."""
    keys = {(r.point.backend, variant(r.point)) for r in analyze(result_file).ok}
    if len(keys) < 2:
        return ""
    names = {"-": "solid", "--": "dashed", ":": "dotted", "-.": "dash-dotted"}
    parts = [f"{names[st]} {b}" + (f" {v.replace('-', ':')}" if v else f" {result_file.header.dtype}")
             for (b, v), st in variant_styles(keys).items()]
    return " Line styles: " + ", ".join(parts) + "."


@styled
def plot_intensity_sweep(ax, result_file, phase: str, vary: str, fixed: int):
    """Intensity of each op along a slice, with ridges and crossing stars; returns ``ax``."""
    dev, dtype = result_file.header.device, result_file.header.dtype
    series = _series(result_file, phase, vary, fixed)
    ls = variant_styles((b, v) for _, b, v in series)
    ridges = {d: dev.peak_flops[d] / dev.bandwidth for d in (dtype, "fp32") if d in dev.peak_flops and dev.bandwidth}
    for (op, backend, var), pts in series.items():
        if pts[0][1].point.cost.flops == 0:
            continue  # 0 FLOP/byte cannot sit on a log axis
        xs = [x for x, _ in pts]
        ys = [r.m.intensity for _, r in pts]
        lw = 2.2 if op == LAYER_OP else 1.3
        ax.plot(xs, ys, ls=ls[(backend, var)], color="black" if op == LAYER_OP else op_color(op, run_model(result_file)), lw=lw, marker=".",
                ms=4, label=op, gid=_gid("intensity", op, backend, var))
        hover.register(ax, xs, ys, [("p", _index(result_file, r)) for _, r in pts])
        roof = pts[0][1].roof          # the op's own roof (roofline.analysis.roof_for), at the drawn DRAM ridge:
        ridge = drawn_ridge(roof)      # a cache level's roof (its ridge is not drawn) does not place the star
        if ridge:
            ridges.setdefault(roof.dtype, ridge)     # a dtype the loop below would not draw: drawn too
            cross = next(((x, y) for x, y in zip(xs, ys) if y >= ridge), None)
            if cross is not None and ys[0] < ridge:
                ax.plot(*cross, marker="*", ms=11, color=op_color(op, run_model(result_file)), mec="black", mew=0.5, zorder=5,
                        gid=_gid("crossing", op, backend, var))
    for d, r in ridges.items():
        ax.axhline(r, color="#444444", lw=1.0, ls="-" if d == dtype else ":", gid=f"ridge:{d}")
        ax.annotate(f"ridge {U.intensity(r)} ({d})", (0.01, r), xycoords=("axes fraction", "data"),
                    xytext=(0, 2), textcoords="offset points", fontsize=7.5, color="#444444",
                    zorder=LABEL_ZORDER, gid=f"ridge-label:{d}",
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(_axis_name(vary))
    ax.set_ylabel("intensity (FLOP/byte)")
    other = "context" if vary == "batch" else "batch"
    ax.set_title(f"{phase}: intensity vs {vary} ({other} {fixed:,})")
    _int_ticks(ax, series)
    return ax


@styled
def plot_fraction_sweep(ax, result_file, phase: str, vary: str, fixed: int):
    """Roof fraction of each op along a slice; returns ``ax``."""
    series = _series(result_file, phase, vary, fixed)
    ls = variant_styles((b, v) for _, b, v in series)
    top = 1.1
    for (op, backend, var), pts in series.items():
        xs = [x for x, _ in pts]
        ys = [r.roof_fraction for _, r in pts]
        top = max(top, max(ys) * 1.05)
        ax.plot(xs, ys, ls=ls[(backend, var)], color="black" if op == LAYER_OP else op_color(op, run_model(result_file)),
                lw=2.2 if op == LAYER_OP else 1.3, marker=".", ms=4, label=op, gid=_gid("fraction", op, backend, var))
        hover.register(ax, xs, ys, [("p", _index(result_file, r)) for _, r in pts])
    ax.axhline(1.0, color="#444444", lw=1.0)
    ax.axhline(OVERHEAD_FRACTION, color="#b0b0b0", lw=1.0, ls="--")
    ax.annotate("roof", (0.01, 1.0), xycoords=("axes fraction", "data"), xytext=(0, 2),
                textcoords="offset points", fontsize=7.5, color="#444444")
    ax.annotate(f"overhead below {U.percent(OVERHEAD_FRACTION)}", (0.01, OVERHEAD_FRACTION),
                xycoords=("axes fraction", "data"), xytext=(0, 2), textcoords="offset points", fontsize=7.5,
                color="#808080")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, top)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_xlabel(_axis_name(vary))
    ax.set_ylabel("fraction of roof")
    other = "context" if vary == "batch" else "batch"
    ax.set_title(f"{phase}: roof fraction vs {vary} ({other} {fixed:,})")
    _int_ticks(ax, series)
    return ax


def drawn_ridge(roof) -> float:
    """The ridge the sweep draws for ``roof``'s dtype: its peak over the DRAM bandwidth (a cache level's roof,
    ``Roof.level``, has a lower ridge that no line shows); 0 when the roof has no bandwidth."""
    bw = roof.dram_bandwidth or roof.bandwidth
    return roof.peak / bw if bw > 0 else 0.0


def _int_ticks(ax, series):
    xs = sorted({x for pts in series.values() for x, _ in pts})
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:,}" for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())


def _common_fixed(summaries_per_file, phase: str, attr: str):
    """The fixed value (context for decode, batch for prefill) most files share, most points first."""
    counts = Counter(getattr(s, attr) for ss in summaries_per_file for s in ss if s.phase == phase)
    return counts.most_common(1)[0][0] if counts else None


FRACTION_TOP = 1.1   # the side-by-side roof-fraction axis' top; a step above it is drawn at the edge, marked


def _draw_clipped(ax, points, top):
    """Points above ``top`` as an up-triangle on the axes' top edge (gid "clipped"), each with its value, and a
    line saying so (gid "clipped-note"): a step above the axis is never silently dropped."""
    if not points:
        return
    ax.scatter([x for x, _, _ in points], [top] * len(points), marker="^", s=60, c=[c for _, _, c in points],
               edgecolors="black", linewidths=0.6, zorder=5, clip_on=False, gid="clipped")
    for x, y, c in points:
        ax.annotate(U.percent(y), (x, top), xytext=(0, -4), textcoords="offset points", ha="center", va="top",
                    fontsize=7, color=c, zorder=LABEL_ZORDER, gid="clipped-value")
    ax.text(0.99, 0.97, f"{len(points)} step(s) above {U.percent(top)}: drawn at the top edge (\u25b2) with their value",
            transform=ax.transAxes, ha="right", va="top", fontsize=7, color="#444444", zorder=LABEL_ZORDER,
            gid="clipped-note", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))


@styled
def plot_compare(ax, result_files, phase: str, what: str = "time"):
    """Phase step time (what="time") or roof fraction ("fraction") per run, coloured by device."""
    summaries = [analyze(rf).steps for rf in result_files]
    attr, vary = ("context", "batch") if phase == "decode" else ("batch", "context")
    fixed = _common_fixed(summaries, phase, attr)
    labels = run_labels(result_files)
    clipped = []                   # (x, y, colour) above the fraction axis' top: drawn at its edge
    unreliable = 0                 # steps marked "x": timed on a busy host, no verdict
    for i, (rf, ss) in enumerate(zip(result_files, summaries)):
        sel = [s for s in ss if s.phase == phase and getattr(s, attr) == fixed]
        variants = sorted({variant(s.key) for s in sel})
        styles = variant_styles(("", v) for v in variants)
        for var in variants:       # a file with several weight / KV dtypes: one line each, its own style
            pts = sorted(((getattr(s, vary), s) for s in sel if variant(s.key) == var), key=lambda t: t[0])
            xs = [x for x, _ in pts]
            ys = [s.time_s if what == "time" else s.roof_fraction for _, s in pts]
            ls = styles[("", var)] if len(variants) > 1 else PHASE_LINESTYLE[phase]
            ax.plot(xs, ys, color=device_color(i), ls=ls,
                    marker="o", ms=4, lw=1.6, label=labels[i] + (f" [{var.replace('-', ':')}]" if var else ""),
                    gid=f"compare:{phase}:{what}:{i}" + (":" + var.replace(" ", ":") if var else ""))
            if what != "time":
                clipped += [(x, y, device_color(i)) for x, y in zip(xs, ys) if y > FRACTION_TOP]
            held = [(x, min(y, FRACTION_TOP) if what != "time" else y) for (x, st), y in zip(pts, ys) if not st.reliable]
            if held:            # a step whose verdict the table withholds (host-busy): said on the chart too
                ax.scatter([x for x, _ in held], [y for _, y in held], marker="x", s=36, c="black", linewidths=1.0,
                           zorder=5.5, clip_on=False, gid=f"unreliable:{phase}:{what}:{i}")
                unreliable += len(held)
    ax.set_xscale("log", base=2)
    if what == "time":
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(lambda v, _: U.seconds(v))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("measured step time")
    else:
        ax.axhline(1.0, color="#444444", lw=1.0)
        ax.axhline(OVERHEAD_FRACTION, color="#b0b0b0", lw=1.0, ls="--")
        ax.set_ylim(0, FRACTION_TOP)
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
        ax.set_ylabel("step fraction of roof")
        _draw_clipped(ax, clipped, FRACTION_TOP)
    other = "context" if phase == "decode" else "batch"
    ax.set_xlabel(_axis_name(vary))
    ax.set_title(f"{phase}: {'step time' if what == 'time' else 'roof fraction'} vs {vary} ({other} {fixed:,})"
                 if fixed is not None else phase)
    xs = sorted({getattr(s, vary) for ss in summaries for s in ss if s.phase == phase and getattr(s, attr) == fixed})
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:,}" for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())
    if unreliable:
        ax.scatter([], [], marker="x", s=36, c="black", linewidths=1.0,
                   label=f"unreliable (host-busy): no verdict ({unreliable})")
    ax.legend(loc="best")
    return ax
