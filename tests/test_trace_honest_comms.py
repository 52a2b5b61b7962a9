"""Issue 30, honest views: a collective's transfer time is never negative (roofline.traces.comms).

Two ranks exchange two point-to-point messages (send on one rank, recv on the other, one NCCL SendRecv kernel
each, 1,048,576 bf16 = 2 MiB, matched by process group and Seq). Message 1: rank 0's send runs 100-110 us (it
returned once its data was buffered), rank 1's recv 150-250: the kernels do not overlap, so "earliest end less
last arrival" is 110 - 150 = -40 us; bounded by both ends the transfer is the shorter kernel, 10 us. Message 2
overlaps: send 300-400, recv 320-380: transfer 380 - 320 = 60 us, rank 0 waited 20 us.
"""

import sys
from pathlib import Path

import pytest

from roofline.traces.comms import collective_lines, collectives
from roofline.traces.events import read_traces

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import BF, Builder  # noqa: E402
from make_traces_issue24 import H100  # noqa: E402

US = 1e-6
N = 1_048_576
KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
SPANS = {0: ("send", ((100, 110), (300, 400))), 1: ("recv", ((150, 250), (320, 380)))}


def _pairs(folder):
    for rank, (what, spans) in SPANS.items():
        b = Builder(devices=(H100,), dist={"backend": "nccl", "rank": rank, "world_size": 2})
        b.annotation("decode", 0, 1000)
        for seq, (start, end) in enumerate(spans, start=1):
            meta = {"Collective name": what, "In msg nelems": N, "Out msg nelems": N, "Group size": 2,
                    "dtype": "BFloat16", "Process Group Name": "0", "Seq": seq}
            e = b.op("record_param_comms", start - 60, 30, [[N]], [BF], **meta)
            b.launch(e, start - 55, start, end - start, KERNEL, stream=20, extra=meta)
        b.dump(folder / f"rank{rank}.json")
    return folder


def test_a_matched_pair_s_transfer_is_bounded_by_both_ends(tmp_path):
    c = collectives(read_traces(_pairs(tmp_path / "p2p")))
    first, second = c["calls"]
    assert first["transfer_s"] == pytest.approx(10 * US)            # not -40 us
    assert c["matched"] == 2 and c["disjoint"] == 1
    assert first["wait_s"] == {"0": 0.0, "1": 0.0}                   # no rank waited longer than its kernel ran
    assert second["transfer_s"] == pytest.approx(60 * US)
    assert second["wait_s"] == {"0": pytest.approx(20 * US), "1": 0.0}
    assert all(r["transfer_s"] >= 0 for r in c["calls"]) and all(k["transfer_s"] >= 0 for k in c["by_kind"])
    # 2 MiB over 10 us and 60 us: algbw from a positive time only
    assert first["algbw"] == pytest.approx(2 * N / (10 * US))
    assert sum(k["transfer_s"] for k in c["by_kind"]) == pytest.approx(70 * US)
    assert any("did not overlap in time" in line for line in collective_lines(c))
