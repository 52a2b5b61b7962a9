"""Nothing measured is lost or silently corrupted (issue 11): one writer per file, torn lines repaired,
resumes that must match, latency written as it runs, and result files validated where they are read.

Each test reproduces one way results were lost or corrupted before, through the commands a user runs.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import profiler.kernel_checks as K
import profiler.run as R
from profiler.cli import main
from roofline.analysis import analyze
from roofline.errors import RooflineError
from roofline.latency import latency_runs
from roofline.records import read_results
from roofline.writer import ResultWriter

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
TINY = ["--model", "tiny", "--phases", "decode", "--batches", "1,2", "--contexts", "8", "--budget-ms", "1",
        "--device", "cpu", "--no-report"]


@pytest.fixture(autouse=True)
def fast(monkeypatch, tmp_path):
    """Kernel validation and the ceilings are replaced by fast stand-ins (tests/test_profiler_cli.py tests them)."""
    import profiler.ceilings as C
    from roofline.devices import cpu_device

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(K, "validate_kernels", lambda *a, **k: [])
    monkeypatch.setattr(C, "get_ceilings", lambda device="cpu", **kw: C.Ceilings(
        cpu_device(C.device_name("cpu"), {"fp32": 1e11, "bf16": 5e10}, 2e10), None, {"label": "achievable"}))


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r


# ------------------------------------------------------------------ the writer

def test_a_torn_last_line_is_cut_before_resume_and_the_file_stays_readable(tmp_path):
    out = tmp_path / "D"
    assert cli("profile", *TINY, "--out", out, "--quiet").exit_code == 0
    path = out / "results.jsonl"
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[:last + 40])                      # a run killed 40 bytes into its last line
    rf = read_results(path)                                  # the reader tolerates it, and says so
    assert len(rf.measurements) == 37 and "was cut off (40 bytes" in rf.notices[0]
    r = cli("profile", *TINY, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert "was cut off (40 bytes, an interrupted write): it was removed before resuming" in r.output
    assert "1 measured, 0 skipped, 37 resumed" in r.output
    rf = read_results(path)
    assert len(rf.measurements) == 38 and not rf.notices     # whole again, every line parses
    assert cli("report", path, "--out", tmp_path / "rep").exit_code == 0


def test_a_second_run_on_the_same_file_stops_and_names_the_holder(tmp_path):
    out = tmp_path / "D"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from roofline.writer import ResultWriter
        w = ResultWriter({str(out / 'results.jsonl')!r}, mode="overwrite")
        print("locked", flush=True)
        time.sleep(30)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for extra in ((), ("--resume",), ("--overwrite",)):
            r = cli("profile", *TINY, "--out", out, *extra)
            assert r.exit_code == 2, r.output
            assert f"is being written by another roofline run (pid {holder.pid}" in r.output
    finally:
        holder.kill()
        holder.wait()
    assert cli("profile", *TINY, "--out", out, "--quiet").exit_code == 0    # the lock went with the process


def test_in_one_process_a_second_writer_is_refused_too(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultWriter(path, mode="new"):
        with pytest.raises(RooflineError, match="being written by another roofline run .pid .*this process"):
            ResultWriter(path, mode="resume")


def test_an_existing_file_is_never_replaced_without_overwrite(tmp_path):
    out = tmp_path / "D"
    assert cli("profile", *TINY, "--out", out, "--quiet").exit_code == 0
    before = (out / "results.jsonl").read_bytes()
    r = cli("profile", *TINY, "--out", out, "--quiet")              # --quiet hid the old warning
    assert r.exit_code == 2 and "already holds results. Add --resume to continue it, or --overwrite" in r.output
    assert (out / "results.jsonl").read_bytes() == before
    r = cli("profile", *TINY, "--out", out, "--resume", "--overwrite")
    assert r.exit_code == 2 and "contradict each other" in r.output


def test_duplicated_points_are_counted_once_with_a_notice(tmp_path):
    src = DATA / "reports_exact.jsonl"
    lines = src.read_text().splitlines()
    path = tmp_path / "twice.jsonl"
    path.write_text("\n".join(lines + lines[1:]) + "\n")      # every point twice: two runs wrote at once
    rf = read_results(path)
    assert len(rf.measurements) == len(lines) - 1
    assert "8 measurement(s)" in rf.notices[0] and "counted once" in rf.notices[0]
    once = {s.key: s for s in analyze(read_results(src)).steps}
    for s in analyze(rf).steps:
        assert s.cost == once[s.key].cost and s.time_s == once[s.key].time_s     # never summed twice
    html = (Path(cli("report", path, "--out", tmp_path / "rep").output.splitlines()[0])).read_text()
    assert "counted once" in html
    assert "counted once" in cli("diagnose", path).output


def test_resume_compares_the_whole_model_not_its_name(tmp_path):
    cfg = {"_name_or_path": "mine", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
    a, b = tmp_path / "a" / "config.json", tmp_path / "b" / "config.json"
    for p, inter in ((a, 176), (b, 192)):
        p.parent.mkdir()
        p.write_text(json.dumps(dict(cfg, intermediate_size=inter)))
    args = ["--phases", "decode", "--batches", "1", "--contexts", "8", "--budget-ms", "1", "--device", "cpu",
            "--no-report", "--out", tmp_path / "D"]
    assert cli("profile", "--model", a, *args, "--quiet").exit_code == 0
    r = cli("profile", "--model", b, *args, "--resume")
    assert r.exit_code == 2 and "it holds model intermediate = 176, this run has 192" in r.output
    r = cli("profile", "--model", a, *args[:-2], "--threads", "1", "--out", tmp_path / "D", "--resume")
    threads = read_results(tmp_path / "D" / "results.jsonl").header.settings["threads"]
    if threads != 1:
        assert r.exit_code == 2 and f"it was measured with threads = {threads}, this run has 1" in r.output


def test_outputs_of_an_older_file_do_not_outlive_it(tmp_path):
    out = tmp_path / "D"
    assert cli("profile", *TINY[:-1], "--out", out, "--quiet").exit_code == 0      # with its report
    assert (out / "report.html").exists() and any((out / "figures").iterdir())
    stale = out / "figures" / "old-run-figure.png"
    stale.write_bytes(b"stale")
    assert cli("profile", *TINY, "--out", out, "--overwrite", "--quiet", "--csv").exit_code == 0
    assert not (out / "report.html").exists() and not (out / "figures").exists()    # --no-report: none is stale
    assert (out / "results.csv").exists()
    # a reused report folder keeps only this report's figures
    rep = tmp_path / "rep"
    (rep / "figures").mkdir(parents=True)
    (rep / "figures" / "compare.png").write_bytes(b"from another report")
    assert cli("report", out / "results.jsonl", "--out", rep).exit_code == 0
    assert not (rep / "figures" / "compare.png").exists()
    assert sorted(p.suffix for p in (rep / "figures").iterdir())[0] == ".png"


# ------------------------------------------------------------------ latency: written as it runs

LAT = ["latency", "--model", "tiny", "--requests", "3", "--prompt-tokens", "24", "--output-tokens", "4", "--rate", "200",
       "--arrival", "fixed", "--sweep-chunks", "8,none"]


def test_ctrl_c_in_latency_keeps_every_finished_request_and_resume_completes_it(tmp_path, monkeypatch):
    import profiler.serving as S

    real = S.serve
    calls = []

    def interrupted(model, specs, **kw):
        calls.append(kw["config"])
        if len(calls) == 2:                       # the second configuration: Ctrl-C after its first request
            done = kw["on_finish"]

            def once(t):
                done(t)
                raise KeyboardInterrupt
            kw["on_finish"] = once
        return real(model, specs, **kw)
    monkeypatch.setattr(S, "serve", interrupted)
    out = tmp_path / "L"
    r = cli(*LAT, "--out", out)
    assert r.exit_code == 130, r.output
    assert "interrupted: 4 requests are kept in" in r.output and "--resume" in r.output
    rf = read_results(out / "latency.jsonl")
    runs = {x.config: x for x in latency_runs(rf)}
    assert runs["chunk=8,prefix-cache=on"].complete and len(runs["chunk=8,prefix-cache=on"].timelines) == 3
    part = runs["chunk=none,prefix-cache=on"]
    assert not part.complete and len(part.timelines) == 1          # written the moment it finished
    assert cli("report", out / "latency.jsonl", "--out", tmp_path / "rep").exit_code == 0
    assert "latency-interrupted" in cli("diagnose", out / "latency.jsonl", "--json").output
    monkeypatch.setattr(S, "serve", real)
    resume = r.output.split("Resume with:")[1].strip().split()
    r = cli(*resume[1:])
    assert r.exit_code == 0, r.output
    assert "already in the file (not run again): chunk=8,prefix-cache=on" in r.output
    runs = latency_runs(read_results(out / "latency.jsonl"))
    assert [(x.config, x.attempt, x.complete, len(x.timelines)) for x in runs] == [
        ("chunk=8,prefix-cache=on", 1, True, 3), ("chunk=none,prefix-cache=on", 2, True, 3)]


def test_latency_checks_its_output_folder_before_building_anything(tmp_path, monkeypatch):
    import kernels.model

    monkeypatch.setattr(kernels.model, "LlamaModel", lambda *a, **k: pytest.fail("built a model"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = cli(*LAT, "--out", blocker / "sub")
    assert r.exit_code == 2 and "cannot be written" in r.output and len(r.output.strip().splitlines()) == 1


def test_latency_json_is_strict_json(tmp_path):
    r = cli(*LAT[:-2], "--output-tokens", "1", "--out", tmp_path / "L", "--json")
    assert r.exit_code == 0, r.output
    assert "NaN" not in r.stdout
    doc = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert doc["summaries"][0]["tpot"]["p50"] is None            # undefined for one token: null
    for line in (tmp_path / "L" / "latency.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c} in the file"))


# ------------------------------------------------------------------ inputs

@pytest.mark.parametrize("args, message", [
    (["--batches", "100000000000"], "needs about"),
    (["--threads", "99999"], "must be between 1 and this machine's"),
    (["--budget-ms", "nan"], "must be a number of milliseconds from 1 to 60000"),
    (["--budget-ms", "inf"], "must be a number of milliseconds from 1 to 60000"),
    (["--budget-ms", "0.5"], "must be a number of milliseconds from 1 to 60000"),
])
def test_sizes_that_cannot_run_are_refused_before_anything_runs(tmp_path, monkeypatch, args, message):
    monkeypatch.setattr(K, "validate_kernels", lambda *a, **k: pytest.fail("validated kernels"))
    r = cli("profile", *TINY, *args, "--out", tmp_path / "D")
    assert r.exit_code == 2 and message in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "D" / "results.jsonl").exists()


def test_duplicate_values_run_once_and_say_so(tmp_path):
    r = cli("profile", *TINY[:5], "1,2,1", "--contexts", "8,8", *TINY[8:], "--out", tmp_path / "D", "--quiet")
    assert r.exit_code == 0, r.output
    assert "--batches lists 1 more than once; each value runs once" in r.output
    assert "--contexts lists 8 more than once" in r.output
    assert len(read_results(tmp_path / "D" / "results.jsonl").measurements) == 2 * 19


def _edit(src: Path, dst: Path, line: int, fn) -> Path:
    lines = src.read_text().splitlines()
    d = json.loads(lines[line])
    fn(d)
    lines[line] = json.dumps(d)
    dst.write_text("\n".join(lines) + "\n")
    return dst


def _set(path, value):
    def fn(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return fn


@pytest.mark.parametrize("src, line, change, message", [
    ("reports_exact.jsonl", 2, _set(["times_s"], [1e-3, float("nan"), 1e-3]), "line 3: a malformed measurement line: "
     "time sample 1 is nan"),
    ("reports_exact.jsonl", 2, _set(["times_s"], [1e-3, -1e-3]), "line 3: a malformed measurement line: time sample 1"),
    ("reports_exact.jsonl", 2, _set(["times_s"], [0.0]), "every time must be a positive, finite number of seconds"),
    ("reports_exact.jsonl", 2, _set(["point", "batch"], "one"), "line 3: a malformed measurement line: point 'batch'"),
    ("reports_exact.jsonl", 0, _set(["settings"], "fast"), "line 1: malformed header: header 'settings' must be an "
     "object"),
    ("reports_exact.jsonl", 0, _set(["device", "bandwidth"], -1.0), "line 1: malformed header"),
    ("latency_sweep_cpu.jsonl", 1, _set(["deliveries"], "soon"), "line 2: a malformed request line: request "
     "'deliveries' must be a list"),
    ("latency_sweep_cpu.jsonl", 1, _set(["id"], None), "line 2: a malformed request line"),
])
def test_bad_result_files_are_refused_alike_by_report_and_diagnose(tmp_path, src, line, change, message):
    bad = _edit(DATA / src, tmp_path / "bad.jsonl", line, change)
    for args in (("report", bad, "--out", tmp_path / "rep"), ("diagnose", bad)):
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_profile_file_without_bandwidth_cannot_be_classified_and_says_so(tmp_path):
    bad = _edit(DATA / "reports_exact.jsonl", tmp_path / "nobw.jsonl", 0, _set(["device", "bandwidth"], 0.0))
    r = cli("report", bad, "--out", tmp_path / "rep")
    assert r.exit_code == 2 and "has no memory bandwidth (0.0 B/s)" in r.output and "roofline ceilings" in r.output
    r = cli("diagnose", bad)
    assert r.exit_code == 0 and "Cannot say what bounds each phase" in r.output


def test_report_html_taken_by_a_folder_is_a_clear_error(tmp_path):
    (tmp_path / "rep" / "report.html").mkdir(parents=True)
    r = cli("report", DATA / "reports_exact.jsonl", "--out", tmp_path / "rep")
    assert r.exit_code == 2 and "report.html is a folder" in r.output


def test_nan_is_written_as_null_and_read_back_as_undefined(tmp_path):
    from roofline.latency import RequestTimeline, timeline_from_stages
    from roofline.records import RunHeader
    from roofline.devices import cpu_device

    t = timeline_from_stages(queue=0.02, prefill=0.08, first_delivery=0.005)   # one token: TPOT undefined
    path = tmp_path / "l.jsonl"
    with ResultWriter(path, RunHeader(device=cpu_device(), kind="latency"), mode="new") as w:
        w.write(t.to_dict())
    raw = path.read_text()
    assert "NaN" not in raw and "null" in raw
    back = read_results(path).requests[0]
    assert isinstance(back, RequestTimeline) and math.isnan(back.tokenize[0]) is False and math.isnan(back.tpot)
    assert os.path.getsize(path) == len(raw)
