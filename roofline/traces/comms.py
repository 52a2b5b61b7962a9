"""Collectives read across ranks, and communication/computation overlap per rank.

``collectives(traces, link)`` matches each collective call across the ranks of a folder of
per-rank traces and measures it:

* **Which kernel is which call.** A communication kernel (``graphs.kernel_category``:
  ``ncclDevKernel_*``, ``ncclKernel_*``, RCCL, custom all-reduce) takes its metadata from its own
  ``args`` (newer Kineto copies ``record_param_comms``' fields onto the kernel) or from the
  ``record_param_comms`` op that launched it: ``Collective name``, ``In msg nelems`` / ``Out msg
  nelems``, ``dtype``, ``Group size``, ``Process Group Name``, ``Seq``. Calls are matched across
  ranks by (process group, ``Seq``) when every rank records a sequence number, else by their order
  among the same process group's collectives of the same kind (NCCL runs a group's collectives
  in issue order on every rank). A call not seen on every rank of the folder is counted unmatched.
* **Wait apart from transfer.** Each rank's kernel starts when that rank arrives; no byte moves
  until the last rank arrives. A rank's *wait* is the last arrival less its own start (the skew);
  the *transfer* is the earliest end less the last arrival (TraceLens's convention), bounded by both
  ends: never negative and never longer than any rank's kernel. Where the kernels do not overlap in
  time at all (a send that returned once its data was buffered, before the receive began; clocks that
  disagree), the transfer is the shortest kernel's duration, and each rank's wait is bounded by its
  own kernel (what it ran less the transfer); such calls are counted (``disjoint``). Message size over
  transfer is the algorithm bandwidth. ``formulas.bus_bandwidth`` gives algbw and busbw
  in nccl-tests' convention (all-reduce busbw = algbw x 2(n-1)/n), compared with the device's link
  from the catalogue (per direction, what busbw is comparable with). The *straggler* is the rank
  the others waited for longest in all. Times compare across files, so the ranks' clocks must be
  one clock (one host, or hosts whose clocks agree): a skew the size of a clock offset is one.
* **Overlap** (``overlap(trace)``, as HTA reports it): the time a communication kernel runs while
  a compute kernel runs on the same rank, over the communication time.
"""

from __future__ import annotations

import re
from collections import defaultdict

from .. import formulas as F
from .. import units as U
from ..dtypes import bytes_per_element
from ..safejson import key, text, whole
from ..stats import median
from .events import US
from .graphs import kernel_category
from .idle import busy_intervals

_COMM_TYPES = {"float": "fp32", "bfloat16": "bf16", "half": "fp16", "double": "fp64", "long": "int64",
               "int": "int32", "byte": "uint8", "char": "int8", "bool": "bool", "float8_e4m3fn": "fp8",
               "float8_e5m2": "fp8"}
_NCCL_KIND = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|AllToAll|SendRecv|Reduce)", re.I)
_KINDS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "alltoall": "all_to_all", "sendrecv": "send", "reduce": "reduce"}
MAX_CALLS = 50                # calls listed one by one in the summary (the aggregate covers all)


def _kind(name: str) -> str:
    """all_reduce / all_gather / ... from a collective name ("allreduce", "_allgather_base") or a kernel name."""
    low = re.sub(r"[^a-z]", "", name.lower().replace("base", "").replace("coalesced", ""))
    for k, v in _KINDS.items():
        if low.startswith(k) or low.endswith(k):
            return v
    m = _NCCL_KIND.search(name)
    return _KINDS[m.group(1).lower()] if m else "unknown"


def _meta(g) -> dict:
    """The collective metadata of a communication kernel: its own args, else the record_param_comms around it."""
    src = g.args if isinstance(g.args, dict) and "Collective name" in g.args else None
    if src is None and g.op is not None:
        for op in g.op.chain():
            if isinstance(op.args, dict) and "Collective name" in op.args:
                src = op.args
                break
    src = src or {}
    coll = text(src.get("Collective name"), "") or g.name
    kind = _kind(coll) if coll != g.name else _kind(g.name)
    dt = _COMM_TYPES.get(str(text(src.get("dtype"), "")).lower())
    elems = whole(src.get("Out msg nelems" if kind == "all_gather" else "In msg nelems"), 0)
    try:
        msg = elems * bytes_per_element(dt) if elems is not None and dt else None
    except (KeyError, ValueError):
        msg = None
    pg = key(src.get("Process Group Name"))
    return {"kind": kind, "message_bytes": msg, "group": whole(src.get("Group size"), 1),
            "pg": "default" if pg is None else str(pg), "seq": whole(src.get("Seq"), 0)}


