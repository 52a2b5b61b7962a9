"""Issue 25: `roofline counters FILE`, the counters result file read by analysis and diagnose, and
`roofline profile --counters` (without ncu: how to install it; with a fake ncu script on PATH: the command line
it builds and the join of the CSV that script prints)."""

import os
import stat

import pytest

from click.testing import CliRunner

from profiler.cli import main
from roofline.analysis import analyze, level_points
from roofline.verdicts.diagnosis import diagnose
from roofline.records import read_results
from test_counters_read import A100_POINTS, H100_POINTS, NCU, manifest


def run(args, env=None):
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def test_counters_command_joins_and_diagnoses(tmp_path):
    man = manifest(tmp_path, H100_POINTS)
    r = run(["counters", str(NCU / "h100_raw.csv"), "--join", str(man), "--out", str(tmp_path / "o"), "--no-report"])
    assert r.exit_code == 0, r.output
    assert "measured vs model: q_proj decode b1 ctx512: 1.02x the weight bytes, 16.00x the model's FLOPs" in r.output
    assert "3 joined to model points" in r.output
    rf = read_results(tmp_path / "o" / "results.jsonl")
    assert rf.header.kind == "counters" and rf.device.name == "NVIDIA H100 SXM5 80GB"
    assert [m.timer for m in rf.measurements] == ["ncu"] * 3
    a = analyze(rf)
    q = a.results[0]
    pts = level_points(q, rf.device)
    assert [p[0] for p in pts] == ["DRAM", "L2", "L1"]
    assert pts[0][1] == q.point.cost.flops / 34_088_190 and pts[2][1] == q.point.cost.flops / 68.16e6
    assert pts[0][3] == rf.device.bandwidth and pts[1][3] is None      # no L2 ceiling in the catalogue
    rules = {(f.rule, f.claim.split(":")[0]) for f in diagnose([rf])}
    assert ("counters-bytes-over", "attention decode b64 ctx4096") in rules
    assert ("counters-flops", "q_proj decode b1 ctx512") in rules
    over = next(f for f in diagnose([rf]) if f.rule == "counters-bytes-over")
    assert over.claim.startswith("attention decode b64 ctx4096: 2.4x the KV bytes: the cache is read more than once")


def test_counters_a100_peak_from_file_and_errors(tmp_path):
    r = run(["counters", str(NCU / "a100_long.csv"), "--join", str(manifest(tmp_path, A100_POINTS)), "--out",
             str(tmp_path / "a"), "--no-report"])
    assert r.exit_code == 0, r.output
    rf = read_results(tmp_path / "a" / "results.jsonl")
    assert rf.device.bandwidth == 1280 * 1.59e9 and rf.device.source == "ncu"
    assert rf.header.datasheet.bandwidth == pytest.approx(2.039e12)
    assert "estimated: sm__inst_executed_pipe_tensor_op_hmma.sum x 4,096 FLOPs" in r.output
    for bad, says in (("bad_unknown_unit.csv", "unknown unit 'furlong'"), ("bad_no_header.csv", "no Nsight Compute")):
        r = CliRunner().invoke(main, ["counters", str(NCU / bad), "--out", str(tmp_path / bad)])
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1


def test_half_metrics_said(tmp_path):
    r = CliRunner().invoke(main, ["counters", str(NCU / "half_metrics.csv"), "--out", str(tmp_path / "h"),
                                  "--no-report"])
    assert r.exit_code == 0
    assert "note: 1 of 4 launch(es) lack metrics" in r.output
    line = next(x for x in r.output.splitlines() if x.startswith("_add_kernel"))
    assert line.count("missing") == 2          # DRAM and FLOPs said missing; L2 and L1 measured


PROFILE = ["profile", "--counters", "--model", "tiny", "--backends", "triton", "--phases", "decode", "--batches", "1",
           "--contexts", "64", "--no-report"]


def test_profile_counters_without_ncu_says_how_to_install(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = CliRunner().invoke(main, PROFILE + ["--out", str(tmp_path / "p")], env={"PATH": str(empty)})
    assert r.exit_code == 2, r.output
    assert "`ncu` is not on PATH: install it" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "p" / "results.jsonl").exists()


def test_profile_counters_with_a_fake_ncu(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    args = tmp_path / "ncu-args.txt"
    ncu = bin_ / "ncu"
    ncu.write_text(f'#!/bin/sh\necho "$@" > {args}\ncat {NCU / "h100_raw.csv"}\n')
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    r = CliRunner().invoke(main, PROFILE + ["--out", str(tmp_path / "p")],
                           env={"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"})
    assert r.exit_code == 0, r.output
    cmd = args.read_text().split()
    assert cmd[:3] == ["--csv", "--page", "raw"] and cmd[cmd.index("--replay-mode") + 1] == "kernel"
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert {"gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
            "l1tex__t_bytes.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum",
            "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"} <= set(metrics)
    assert cmd[-3:-1] == ["profiler.counters_run", "--child"] and cmd[-1].endswith("manifest.json")
    rf = read_results(tmp_path / "p" / "results.jsonl")
    joined = [m.point.op for m in rf.measurements if m.point.model]
    assert joined == ["q_proj", "attention", "attn_residual"]   # the tiny model's points, by kernel and order
    assert (tmp_path / "p" / "ncu.csv").read_text() == (NCU / "h100_raw.csv").read_text()   # ncu's stdout kept


def test_roofline_figure_draws_each_launchs_l2_and_l1_points(tmp_path):
    from reports.roofline_plot import plot_roofline
    from reports.style import new_figure

    man = manifest(tmp_path, H100_POINTS)
    r = run(["counters", str(NCU / "h100_raw.csv"), "--join", str(man), "--out", str(tmp_path / "o"), "--no-report"])
    assert r.exit_code == 0, r.output
    rf = read_results(tmp_path / "o" / "results.jsonl")
    fig, ax = new_figure(8, 6)
    plot_roofline(ax, rf)
    gids = [c.get_gid() for c in ax.collections]
    on_roof = [q for q in analyze(rf).results if level_points(q, rf.device)]
    assert gids.count("level:L2") == gids.count("level:L1") == len(on_roof) > 0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "L2 bytes (counters)" in labels and "L1 bytes (counters)" in labels


def test_a_long_export_says_how_far_the_reading_got(tmp_path, monkeypatch):
    """Every PROGRESS_ROWS rows (here 2, on a 4-launch file) a line: rows done, rows in all, time spent and left,
    driven by an injected clock; then one line before the join and the writing."""
    import roofline.counters as C
    from profiler import counters_run as R

    monkeypatch.setattr(C, "PROGRESS_ROWS", 2)
    monkeypatch.setattr(R, "PROGRESS_ROWS", 2)
    ticks = iter(range(0, 100, 5))
    said = []
    run = R.CountersRun(NCU / "h100_raw.csv", out=tmp_path / "o", mode="overwrite", report=False)
    R.run_counters(run, said.append, clock=lambda: float(next(ticks)))
    reading = [s for s in said if s.startswith("reading ")]
    f = NCU / "h100_raw.csv"
    assert reading == [f"reading {f}: 2 of 4 rows in 5 s, about 5 s left", f"reading {f}: 4 of 4 rows in 10 s, about 0 s left"]
    assert "read 4 launches in 15 s; joining them and writing the results ..." in said
