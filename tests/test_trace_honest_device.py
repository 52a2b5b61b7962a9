"""Issue 30, honest views: a GPU the catalogue does not know ("AMD Radeon Graphics", common on ROCm) still gets
every analysis that needs no device, and the roofline part says what to pass; where the trace's properties
identify the part (gfx90a, 104 CUs, 64 GB: one MI250 GCD) it is named, with how it was inferred."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline.devices import find_device
from roofline.traces.device import trace_device
from roofline.traces.events import read_trace, read_traces

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import BF, Builder  # noqa: E402
from make_traces_issue24 import ELEMS, NCCL, ROCM_GEMM  # noqa: E402

US = 1e-6
RADEON = {"id": 0, "name": "AMD Radeon Graphics", "totalGlobalMem": 68702699520, "computeMajor": 9,
          "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 104, "warpSize": 64}


def _ranks(folder, props):
    """Two ROCm ranks: a GEMM (100 us) then an all-reduce of 4,194,304 bf16 elements; rank 1's GEMM ends 30 us
    later, so rank 0 waits 30 us; the transfer is the earliest end less the last arrival: 300 - 230 = 70 us."""
    for rank, (gemm_end, ar) in enumerate(((200, (200, 300)), (230, (230, 310)))):
        b = Builder(devices=(props,), dist={"backend": "nccl", "rank": rank, "world_size": 2})
        b.annotation("decode", 0, 1000)
        e = b.op("aten::mm", 20, 20, [[8, 4096], [4096, 2048]], [BF, BF])
        b.launch(e, 25, 100, gemm_end - 100, ROCM_GEMM, api="hipLaunchKernel")
        meta = {"Collective name": "allreduce", "In msg nelems": ELEMS, "Out msg nelems": ELEMS, "Group size": 2,
                "dtype": "BFloat16", "Process Group Name": "0", "Seq": 1}
        e = b.op("record_param_comms", 50, 30, [[ELEMS]], [BF], **meta)
        b.launch(e, 55, ar[0], ar[1] - ar[0], NCCL, stream=20, api="hipLaunchKernel", extra=meta)
        b.dump(folder / f"rank{rank}.json")
    return folder


def _run(*args):
    return CliRunner().invoke(main, ["trace", *map(str, args)], catch_exceptions=False)


def test_gfx90a_with_104_cus_and_64_gb_is_one_mi250_gcd(tmp_path):
    folder = _ranks(tmp_path / "ranks", RADEON)
    dev, how = trace_device(read_traces(folder))
    mi250x = find_device("mi250x")
    # a GCD of a CDNA 2 part: the MI250X's rate per CU x 104 CUs; half its bandwidth and memory
    assert dev.name.startswith("AMD Instinct MI250 (one GCD")
    assert dev.peak("bf16") == pytest.approx(mi250x.peak("bf16") * 104 / 220)
    assert dev.peak("bf16") == pytest.approx(181.05e12, rel=1e-3)             # the MI250 datasheet's 362.1 / 2
    assert dev.bandwidth == pytest.approx(mi250x.bandwidth / 2) and dev.sms == 104
    assert "AMD Radeon Graphics" in how and "inferred" in how and "104 CUs" in how and "9.0" in how
    with_arch = dict(RADEON, gcnArchName="gfx90a:sramecc+:xnack-")
    assert "arch gfx90a" in trace_device(read_traces(_ranks(tmp_path / "arch", with_arch)))[1]


def test_a_whole_catalogue_part_is_its_own_entry(tmp_path):
    mi300x = dict(RADEON, computeMinor=4, numSms=304, totalGlobalMem=205822885888)
    dev, how = trace_device(read_traces(_ranks(tmp_path / "ranks", mi300x)))
    assert dev is find_device("mi300x") and "304 CUs, 206 GB" in how and "compute capability 9.4" in how


def test_a_part_nothing_identifies_gets_every_analysis_that_needs_no_device(tmp_path):
    folder = _ranks(tmp_path / "ranks", dict(RADEON, numSms=60, totalGlobalMem=17163091968))
    assert trace_device(read_traces(folder))[0] is None
    res = _run(folder, "--out", tmp_path / "o", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["device"] is None and d["results"] is None and d["report"] is None and d["steps"] == []
    assert "AMD Radeon Graphics" in d["roofline"] and "--device" in d["roofline"]
    r0 = d["ranks"][0]
    # kernel attribution, idle time and the costs of the ops: all there
    assert r0["attribution"]["op_share"] == 1.0 and r0["time"]["busy_s"] == pytest.approx(200 * US)
    assert r0["idle"]["idle_s"] == pytest.approx(r0["time"]["idle_s"])
    # collectives across the ranks: 70 us transfer, rank 0 waited 30 us for rank 1
    c = d["collectives"]
    assert c["matched"] == 1 and c["calls"][0]["transfer_s"] == pytest.approx(70 * US)
    assert c["wait_s"] == {"0": pytest.approx(30 * US), "1": 0.0} and c["straggler"]["rank"] == 1
    text = _run(folder, "--out", tmp_path / "o2")
    assert text.exit_code == 0 and "roofline: not drawn: the trace ran on 'AMD Radeon Graphics'" in text.output
    assert "pass --device" in text.output and "GPU busy 200 us" in text.output


def test_an_identified_part_is_judged_and_says_how(tmp_path):
    folder = _ranks(tmp_path / "ranks", RADEON)
    res = _run(folder, "--out", tmp_path / "o", "--no-report")
    assert res.exit_code == 0, res.output
    assert "device: AMD Instinct MI250 (one GCD" in res.output and "inferred from the trace's device properties" \
        in res.output
    assert (tmp_path / "o" / "results.jsonl").exists()
