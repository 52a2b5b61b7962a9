"""The trace report's timeline of GPU idle gaps (roofline/traces/idle.py's ``timeline``, reports/idle_plot.py).

Fixture: tests/data/traces/idle_causes.json (make_traces_issue24.py derives it): A 100-200, B 300-350,
C 400-450 + E 450-453 on stream 7, D 480-500 on stream 8, all inside one "decode" annotation (0-600). From the
first GPU activity (100 us): busy 0-100, 200-250, 300-353, 380-400; gaps 100-200 host-bound, 250-300
synchronisation, 353-380 other; window 400 us.
"""

import json
import random
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from matplotlib.colors import to_rgba

from profiler.cli import main
from reports import write_report
from reports.idle_plot import BUSY_COLOR, CAUSE_COLORS, has_idle_timeline, idle_figure, plot_idle
from reports.style import new_figure
from roofline.traces import idle as trace_idle
from roofline.records import read_results
from roofline.traces.events import read_trace
from roofline.traces.idle import idle_causes, timeline
from roofline.traces.phases import parse_markers

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import BF, F32, GEMM, Builder
from make_traces_issue24 import H100, runtime

US = 1e-6


def decode_trace(path, steps, kernels=6, seed=0):
    """A generated decode run: one prefill annotation (4 GEMMs, 200 us each, back to back), then ``steps`` decode
    annotations, each a host op ``vllm::prepare_inputs`` (20-300 us; 900 every 7th step) then ``kernels`` GEMMs
    launched 10 us apart (30-60 us each: they queue, sometimes 2 us apart), a ``cudaStreamSynchronize`` after
    every 3rd step. ``tests/test_idle_plot.py`` draws it; ``python tests/test_idle_plot.py OUT.json STEPS`` writes
    a large one to look at."""
    rng = random.Random(seed)
    b = Builder(devices=(H100,))
    b.annotation("prefill", 0, 400)
    gpu_end = 0
    for k in range(4):
        e = b.op("aten::mm", 10 + 20 * k, 15, [[512, 4096], [4096, 4096]], [BF, BF])
        gpu_end = max(gpu_end, 17 + 20 * k) + 200
        b.launch(e, 12 + 20 * k, gpu_end - 200, 200, GEMM)
    t = 420
    for s in range(steps):
        host = rng.choice([20, 40, 60, 300]) if s % 7 else 900
        b.op("vllm::prepare_inputs", t, host)
        begin, t = t, t + host + 2
        for _ in range(kernels):
            e = b.op("aten::mm", t, 8, [[1, 4096], [4096, 4096]], [BF, BF])
            ts = max(t + 6, gpu_end + (rng.choice([0, 0, 2]) if t < gpu_end else 0))
            dur = rng.choice([30, 40, 60])
            b.launch(e, t + 2, ts, dur, GEMM)
            gpu_end, t = ts + dur, t + 10
        if s % 3 == 0:
            b.corr += 1
            runtime(b, "cudaStreamSynchronize", t, gpu_end + 15 - t, b.corr)
            t = gpu_end + 15
        b.annotation("decode", begin, t - begin)
    b.dump(Path(path))
    return Path(path)


def flat(pairs) -> list:
    return [x for p in pairs for x in p]


