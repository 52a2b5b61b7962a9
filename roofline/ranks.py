"""Reading a tensor-parallel result file: one measurement per op per rank, one step.

``roofline profile --tp N`` records every op and every collective once per rank (``Measurement.rank``).
The ranks run in lockstep: each layer's all-reduces wait for the last rank to arrive, so the
slowest rank sets the step. ``slowest_per_op`` keeps, for each op of a step, the slowest rank's
measurement (a point skipped on any rank is skipped for the step: the step cannot run without it);
``rank_times`` gives each rank's own sum, for the per-rank balance every table shows.
Used by ``roofline.analysis``; works on its ``OpResult``s (anything with ``.m.rank``, ``.ok``,
``.point.key`` and ``.time_s``).
"""

from __future__ import annotations

from . import formulas as F
from . import units as U

LAYER_OP = "layer"


def ranks_of(results) -> list:
    return sorted({r.m.rank for r in results})


def slowest_per_op(results) -> list:
    """One result per point: the slowest ok rank's, or a skipped one when any rank skipped it (file order kept)."""
    if len(ranks_of(results)) <= 1:
        return list(results)
    pick: dict = {}
    for r in results:
        k = r.point.key
        cur = pick.get(k)
        if cur is None:
            pick[k] = r
        elif cur.ok and (not r.ok or r.time_s > cur.time_s):
            pick[k] = r
    return list(pick.values())


def rank_times(results) -> tuple:
    """((rank, seconds per step), ...): each rank's ops and collectives summed (its layer op only when it
    measured nothing else); () for a single-rank step."""
    ranks = ranks_of(results)
    if len(ranks) <= 1:
        return ()
    out = []
    for rank in ranks:
        mine = [r for r in results if r.m.rank == rank and r.ok]
        ops = [r for r in mine if r.op != LAYER_OP] or mine
        out.append((rank, sum(r.time_s for r in ops)))
    return tuple(out)


def imbalance(rank_s) -> float:
    """(slowest - fastest) / fastest rank time; 0 for a single rank."""
    ts = [t for _, t in rank_s if t > 0]
    return (max(ts) - min(ts)) / min(ts) if len(ts) > 1 else 0.0


def wire_bytes(result) -> float:
    """Bytes one rank put on the interconnect for a collective measurement, per step (its recorded
    ``config.detail.wire_bytes``, else ``formulas.collective_bytes`` from its message size) x its count."""
    d = result.m.config.get("detail", {}) if isinstance(result.m.config, dict) else {}
    w = d.get("wire_bytes")
    if w is None and d.get("message_bytes") and d.get("group_size"):
        w = F.collective_bytes(d.get("collective", "all_reduce"), d["message_bytes"], d["group_size"])
    return (w or 0.0) * result.count


def balance_text(rank_s) -> str:
    """'rank 0 1.2 ms, rank 1 1.3 ms (8% apart)'."""
    if not rank_s:
        return ""
    return (", ".join(f"rank {k} {U.seconds(t)}" for k, t in rank_s)
            + f" ({U.percent(imbalance(rank_s))} apart)")
