"""Hand-built GPU-format traces (tests/data/traces/make_traces.py) with exact joins, sums and busy times."""

from pathlib import Path

import pytest

from roofline import formulas as F
from roofline.analysis import analyze
from roofline.cost import Cost
from roofline.records import RunHeader, ResultFile
from roofline.traces.analyze import analyze_trace
from roofline.traces.device import trace_device
from roofline.traces.events import read_trace, read_traces, gpu_time

DATA = Path(__file__).parent / "data" / "traces"
US = 1e-6
GEMM_KERNEL = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn"


def by_op(result):
    return {(m.point.phase, m.point.op): m for m in result.measurements}


def test_newer_linkage_joins_each_kernel_to_its_innermost_op():
    t = read_trace(DATA / "gpu_new.json")
    joined = {g.name[:20]: (g.op.name if g.op else None) for g in t.gpu}
    # linear > matmul > mm: the kernel's External id names the innermost op, aten::mm
    assert joined["ampere_bf16_s16816ge"] == "aten::mm"
    assert joined["sm80_xmma_gemm_bf16b"] == joined["void cutlass::Kernel"] == "aten::mm"
    assert joined["Memcpy HtoD (Pageabl"] == "aten::copy_"
    assert joined["Memset (Device)"] is None                          # launched outside every op


@pytest.mark.parametrize("name", ["gpu_new.json", "gpu_old.json", "gpu_new.json.gz"])
def test_both_linkages_and_gzip_give_the_same_instances(name):
    r = analyze_trace(read_trace(DATA / name))
    ms = by_op(r)
    # the split-K GEMM's two kernels are one instance: 120 + 20 = 140 us
    split = ms[("prefill", "aten::mm [8,4096]x[4096,14336] bf16")]
    assert list(split.times_s) == pytest.approx([140 * US]) and split.point.count == 1
    assert split.config["kernels_per_instance"] == 2
    assert split.point.cost == F.gemm(8, 4096, 14336)
    # linear > matmul > mm is one mm instance, costed as the mm: 2 x 8 x 4096 x 4096 FLOPs
    mm = ms[("prefill", "aten::mm [8,4096]x[4096,4096] bf16")]
    assert list(mm.times_s) == pytest.approx([80 * US]) and mm.point.cost == F.linear(8, 4096, 4096)
    assert ms[("prefill", "aten::add [8,4096]x[8,4096] bf16")].point.cost == F.residual_add(8, 4096)
    # the memcpy under copy_ costs the cast: 4,096 fp32 read + 4,096 bf16 written
    cp = ms[("decode", "aten::copy_ [1,4096] fp32->bf16")]
    assert cp.point.cost == Cost(0, 4096 * 4 + 4096 * 2) and cp.config["category"] == "cast"
    # kernels that join no op are counted, uncosted, by what their names say
    assert ms[("decode", "unattributed elementwise")].flags == ("uncosted",)
    assert list(ms[("decode", "unattributed memset")].times_s) == pytest.approx([5 * US])
    s = r.summary
    assert s["attributed_s"] == pytest.approx(315 * US)
    assert s["uncosted_s"] == pytest.approx(15 * US) and s["costed_s"] == pytest.approx(300 * US)
    assert s["phases"]["prefill"]["steps"] == s["phases"]["decode"]["steps"] == 1


def test_gpu_time_sum_busy_idle_and_copies():
    g = gpu_time(read_trace(DATA / "gpu_new.json"))
    # kernels 80 + 120 + 20 + 20 + 50 + 10 = 300 us; memcpy 10, memset 5; nothing overlaps: busy 315 us
    assert g["kernel_sum_s"] == pytest.approx(300 * US) and g["kernels"] == 6
    assert g["memcpy_s"] == pytest.approx(10 * US) and g["memset_s"] == pytest.approx(5 * US)
    assert g["busy_s"] == pytest.approx(315 * US)
    # window 300..1410 = 1,110 us; idle 1,110 - 315 = 795 us; the fill and the memset joined no op: 15 us
    assert g["window_s"] == pytest.approx(1110 * US) and g["idle_s"] == pytest.approx(795 * US)
    assert g["unattributed_s"] == pytest.approx(15 * US)


def test_overlapping_streams_count_once_in_busy_time():
    t = read_trace(DATA / "two_streams.json")
    g = gpu_time(t)
    # 100-200 (stream 7), 150-300 (stream 8), 400-450: sum 300 us, union 250 us, window 350 us, idle 100 us
    assert g["kernel_sum_s"] == pytest.approx(300 * US)
    assert g["busy_s"] == g["kernel_busy_s"] == pytest.approx(250 * US)
    assert g["window_s"] == pytest.approx(350 * US) and g["idle_s"] == pytest.approx(100 * US)
    assert g["streams"] == 2
    m = analyze_trace(t).measurements[0]
    assert sorted(m.times_s) == pytest.approx([50 * US, 100 * US, 150 * US]) and m.point.count == 3


def test_graph_replay_without_capture_lists_each_kernel_by_name():
    r = analyze_trace(read_trace(DATA / "graph_replay.json"))
    ms = {m.point.op: m for m in r.measurements}
    # the launch's three kernels (60 + 10 + 60 us), no capture: each kernel its own instance, by name and category
    gemm = ms[f"{GEMM_KERNEL} (graph replay, no capture)"]
    norm = ms["void vllm::rms_norm_kernel<c10::BFloat16, 8>(...) (graph replay, no capture)"]
    assert list(gemm.times_s) == pytest.approx([60 * US, 60 * US]) and gemm.config["category"] == "gemm"
    assert list(norm.times_s) == pytest.approx([10 * US]) and norm.config["category"] == "norm"
    assert gemm.flags == norm.flags == ("uncosted",)          # no shapes, no kernel-name rule that costs them
    assert r.summary["uncosted_share"] == 1.0 and r.summary["time"]["graph_launches"] == 1
    assert r.summary["attribution"]["replay_no_op_s"] == pytest.approx(130 * US)