def by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def rects(ax, gid) -> list:
    """(x, width) of each bar a broken_barh with ``gid`` drew."""
    (coll,) = [c for c in ax.collections if c.get_gid() == gid]
    out = []
    for p in coll.get_paths():
        xs = p.vertices[:, 0]
        out.append((round(xs.min() / US, 6), round((xs.max() - xs.min()) / US, 6)))
    return sorted(out)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("idle")
    res = CliRunner().invoke(main, ["trace", str(DATA / "idle_causes.json"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_timeline_of_the_fixture_trace_in_seconds_from_the_first_gpu_activity():
    line = idle_causes(read_trace(DATA / "idle_causes.json"))["timeline"]
    assert line["window_s"] == pytest.approx(400 * US)
    assert flat(line["busy"]) == pytest.approx([0, 100 * US, 200 * US, 250 * US, 300 * US, 353 * US, 380 * US,
                                                400 * US])
    assert [g[2] for g in line["gaps"]] == ["host-bound", "synchronisation", "other"]
    assert flat(g[:2] for g in line["gaps"]) == pytest.approx([100 * US, 200 * US, 250 * US, 300 * US, 353 * US,
                                                              380 * US])
    # busy 100 + 50 + 53 + 20 = 223 us, gaps 100 + 50 + 27 = 177 us: the window, nothing folded
    assert line["merged_gaps"] == 0 and line["merged_s"] == 0.0
    assert line["phases"] == [[0.0, pytest.approx(400 * US), "decode"]]


def test_past_max_gaps_the_shortest_fold_into_busy_time_and_the_data_says_so(monkeypatch):
    monkeypatch.setattr(trace_idle, "MAX_GAPS", 2)
    busy = [[0, 10], [12, 20], [25, 30], [31, 40]]                  # microseconds
    gaps = [(2, 10, "other", "", "k"), (5, 20, "host-bound", "op", "k"), (1, 30, "synchronisation", "", "k")]
    line = timeline(busy, gaps)
    # the 1 us sync gap (30-31) goes: busy 25-30 and 31-40 join into 25-40
    assert flat(line["busy"]) == pytest.approx([0, 10 * US, 12 * US, 20 * US, 25 * US, 40 * US])
    assert line["gaps"] == [[pytest.approx(10 * US), pytest.approx(12 * US), "other"],
                            [pytest.approx(20 * US), pytest.approx(25 * US), "host-bound"]]
    assert line["merged_gaps"] == 1 and line["merged_s"] == pytest.approx(1 * US)
    assert line["merged_by_cause_s"] == {"host-bound": 0.0, "synchronisation": pytest.approx(1 * US), "other": 0.0}
    # equal lengths: the earlier gap stays
    line = timeline([[0, 1], [2, 3], [4, 5], [6, 7]], [(1, 1, "other", "", ""), (1, 3, "host-bound", "", ""),
                                                      (1, 5, "other", "", "")])
    assert [g[2] for g in line["gaps"]] == ["other", "host-bound"]
    assert line["busy"][-1] == pytest.approx([4 * US, 7 * US])
    # three phase ranges past MAX_GAPS = 2: those under 1/2 of the 7 us window (3.5 us) go, and are counted
    line = timeline([[0, 7]], [], [(0, 1, "prefill"), (1, 5, "decode"), (5, 7, "prefill")])
    assert line["phases"] == [[pytest.approx(1 * US), pytest.approx(5 * US), "decode"]]
    assert line["phases_dropped"] == 2


def test_every_gap_longer_than_a_thousandth_of_the_window_is_kept_on_a_huge_timeline():
    rng = random.Random(7)
    t, busy, gaps = 0.0, [], []
    for _ in range(20_000):
        d = rng.choice([1.0, 2.0, 3.0])
        busy.append([t, t + d])
        t += d
        g = rng.choice([0.5, 1.0, 1.5, 100.0 if rng.random() < 0.01 else 0.25])
        gaps.append((g, t, rng.choice(trace_idle.CAUSES), "", ""))
        t += g
    busy.append([t, t + 1.0])
    line = timeline(busy, gaps)
    window = line["window_s"]
    assert len(line["gaps"]) == trace_idle.MAX_GAPS and len(line["busy"]) == trace_idle.MAX_GAPS + 1
    long = [g for g in gaps if g[0] * US > window / trace_idle.MAX_GAPS]
    drawn = {round(s / US, 3) for s, _, _ in line["gaps"]}
    assert long and all(round(g[1], 3) in drawn for g in long)
    assert line["merged_gaps"] == 20_000 - trace_idle.MAX_GAPS
    idle = sum(g[0] for g in gaps) * US
    shown = sum(e - s for s, e, _ in line["gaps"])
    assert shown + line["merged_s"] == pytest.approx(idle)
    assert sum(e - s for s, e in line["busy"]) + shown == pytest.approx(window)
    assert len(json.dumps(line)) < 80_000          # the result file's header stays small


def _phased_trace(path, prefill_name="prefill"):
    """prefill annotation 0-100 (a GEMM launched at 10 runs 50-150); decode 200-300 (launched 210 and 250, running
    220-240 and 260-280) and decode 300-400 (launched 310, running 320-330); an unmarked "step" 400-500 (launched
    410, running 420-430). From the first GPU activity (50): prefill 0-100 us, decode 170-280 us (two steps)."""
    b = Builder(devices=(H100,))
    b.annotation(prefill_name, 0, 100)
    b.annotation("decode", 200, 100)
    b.annotation("decode", 300, 100)
    b.annotation("step", 400, 100)
    for launch, start, dur in ((10, 50, 100), (210, 220, 20), (250, 260, 20), (310, 320, 10), (410, 420, 10)):
        e = b.op("aten::mm", launch - 2, 8, [[1, 4096], [4096, 4096]], [BF, BF])
        b.launch(e, launch, start, dur, GEMM)
    b.dump(path)
    return path


def test_phase_ranges_are_where_the_gpu_ran_the_marked_work(tmp_path):
    line = idle_causes(read_trace(_phased_trace(tmp_path / "p.json")))["timeline"]
    assert line["phases"] == [[0.0, pytest.approx(100 * US), "prefill"],
                              [pytest.approx(170 * US), pytest.approx(280 * US), "decode"]]
    t = read_trace(_phased_trace(tmp_path / "q.json", "ctx_encode"))
    assert [p[2] for p in idle_causes(t)["timeline"]["phases"]] == ["decode"]
    line = idle_causes(t, parse_markers(["prefill=ctx_encode"]))["timeline"]
    assert [p[2] for p in line["phases"]] == ["prefill", "decode"]


def test_the_figure_draws_each_gap_in_its_cause_colour_with_the_totals_in_the_legend(traced):
    assert b'<g id="idle:host-bound" ' in (traced / "figures" / "idle.svg").read_bytes()   # the report's own SVG
    rf = read_results(traced / "results.jsonl")     # the matplotlib figure (`roofline trace --png`) draws the same
    assert has_idle_timeline(rf)
    fig = idle_figure(rf)
    ax = fig.figure.axes[0]
    assert rects(ax, "idle:busy") == [(0, 100), (200, 50), (300, 53), (380, 20)]
    assert rects(ax, "idle:host-bound") == [(100, 100)]
    assert rects(ax, "idle:synchronisation") == [(250, 50)]
    assert rects(ax, "idle:other") == [(353, 27)]
    assert rects(ax, "idle:phase:decode") == [(0, 400)]
    for cause, color in CAUSE_COLORS.items():
        (coll,) = by_gid(ax, f"idle:{cause}")
        assert tuple(coll.get_facecolor()[0]) == pytest.approx(to_rgba(color))
    assert tuple(by_gid(ax, "idle:busy")[0].get_facecolor()[0]) == pytest.approx(to_rgba(BUSY_COLOR))
    assert len(set(CAUSE_COLORS.values()) | {BUSY_COLOR}) == 4
    # 100/177 = 56%, 50/177 = 28%, 27/177 = 15%
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "busy: 223 us", "host-bound: 100 us (56% of idle)", "synchronisation: 50 us (28% of idle)",
        "other: 27 us (15% of idle)", "phase: decode"]
    assert [a.get_text() for a in by_gid(ax, "idle:largest")] == [
        "CPU in vllm::prepare_inputs\n100 us", "synchronisation\n50 us", "other\n27 us"]
    assert not by_gid(ax, "idle:note") and "simplified" not in fig.caption
    assert ax.get_xlim() == pytest.approx((0, 400 * US))


def test_a_simplified_timeline_says_so_on_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_idle, "MAX_GAPS", 20)
    idle = idle_causes(read_trace(decode_trace(tmp_path / "d.json", steps=30)))
    line = idle["timeline"]
    assert len(line["gaps"]) == 20 and line["merged_gaps"] > 0
    _fig, ax = new_figure(12, 2.6)
    plot_idle(ax, idle)
    drawn = sum(len(by_gid(ax, f"idle:{c}")[0].get_paths()) for c in CAUSE_COLORS)
    assert drawn == 20 and len(by_gid(ax, "idle:busy")[0].get_paths()) == 21
    (note,) = by_gid(ax, "idle:note")
    assert note.get_text().startswith(f"simplified: {line['merged_gaps']:,} gap(s) shorter than")
    assert [p[2] for p in line["phases"]] == ["prefill", "decode"]


def test_the_html_report_holds_the_figure(traced):
    html = (traced / "report.html").read_text()
    assert '<figure id="fig-idle">' in html and "GPU idle gaps by cause." in html
    import base64

    assert base64.b64encode((traced / "figures" / "idle.svg").read_bytes()).decode() in html


def test_an_old_result_file_without_the_timeline_still_renders_without_the_figure(traced, tmp_path):
    lines = (traced / "results.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    del head["settings"]["idle"]["timeline"]
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    assert not has_idle_timeline(read_results(old))
    paths = write_report([old], tmp_path / "rep")
    assert "png:roofline" in paths and not any(k.endswith(":idle") for k in paths)
    assert 'id="fig-idle"' not in paths["html"].read_text()


def test_a_cpu_trace_gets_no_idle_figure(tmp_path):
    b = Builder(devices=())
    b.annotation("decode", 0, 200)
    b.op("aten::mm", 10, 50, [[1, 64], [64, 64]], [F32, F32])
    b.op("aten::mm", 100, 50, [[1, 64], [64, 64]], [F32, F32])
    b.dump(tmp_path / "cpu_trace.json")
    dev = tmp_path / "cpu.json"
    dev.write_text(json.dumps({"name": "test CPU", "kind": "cpu", "peak_tflops": {"fp32": 0.1}, "bandwidth_gbs": 20}))
    res = CliRunner().invoke(main, ["trace", str(tmp_path / "cpu_trace.json"), "--device-file", str(dev), "--out",
                                    str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    rf = read_results(tmp_path / "o" / "results.jsonl")
    assert rf.header.settings["idle"] == {} and not has_idle_timeline(rf)
    assert (tmp_path / "o" / "figures" / "roofline.svg").is_file()
    assert not (tmp_path / "o" / "figures" / "idle.svg").exists()


def _five_steps(path):
    """Five decode annotations at a = 0, 200, ..., 800 (199 us each): the host op vllm::prepare_inputs a to a + 100,
    then GEMM A launched at a + 102 runs a + 110 to a + 130 and GEMM B launched at a + 104 runs from a + 130 for
    L = 10, 50, 30, 40, 20 us. From the first GPU activity (110): step k runs 200k to 200k + 20 + L; the gap after
    it (to the next step's start) is 180 - L = 170, 130, 150, 140 us, host-bound in vllm::prepare_inputs."""
    b = Builder(devices=(H100,))
    for k, length in enumerate((10, 50, 30, 40, 20)):
        a = 200 * k
        b.annotation("decode", a, 199)
        b.op("vllm::prepare_inputs", a, 100)
        for launch, start, dur in ((a + 102, a + 110, 20), (a + 104, a + 130, length)):
            e = b.op("aten::mm", launch - 1, 8, [[1, 4096], [4096, 4096]], [BF, BF])
            b.launch(e, launch, start, dur, GEMM)
    b.dump(path)
    return path


def test_the_zoom_holds_the_median_step_and_its_neighbours_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_idle, "ZOOM_ABOVE", 3)                     # 4 gaps: a zoom
    zoom = idle_causes(read_trace(_five_steps(tmp_path / "z.json")))["timeline"]["zoom"]
    # GPU spans 30, 70, 50, 60, 40 us: sorted 30 40 [50] 60 70, the median is step 3; with one either side: 2-4
    assert zoom["pick"] == "median step"
    assert zoom["steps"] == [[pytest.approx(200 * US), pytest.approx(270 * US), "decode", 2],
                             [pytest.approx(400 * US), pytest.approx(450 * US), "decode", 3],
                             [pytest.approx(600 * US), pytest.approx(660 * US), "decode", 4]]
    assert (zoom["start_s"], zoom["end_s"]) == (pytest.approx(200 * US), pytest.approx(660 * US))
    # A and B abut: one busy interval per step, two kernels each
    assert flat(zoom["busy"]) == pytest.approx([x * US for x in (200, 270, 400, 450, 600, 660)])
    assert flat(zoom["kernels"]) == pytest.approx([x * US for x in (200, 220, 220, 270, 400, 420, 420, 450, 600, 620,
                                                                    620, 660)])
    assert zoom["kernels_cut"] == 0
    # the gaps after steps 2 and 3: 180 - 50 = 130 us and 180 - 30 = 150 us
    assert zoom["gaps"] == [[pytest.approx(270 * US), pytest.approx(400 * US), "host-bound"],
                            [pytest.approx(450 * US), pytest.approx(600 * US), "host-bound"]]
    big = zoom["largest"]
    assert (big["at_s"], big["gap_s"]) == (pytest.approx(450 * US), pytest.approx(150 * US))
    assert big["cause"] == "host-bound" and big["cpu_op"] == "vllm::prepare_inputs"
    # 4 gaps are not more than the default ZOOM_ABOVE: a short trace gets no zoom
    monkeypatch.setattr(trace_idle, "ZOOM_ABOVE", 50)
    assert "zoom" not in idle_causes(read_trace(tmp_path / "z.json"))["timeline"]


def test_without_marked_steps_the_zoom_takes_the_gaps_around_the_middle_one(monkeypatch):
    monkeypatch.setattr(trace_idle, "ZOOM_GAPS", 2)
    trace = read_trace(DATA / "idle_causes.json")
    busy = trace_idle.busy_intervals(trace.gpu)        # 100-200, 300-350, 400-453, 480-500 (trace us)
    gaps = [(100, 200, "host-bound", "vllm::prepare_inputs", "k"), (50, 350, "synchronisation", "", "k"),
            (27, 453, "other", "", "k")]
    zoom = trace_idle.zoom_window(trace, busy, gaps, [])
    # the middle gap is gap 1; gaps 0-1 around it lie between busy[0] and busy[2]: 100-453, so 0-353 us from the
    # first activity at 100
    assert zoom["pick"] == "middle gaps" and zoom["steps"] == []
    assert (zoom["start_s"], zoom["end_s"]) == (0.0, pytest.approx(353 * US))
    assert [g[2] for g in zoom["gaps"]] == ["host-bound", "synchronisation"]
    assert zoom["largest"]["cpu_op"] == "vllm::prepare_inputs" and zoom["largest"]["gap_s"] == pytest.approx(100 * US)


def test_past_zoom_max_kernels_the_window_ends_at_the_last_kernel_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_idle, "ZOOM_ABOVE", 3)
    monkeypatch.setattr(trace_idle, "ZOOM_MAX_KERNELS", 3)
    zoom = idle_causes(read_trace(_five_steps(tmp_path / "z.json")))["timeline"]["zoom"]
    # steps 2-4 hold 6 kernels: the first 3 are kept (200-220, 220-270, 400-420) and the window ends at 420
    assert zoom["kernels_cut"] == 3 and zoom["end_s"] == pytest.approx(420 * US)
    assert flat(zoom["busy"]) == pytest.approx([200 * US, 270 * US, 400 * US, 420 * US])
    assert [g[:2] for g in zoom["gaps"]] == [[pytest.approx(270 * US), pytest.approx(400 * US)]]


def test_a_bubble_between_queued_kernels_during_a_sync_is_not_the_syncs(tmp_path):
    """decode_trace's every 3rd step ends in cudaStreamSynchronize, called while its kernels are still queued:
    the 0-2 us bubbles between them are 'other'; the gap after the sync returns (the next launch came late) is
    'synchronisation'."""
    b = Builder(devices=(H100,))
    b.annotation("decode", 0, 300)
    for launch, start in ((10, 100), (12, 152)):                  # queued: 100-150, bubble 150-152, 152-202
        e = b.op("aten::mm", launch - 1, 1, [[1, 4096], [4096, 4096]], [BF, BF])
        b.launch(e, launch, start, 50, GEMM)
    b.corr += 1
    runtime(b, "cudaStreamSynchronize", 20, 190, b.corr)           # 20-210: the host waits past the GPU's end
    e = b.op("aten::mm", 219, 1, [[1, 4096], [4096, 4096]], [BF, BF])
    b.launch(e, 220, 230, 50, GEMM)                                 # launched after the sync: gap 202-230
    b.dump(tmp_path / "s.json")
    idle = idle_causes(read_trace(tmp_path / "s.json"))
    assert [g[2] for g in idle["timeline"]["gaps"]] == ["other", "synchronisation"]
    assert idle["by_cause_s"]["other"] == pytest.approx(2 * US)
    assert idle["by_cause_s"]["synchronisation"] == pytest.approx(28 * US)


def test_the_figure_draws_the_zoom_under_the_strip(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_idle, "ZOOM_ABOVE", 3)
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["trace", str(_five_steps(tmp_path / "z.json")), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rf = read_results(out / "results.jsonl")
    fig = idle_figure(rf)
    ax, zax = fig.figure.axes[:2]
    # the strip boxes the zoom's window (200-660 us)
    (mark,) = by_gid(ax, "idle:zoom-mark")
    assert rects(ax, "idle:zoom-mark") == [(200, 460)]
    # the zoom: x from its start (200 us); every kernel, every gap at its true width
    assert rects(zax, "zoom:kernels") == [(0, 20), (20, 50), (200, 20), (220, 30), (400, 20), (420, 40)]
    assert rects(zax, "zoom:busy") == [(0, 70), (200, 50), (400, 60)]
    assert rects(zax, "zoom:host-bound") == [(70, 130), (250, 150)]
    assert rects(zax, "zoom:step:decode") == [(0, 70), (200, 50), (400, 60)]
    (coll,) = by_gid(zax, "zoom:kernels")
    shades = [tuple(c) for c in coll.get_facecolor()]
    assert shades[0] != shades[1] and shades[0] == shades[2]          # neighbours alternate
    assert tuple(by_gid(zax, "zoom:host-bound")[0].get_facecolor()[0]) == pytest.approx(to_rgba(CAUSE_COLORS[
        "host-bound"]))
    (label,) = by_gid(zax, "zoom:largest")
    assert label.get_text() == "largest gap here (host-bound): CPU in vllm::prepare_inputs\n150 us"
    assert label.xy[0] == pytest.approx(325 * US)                       # the gap's middle: 250 + 150 / 2
    # idle 130 + 150 = 280 us of the 460 us window (61%)
    assert zax.get_title() == ("Zoom: decode steps 2-4 (the median step by GPU time and its neighbours): idle 280 us "
                               "of 460 us (61%)")
    assert [t.get_text() for t in zax.get_legend().get_texts()] == [
        "kernel / copy (6, shades alternate)", "host-bound: 280 us", "synchronisation: 0 ns", "other: 0 ns"]
    assert zax.get_xlim() == pytest.approx((0, 460 * US))
    assert "Below: a zoom on the median step" in fig.caption


def test_a_phase_narrower_than_a_pixel_says_so_in_the_legend():
    # a 1 s window: a pixel is 1/MAX_GAPS of it, 1 ms; the 0.5 ms prefill cannot be seen, the decode can
    line = {"window_s": 1.0, "busy": [[0.0, 1.0]], "gaps": [], "merged_gaps": 0,
            "phases": [[0.0, 0.0005, "prefill"], [0.0005, 1.0, "decode"]]}
    idle = {"idle_s": 0.0, "by_cause_s": dict.fromkeys(CAUSE_COLORS, 0.0), "largest": [], "timeline": line}
    _fig, ax = new_figure(12, 2.6)
    plot_idle(ax, idle)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-2:] == ["phase: prefill (under a pixel here)", "phase: decode"]


if __name__ == "__main__":
    decode_trace(sys.argv[1], int(sys.argv[2]))
