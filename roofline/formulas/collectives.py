"""Collectives between ranks: the bytes one rank puts on the wire, the ring steps, a collective's time and
nccl-tests' bus bandwidth. This is interconnect traffic, not DRAM bytes."""

from __future__ import annotations


COLLECTIVE_WIRE = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
                   "all_to_all": "(n-1)/n", "broadcast": "1", "send": "1", "recv": "1"}


def _collective_kind(kind: str) -> str:
    """'allreduce', '_allgather_base', 'c10d::all_reduce_' ... -> all_reduce, all_gather, ..."""
    key = kind.lower().replace("allreduce", "all_reduce").replace("allgather", "all_gather")
    key = key.replace("reducescatter", "reduce_scatter").replace("alltoall", "all_to_all")
    return key.replace("_base", "").replace("_into_tensor", "").replace("_coalesced", "").strip("_")


def collective_bytes(kind: str, message_bytes: float, ranks: int) -> float:
    """Bytes one rank puts on the wire for a collective of ``message_bytes`` over ``ranks`` ranks.

    The ring algorithm's volume (nccl-tests' bus bandwidth factors): all_reduce 2(n-1)/n of
    the message, all_gather (n-1)/n of the gathered output, reduce_scatter (n-1)/n of the
    input, all_to_all (n-1)/n, broadcast / send / recv the message. This is traffic on the
    interconnect, not DRAM bytes: a collective is not placed on the HBM roofline.
    """
    n = max(int(ranks), 1)
    key = _collective_kind(kind)
    if key == "all_reduce":
        return 2 * (n - 1) / n * message_bytes
    if key in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (n - 1) / n * message_bytes
    return float(message_bytes)


def collective_steps(kind: str, ranks: int) -> int:
    """Sequential ring steps of a collective over ``ranks`` ranks: all_reduce 2(n-1) (a reduce-scatter
    then an all-gather), all_gather / reduce_scatter / all_to_all / broadcast n-1, send / recv 1; 0 for one rank."""
    n = max(int(ranks), 1)
    if n == 1:
        return 0
    key = _collective_kind(kind)
    if key == "all_reduce":
        return 2 * (n - 1)
    return 1 if key in ("send", "recv") else n - 1


def collective_time(kind: str, message_bytes: float, ranks: int, *, bandwidth: float, base_latency: float = 0.0,
                    hop_latency: float = 0.0, launches: int = 1) -> float:
    """Seconds for ``launches`` collectives moving ``message_bytes`` in all over ``ranks`` ranks.

    A latency term plus bytes on the wire over the link (nccl-tests doc/PERFORMANCE.md: time is
    "roughly equal to overhead + size / bw"; NCCL's own tuning model, src/graph/tuning.cc, costs
    a launch as baseLat + steps x hwLat):

        launches x (base_latency + collective_steps x hop_latency) + collective_bytes / bandwidth

    ``bandwidth`` is the link's per-direction bytes/s, which is what nccl-tests' bus bandwidth is
    compared against; ``message_bytes`` is the total of every launch (summed over prefill chunks).
    One rank moves nothing and waits for nobody: 0 s.
    """
    n = max(int(ranks), 1)
    if n == 1 or launches == 0:
        return 0.0
    wire = collective_bytes(kind, message_bytes, n)
    return launches * (base_latency + collective_steps(kind, n) * hop_latency) + (wire / bandwidth if wire else 0.0)


def bus_bandwidth(kind: str, message_bytes: float, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of one collective of ``message_bytes`` that took ``seconds``.

    nccl-tests' definitions (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw x the ring
    factor (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1), so busbw is
    ``collective_bytes`` / time: the per-rank, per-direction link traffic, comparable across rank
    counts and with the hardware's link bandwidth. For all_gather the size is the gathered output.
    """
    algbw = message_bytes / seconds
    return algbw, collective_bytes(kind, message_bytes, ranks) / seconds

