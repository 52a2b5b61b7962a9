"""Collective benchmark: measured all-reduce bus bandwidth against the ceiling of the link it crosses.

    python benchmarks/collective_speed.py              # CPU: 2 gloo ranks on 127.0.0.1; GPU box: NCCL over its GPUs
    python benchmarks/collective_speed.py --tp 4 --quick

CPU (gloo): the ranks talk over TCP on the loopback interface, so a byte on the wire is a byte
copied through the kernel. Two ceilings are measured here, each with ``profiler.timing`` (the one
clock): the loopback TCP stream (one socket pair, 64 MiB sends, one direction) and a memory copy
(256 MiB, message bytes per second: bytes read + written / 2). Measured all-reduce busbw
(nccl-tests: algbw x 2(n-1)/n) is printed per message size with its fraction of each.

GPU (NCCL, 2+ GPUs visible): the same all-reduce sweep (4 KiB .. 256 MiB) against the catalogue's
link figure per direction (NVLink 4: 450 GB/s on H100/H200 SXM); one GPU cannot run NCCL ranks,
which is said. A ratio line per ceiling is printed last.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler.timing import measure  # noqa: E402
from roofline import units as U  # noqa: E402


def tcp_loopback_bytes_per_s(nbytes: int = 64 * 2**20) -> float:
    """One direction of a TCP stream over 127.0.0.1: ``nbytes`` sent, received by a thread, per call."""
    a, b = _tcp_pair()
    payload = memoryview(bytearray(nbytes))
    sink = bytearray(1 << 20)
    go, done = threading.Semaphore(0), threading.Semaphore(0)
    stop = [False]

    def receive():
        while True:
            go.acquire()
            if stop[0]:
                return
            left = nbytes
            while left:
                left -= b.recv_into(sink, min(len(sink), left))
            done.release()

    t = threading.Thread(target=receive, daemon=True)
    t.start()

    def once():
        go.release()
        a.sendall(payload)
        done.acquire()

    try:
        return nbytes / measure(once, "cpu", budget_s=1.0, warmup_s=0.1, min_reps=3, max_reps=20).median_s
    finally:
        stop[0] = True
        go.release()
        a.close()
        b.close()


def _tcp_pair():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    return a, b


def memcpy_bytes_per_s() -> float:
    """Message bytes copied per second by a 256 MiB host copy (``profiler.ceilings.measure_bandwidth``
    counts read + written: half of it is the message)."""
    from profiler.ceilings import measure_bandwidth

    return measure_bandwidth("cpu", 512 * 2**20, quick=True)["copy_bytes_per_s"] / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import torch

    from profiler.collectives import collectives_table, run_collective_ceilings

    gpu = torch.cuda.is_available()
    if gpu and torch.cuda.device_count() < 2:
        print(f"one GPU visible ({torch.cuda.get_device_name(0)}): NCCL needs a GPU per rank, so the NCCL sweep "
              "needs 2 or more; measuring the CPU (gloo) path instead.")
        gpu = False
    device = "cuda" if gpu else "cpu"
    r = run_collective_ceilings(device, args.tp, quick=args.quick, remeasure=True)
    ar = [x for x in r["rows"] if x["kind"] == "all_reduce"]
    best = max(ar, key=lambda x: x["busbw"])
    if gpu:
        from profiler.ceilings import device_name
        from roofline.devices import find_device

        link = find_device(device_name("cuda")).link
        print(collectives_table(r, link))
        ceilings = [(f"{link.name} per direction (catalogue, {link.source})", link.bandwidth)]
    else:
        print(collectives_table(r))
        ceilings = [("TCP loopback stream, one direction (measured)", tcp_loopback_bytes_per_s()),
                    ("host memory copy, message bytes/s (measured)", memcpy_bytes_per_s())]
    print(f"\nall-reduce over {args.tp} ranks ({r['backend']}): busbw per size against each ceiling")
    head = f"{'size':>10}{'busbw':>14}" + "".join(f"{'% of ' + name.split(',')[0].split(' (')[0]:>34}"
                                                  for name, _ in ceilings)
    print(head)
    for x in ar:
        print(f"{U.nbytes(x['bytes']):>10}{U.bandwidth(x['busbw']):>14}"
              + "".join(f"{U.percent(x['busbw'] / v):>34}" for _, v in ceilings))
    print()
    for name, v in ceilings:
        print(f"best all-reduce busbw {U.bandwidth(best['busbw'])} at {U.nbytes(best['bytes'])} = "
              f"{best['busbw'] / v:.3f} x {name} {U.bandwidth(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
