"""Collectives against the interconnect roof (tensor-parallel profiles and multi-rank traces).

``plot_collectives(ax, rf)`` draws, on log-log axes (x: message bytes of one collective, y: bus
bandwidth = bytes on the wire / median time, nccl-tests' busbw):

* the interconnect roof: the link's bandwidth per direction (solid: the one the run classifies
  with, measured where ``roofline ceilings --collective`` ran; dashed: the datasheet's), bent at
  small messages by its latency, as a roofline bends at its ridge: attainable busbw =
  wire / (latency + wire / bandwidth) for a ring all-reduce over the run's ranks
  (``roofline.formulas.collective_time``);
* the measured all-reduce ceiling sweep (grey line), when the header holds it;
* each measured collective as a point (marker: its op; one point per rank).

Artists carry gids ("interconnect:used", "interconnect:datasheet", "collectives:points", ...) so
tests read back what was drawn. Rendering never measures.
"""

from __future__ import annotations

import numpy as np

from roofline import formulas as F
from roofline import units as U
from roofline.analysis import analyze
from roofline.ranks import balance_text

from .figure_kinds import collective_points, has_collectives  # noqa: F401
from .style import DATASHEET_COLOR, MEASURED_COLOR, device_color, styled

MARKERS = {"embedding_allreduce": "s", "attn_allreduce": "o", "mlp_allreduce": "D", "lm_head_gather": "^"}


def _roof(ax, link, ranks, xs, gid, color, ls, label):
    wire = np.array([F.collective_bytes("all_reduce", x, ranks) for x in xs])
    t = np.array([link.time("all_reduce", x, ranks) for x in xs])
    ax.plot(xs, wire / t, color=color, ls=ls, lw=1.6 if ls == "-" else 1.1, gid=gid, label=label)


@styled
def plot_collectives(ax, rf, *, title: str | None = None):
    """Draw ``rf``'s collectives under its interconnect roof (module docstring); returns ``ax``."""
    h = rf.header
    pts = collective_points(rf)
    ranks = max([int(h.settings.get("tp", 0) or h.settings.get("world_size", 0) or 2)] + [2])
    rows = (h.ceilings.get("collective") or {}).get("rows", []) if isinstance(h.ceilings, dict) else []
    sizes = [p[0] for p in pts] + [r["bytes"] for r in rows] or [4096.0, 2.0 ** 28]
    xs = np.logspace(np.log10(min(sizes) / 2), np.log10(max(sizes) * 2), 60)
    used, sheet = h.device.link, h.datasheet.link if h.datasheet is not None else None
    ax.set_xscale("log")
    ax.set_yscale("log")
    if used is not None:
        _roof(ax, used, ranks, xs, "interconnect:used", MEASURED_COLOR, "-",
              f"{used.name}: {U.bandwidth(used.bandwidth)} per direction ({used.source})")
    if sheet is not None and (used is None or sheet.bandwidth != used.bandwidth):
        _roof(ax, sheet, ranks, xs, "interconnect:datasheet", DATASHEET_COLOR, (0, (5, 3)),
              f"{sheet.name}: {U.bandwidth(sheet.bandwidth)} per direction (datasheet)")
    ar = [r for r in rows if r["kind"] == "all_reduce"]
    if ar:
        ax.plot([r["bytes"] for r in ar], [r["busbw"] for r in ar], color="#9a9a9a", marker=".", lw=0.9,
                gid="collectives:ceiling-sweep", label="all-reduce sweep (roofline ceilings --collective)")
    for i, op in enumerate(dict.fromkeys(p[2] for p in pts)):
        sel = [p for p in pts if p[2] == op]
        ax.scatter([p[0] for p in sel], [p[1] for p in sel], marker=MARKERS.get(op, "o"), s=26,
                   color=device_color(i), edgecolors="white", linewidths=0.4, zorder=3, label=op,
                   gid="collectives:points")
    ax.legend(loc="lower right", frameon=True, framealpha=0.9)
    ax.xaxis.set_major_formatter(lambda v, _: U.nbytes(v))
    ax.yaxis.set_major_formatter(lambda v, _: U.bandwidth(v))
    ax.set_xlabel("message bytes per collective")
    ax.set_ylabel("bus bandwidth (bytes on the wire / time)")
    ax.set_title(title or f"Collectives on {h.device.name} over {ranks} ranks: the interconnect roof")
    return ax


def balance_caption(rf) -> str:
    """Per-rank balance of the tensor-parallel steps, for the caption."""
    parts = [f"{s.phase} {s.where}: {balance_text(s.rank_s)}" for s in analyze(rf).steps if s.rank_s]
    if not parts:
        return ""
    return " Per-rank step times (ops and collectives, each rank's own): " + "; ".join(parts[:6]) + (
        f"; and {len(parts) - 6} more steps." if len(parts) > 6 else ".")