def comm_kernels(trace) -> list:
    """[(kernel, metadata)] of a trace's communication kernels, by start."""
    return [(g, _meta(g)) for g in trace.gpu if g.kind == "kernel" and kernel_category(g.name) == "communication"]


def _intersect(a: list, b: list) -> float:
    """Length of the intersection of two sorted, merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(trace) -> dict:
    """Communication time, the part of it that overlaps compute kernels, and the share (HTA's overlap)."""
    comm = [g for g in trace.gpu if g.kind == "kernel" and kernel_category(g.name) == "communication"]
    compute = [g for g in trace.gpu if g.kind == "kernel" and kernel_category(g.name) != "communication"]
    cu, pu = busy_intervals(comm), busy_intervals(compute)
    c = sum(e - s for s, e in cu)
    o = _intersect(cu, pu)
    return {"rank": trace.rank, "communication_s": c * US, "overlapped_s": o * US,
            "overlap_share": o / c if c else 0.0}


def _match(per_rank: dict) -> tuple[list, int]:
    """[{rank: (kernel, meta)}] of calls seen on every rank, and how many kernels matched nothing."""
    ranks = sorted(per_rank)
    by_seq = all(m["seq"] is not None for r in ranks for _, m in per_rank[r])
    keyed: dict = defaultdict(dict)
    for r in ranks:
        order: dict = defaultdict(int)
        for g, m in per_rank[r]:
            if by_seq:
                k = (m["pg"], m["seq"])
            else:
                k = (m["pg"], m["kind"], order[(m["pg"], m["kind"])])
                order[(m["pg"], m["kind"])] += 1
            keyed[k].setdefault(r, (g, m))
    calls = [v for v in keyed.values() if len(v) == len(ranks)]
    calls.sort(key=lambda v: min(g.ts for g, _ in v.values()))
    unmatched = sum(len(v) for v in keyed.values() if len(v) < len(ranks))
    return calls, unmatched


def transfer_and_waits(kernels) -> tuple[float, list, bool]:
    """(transfer s, each kernel's wait s, disjoint?) of one call's kernels across ranks (see the module docstring):
    the earliest end less the last arrival, bounded by both ends (0 <= transfer <= the shortest kernel); kernels
    that do not overlap at all take the shortest one's duration. A wait is the last arrival less the kernel's
    start, never more than its kernel ran beside the transfer."""
    arrive = max(g.ts for g in kernels)
    end = min(g.end for g in kernels)
    shortest = min(g.end - g.ts for g in kernels)
    disjoint = end <= arrive
    transfer = shortest if disjoint else min(end - arrive, shortest)
    waits = [max(min(arrive - g.ts, (g.end - g.ts) - transfer), 0.0) * US for g in kernels]
    return transfer * US, waits, disjoint and len(kernels) > 1


def collectives(traces, link=None) -> dict:
    """Per collective call matched across ``traces`` (one per rank): size, transfer, algbw/busbw, wait per rank,
    the straggler; aggregated by (kind, message size); overlap per rank. {} when no rank ran a collective."""
    per_rank = {t.rank: comm_kernels(t) for t in traces}
    if not any(per_rank.values()):
        return {}
    out = {"ranks": len(traces), "overlap": [overlap(t) for t in traces],
           "link": {"name": link.name, "bandwidth": link.bandwidth} if link is not None else None,
           "method": "", "matched": 0, "unmatched": 0, "disjoint": 0, "calls": [], "by_kind": [], "wait_s": {},
           "straggler": None}
    if len(traces) < 2:
        out["method"] = "one rank: nothing to match across ranks"
        return out
    calls, unmatched = _match(per_rank)
    seq = all(m["seq"] is not None for ks in per_rank.values() for _, m in ks)
    out["method"] = ("process group and sequence number (Seq)" if seq
                     else "order among each process group's collectives of one kind")
    out["matched"], out["unmatched"] = len(calls), unmatched
    wait: dict = {r: 0.0 for r in per_rank}
    caused: dict = {r: 0.0 for r in per_rank}
    agg: dict = defaultdict(list)
    for n, call in enumerate(calls):
        transfer, waits, disjoint = transfer_and_waits([g for g, _ in call.values()])
        waits = dict(zip(call, waits))
        out["disjoint"] += disjoint
        last = max(call, key=lambda r: (call[r][0].ts, r))
        _, m = call[last]
        msg = next((x["message_bytes"] for _, x in call.values() if x["message_bytes"]), None)
        group = m["group"] or len(call)
        for r, w in waits.items():
            wait[r] += w
            if r != last:
                caused[last] += w
        waits = {str(r): w for r, w in sorted(waits.items())}
        row = {"kind": m["kind"], "pg": m["pg"], "seq": m["seq"], "message_bytes": msg, "group_size": group,
               "transfer_s": transfer, "wait_s": waits, "last_rank": last, "algbw": None, "busbw": None}
        if msg and transfer > 0:
            row["algbw"], row["busbw"] = F.bus_bandwidth(m["kind"], msg, transfer, group)
            if link is not None:
                row["link_fraction"] = row["busbw"] / link.bandwidth
        if n < MAX_CALLS:
            out["calls"].append(row)
        agg[(m["kind"], msg, group)].append(row)
    for (kind, msg, group), rows in sorted(agg.items(), key=lambda kv: -sum(r["transfer_s"] for r in kv[1])):
        tr = [r["transfer_s"] for r in rows]
        med = median(tr)
        k = {"kind": kind, "message_bytes": msg, "group_size": group, "calls": len(rows), "transfer_s": sum(tr),
             "median_transfer_s": med, "wait_s": sum(sum(r["wait_s"].values()) for r in rows),
             "algbw": None, "busbw": None}
        if msg and med > 0:
            k["algbw"], k["busbw"] = F.bus_bandwidth(kind, msg, med, group)
            if link is not None:
                k["link_fraction"] = k["busbw"] / link.bandwidth
        out["by_kind"].append(k)
    out["wait_s"] = {str(r): w for r, w in sorted(wait.items())}
    if calls and max(caused.values()) > 0:
        s = max(caused, key=lambda r: caused[r])
        out["straggler"] = {"rank": s, "others_waited_s": caused[s],
                            "last_in": sum(1 for c in calls if max(c, key=lambda r: (c[r][0].ts, r)) == s)}
    return out


def collective_lines(c: dict) -> list:
    """Sentences for the summary and the report: per kind, the straggler, the waits, overlap per rank."""
    if not c:
        return []
    out = []
    link = c.get("link")
    if c.get("matched"):
        out.append(f"{c['matched']} collective call(s) matched across {c['ranks']} ranks by {c['method']}"
                   + (f"; {c['unmatched']} kernel(s) seen on only some ranks" if c["unmatched"] else "")
                   + (f"; in {c['disjoint']} the ranks' kernels did not overlap in time (a buffered send, or "
                      "clocks that disagree): transfer taken as the shortest kernel" if c.get("disjoint") else "")
                   + ".")
    for k in c.get("by_kind", []):
        size = U.nbytes(k["message_bytes"]) if k["message_bytes"] else "unknown size"
        bw = ""
        if k["busbw"]:
            bw = f": algbw {U.bandwidth(k['algbw'])}, busbw {U.bandwidth(k['busbw'])}"
            if link and "link_fraction" in k:
                bw += f" ({k['kind'].replace('_', '-')} at {U.percent(k['link_fraction'])} of {link['name']})"
        out.append(f"{k['kind']} of {size} over {k['group_size']} ranks, {k['calls']} call(s): median transfer "
                   f"{U.seconds(k['median_transfer_s'])}{bw}; ranks waited {U.seconds(k['wait_s'])} in all for the "
                   "last to arrive.")
    st = c.get("straggler")
    if st:
        waits = ", ".join(f"rank {r} {U.seconds(w)}" for r, w in c["wait_s"].items())
        out.append(f"Straggler: rank {st['rank']} (last to arrive in {st['last_in']} of {c['matched']} call(s); the "
                   f"others waited {U.seconds(st['others_waited_s'])} for it). Wait per rank: {waits}.")
    for o in c.get("overlap", []):
        if o["communication_s"]:
            out.append(f"Rank {o['rank']}: communication {U.seconds(o['communication_s'])}, "
                       f"{U.percent(o['overlap_share'])} of it overlapped with compute kernels.")
    return out