def test_graph_replay_with_its_capture_trace_is_costed_from_the_captured_shapes():
    r = analyze_trace(read_trace(DATA / "graph_replay.json"), captures=[read_trace(DATA / "graph_capture.json")])
    ms = by_op(r)
    # replayed kernels (gemm, rms_norm, gemm) map in order to the captured mm, _C::rms_norm, mm
    a = ms[("decode", "aten::mm [1,4096]x[4096,4096] bf16")]
    b = ms[("decode", "aten::mm [1,4096]x[4096,11008] bf16")]
    n = ms[("decode", "_C::rms_norm [1,4096] bf16")]
    assert list(a.times_s) == pytest.approx([60 * US]) and a.point.cost == F.linear(1, 4096, 4096)
    assert list(b.times_s) == pytest.approx([60 * US]) and b.point.cost == F.linear(1, 4096, 11008)
    assert n.point.cost == F.rmsnorm(1, 4096) and not any(m.flags for m in r.measurements)
    assert r.summary["graph_kernels_mapped"] == 3 and r.summary["graph_kernels_unmapped"] == 0
    assert r.summary["uncosted_share"] == 0.0


def test_two_ranks_from_a_folder_with_their_collectives():
    traces = read_traces(DATA / "ranks")
    assert [t.rank for t in traces] == [0, 1] and {t.world_size for t in traces} == {2}
    r0, r1 = (analyze_trace(t) for t in traces)
    comm = by_op(r0)[("decode", "record_param_comms allreduce 32768 x bf16 over 2 ranks")]
    assert comm.flags == ("communication",) and comm.point.tp == 2
    # 32,768 bf16 = 65,536 bytes; ring all-reduce over 2 ranks puts 2 x 1/2 x 65,536 on the wire
    assert comm.config["detail"]["message_bytes"] == 65_536 and comm.config["detail"]["wire_bytes"] == 65_536
    assert r0.summary["communication_s"] == pytest.approx(100 * US)
    # rank 1's NCCL kernel starts 40 us later: its window is longer, its busy time the same
    assert r0.summary["time"]["busy_s"] == r1.summary["time"]["busy_s"] == pytest.approx(150 * US)
    assert r1.summary["time"]["idle_s"] - r0.summary["time"]["idle_s"] == pytest.approx(40 * US)


def test_analysis_keeps_uncosted_and_collective_time_out_of_the_verdict():
    t = read_traces(DATA / "ranks")[0]
    dev, _ = trace_device([t])
    r = analyze_trace(t, device_name=dev.name)
    rf = ResultFile(DATA / "ranks" / "rank0.json", RunHeader(device=dev, datasheet=dev, kind="trace", dtype=r.dtype),
                    r.measurements)
    (step,) = analyze(rf).steps
    # the step's time and cost are the mm's only; the all-reduce is said beside it
    assert step.time_s == pytest.approx(50 * US) and step.cost == F.gemm(8, 4096, 2048)
    assert step.communication_s == pytest.approx(100 * US) and step.traced_s == pytest.approx(150 * US)
    assert "in collectives" in step.sentence and step.missing == ()


def test_device_from_device_properties():
    dev, how = trace_device([read_trace(DATA / "gpu_new.json")])
    assert dev.key == "a100-sxm-80gb" and "A100-SXM4-80GB" in how
    dev, _ = trace_device([read_trace(DATA / "graph_replay.json")])
    assert dev.key == "h100-sxm"


def test_phase_markers_name_the_users_own_ranges(tmp_path):
    import json

    from roofline.traces.phases import parse_markers

    d = json.loads((DATA / "gpu_new.json").read_text())
    for e in d["traceEvents"]:
        if e.get("cat") == "user_annotation":
            e["name"] = {"prefill": "ctx_encode", "decode": "gen_step"}[e["name"]]
    p = tmp_path / "renamed.json"
    p.write_text(json.dumps(d))
    r = analyze_trace(read_trace(p), markers=parse_markers(["prefill=ctx_encode", "decode=GEN_STEP"]))
    assert {m.point.phase for m in r.measurements} == {"prefill", "decode"}
    assert "ctx_encode" in r.summary["phases"]["prefill"]["method"]
    assert by_op(r)[("prefill", "aten::mm [8,4096]x[4096,14336] bf16")].point.count == 1
    with pytest.raises(Exception, match="PHASE=NAME"):
        parse_markers(["warmup=x"])


def test_amd_traces_read_the_same_way(tmp_path):
    import json

    d = json.loads((DATA / "gpu_new.json").read_text())
    d["deviceProperties"] = [{"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992}]
    for e in d["traceEvents"]:
        if e.get("cat") == "cuda_runtime":
            e["name"] = e["name"].replace("cuda", "hip")        # hipLaunchKernel, hipMemcpyAsync, hipMemsetAsync
        if e.get("cat") == "kernel":
            e["name"] = e["name"].replace("ampere_bf16_s16816gemm", "Cijk_Ailk_Bljk_BBS_BH_MT128x64")
    p = tmp_path / "amd.json"
    p.write_text(json.dumps(d))
    t = read_trace(p)
    r, ref = analyze_trace(t), analyze_trace(read_trace(DATA / "gpu_new.json"))
    assert [(m.point.op, list(m.times_s)) for m in r.measurements] == \
        [(m.point.op, list(m.times_s)) for m in ref.measurements]
    assert trace_device([t])[0].key == "mi300x"
