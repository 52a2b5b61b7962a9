"""The written report: files, self-contained HTML, escaping, side by side, the CLI, bad input,
and (when chromium is installed) the page opened in a headless browser."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from reports import write_report

DATA = Path(__file__).parent / "data"
H100, A100 = DATA / "reports_h100.jsonl", DATA / "reports_a100.jsonl"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return write_report([H100], out)


def _rewrite_header(src: Path, dst: Path, keep: int = 60, **changes) -> Path:
    """A copy of ``src`` with header fields changed and only its first ``keep`` records (fast to render)."""
    lines = src.read_text().splitlines()[:keep + 1]
    head = json.loads(lines[0])
    for k, v in changes.items():
        if k == "model_name":
            head["model"]["name"] = v
        else:
            head[k] = v
    dst.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return dst


def test_writes_html_markdown_png_and_svg(report):
    assert report["html"].name == "report.html" and report["markdown"].name == "report.md"
    for key in ("roofline", "time_prefill", "time_decode", "sweep", "predicted"):
        png, svg = report[f"png:{key}"], report[f"svg:{key}"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert b"<svg" in svg.read_bytes()[:2000]


def test_html_is_self_contained_with_verdicts_table_metadata_conventions(report):
    html = report["html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)   # nothing from the network
    assert "<link" not in html and "@import" not in html and "url(http" not in html
    assert html.count("data:image/svg+xml;base64,") == 5
    assert ("Decode at batch 1, context 128 is memory-bound: 67% of the 3 TB/s measured bandwidth roof" in html)
    assert "800 TFLOP/s (measured)" in html and "989 TFLOP/s" in html               # measured vs datasheet
    assert html.count("<tr data-phase=") == 327                                        # every point, skipped too
    assert "skipped: out of memory" in html and "above-roof" in html
    assert "sm_clock_mhz=1980" in html and "torch 2.4.1+cu124" in html                # metadata
    assert "roofline profile --model llama-3-8b" in html
    assert "A multiply-add is 2 FLOPs" in html                                        # from formulas.py


def test_markdown_summary(report):
    md = report["markdown"].read_text()
    assert md.startswith("# Roofline report")
    assert "- **memory**: Decode at batch 1, context 128 is memory-bound" in md
    assert "![Roofline](figures/roofline.png)" in md
    assert "A multiply-add is 2 FLOPs" in md


def test_text_from_files_and_command_lines_is_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    src = _rewrite_header(H100, tmp_path / "evil<b>.jsonl", keep=20, model_name=evil, command=f"roofline profile {evil}")
    paths = write_report([src], tmp_path / "out")
    html = paths["html"].read_text()
    assert evil not in html and "evil<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "evil&lt;b&gt;.jsonl" in html
    assert html.count("<script>") == 1                                                 # ours only
    assert evil not in paths["markdown"].read_text()


def test_a_file_with_kernels_and_requests_gets_both_sections(tmp_path):
    src = _rewrite_header(H100, tmp_path / "lat.jsonl", keep=20, kind="latency")
    latency = (DATA / "latency_sweep_cpu.jsonl").read_text().splitlines()[1:]
    first = [ln for ln in latency if '"type":"request"' in ln.replace(" ", "") and "chunk=16,prefix-cache=off" in ln]
    with open(src, "a") as f:
        f.write("\n".join(first) + "\n")       # the first configuration's 6 requests, without its summary line
    paths = write_report([src], tmp_path / "with")
    html = paths["html"].read_text()
    assert "png:latency_1" in paths and "png:roofline" in paths
    # its summary line is missing: the report says the configuration was cut short, from 8 requests
    assert "chunk=16,prefix-cache=off was interrupted: 6 request(s) finished before it stopped" in html


def test_cli_reports_runs_side_by_side_and_says_models_differ(tmp_path):
    h100 = _rewrite_header(H100, tmp_path / "h100.jsonl")
    a100 = _rewrite_header(A100, tmp_path / "a100.jsonl", model_name="llama-2-7b")
    r = CliRunner().invoke(main, ["report", str(h100), str(a100), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()   # the paths written, html and markdown first
    assert lines[0] == str(tmp_path / "rep" / "report.html") and lines[1] == str(tmp_path / "rep" / "report.md")
    assert all(Path(p).exists() for p in lines)
    names = {Path(p).name for p in lines}
    assert {"compare.png", "1-h100-sxm-roofline.png", "2-a100-sxm-80gb-roofline.png"} <= names
    html = Path(lines[0]).read_text()
    assert "Runs side by side" in html and "NVIDIA A100 SXM 80GB" in html and "NVIDIA H100 SXM5 80GB" in html
    assert "different models (llama-2-7b, llama-3-8b)" in html
    assert "different models" in Path(lines[1]).read_text()


@pytest.mark.parametrize("content, expect", [
    (None, "does not exist"),
    ("", "is empty"),
    ("HEADER\n{\"type\": \"measurement\", \"point\": \n{}\n", "line 2: not valid JSON"),
    ("OLD", "format version 0 is older"),
])
def test_cli_bad_input_is_one_line_naming_the_file(tmp_path, content, expect):
    f = tmp_path / "results.jsonl"
    head = json.loads(H100.read_text().splitlines()[0])
    if content is not None:
        content = content.replace("HEADER", json.dumps(head))
        if content == "OLD":
            content = json.dumps({**head, "version": 0}) + "\n"
        f.write_text(content)
    out = tmp_path / "rep"
    r = CliRunner().invoke(main, ["report", str(f), "--out", str(out)])
    assert r.exit_code == 2 and r.stdout == ""
    msg = r.stderr.strip()
    assert len(msg.splitlines()) == 1 and "Traceback" not in r.output
    assert str(f) in msg and expect in msg
    assert not (out / "report.html").exists()


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless chromium (/usr/bin/chromium)")
def test_report_opens_in_headless_chromium(report, tmp_path):
    import matplotlib.image

    url = report["html"].resolve().as_uri()
    base = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--enable-logging=stderr", "--v=0"]
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(base + [f"--user-data-dir={profile}", "--dump-dom", url], capture_output=True,
                             text=True, timeout=60)
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    assert console == [], console                               # no console errors (or logs at all)
    assert "327 of 327 points" in dom.stdout                    # the inline script ran
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(base + [f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1400,3000",
                               url], capture_output=True, timeout=60)
    img = matplotlib.image.imread(shot)
    assert img.shape[:2] == (3000, 1400)
    assert img[..., :3].std() > 0.05                            # not blank


def test_interpreter_runs_are_named_in_the_report(tmp_path):
    from dataclasses import replace

    from roofline.records import read_results
    from roofline.writer import ResultWriter

    rf = read_results(Path(__file__).parent / "data" / "reports_exact.jsonl")
    src = tmp_path / "interp.jsonl"
    with ResultWriter(src, rf.header) as w:
        for m in rf.measurements:
            w.write(replace(m, flags=tuple(m.flags) + ("triton-interpreter",)))
    html = write_report([src], tmp_path / "out")["html"].read_text()
    assert f"{len(rf.measurements)} triton point(s) ran in the Triton interpreter" in html


def test_a_latency_only_file_gets_timelines_not_an_empty_roofline(tmp_path):
    paths = write_report([Path(__file__).parent / "data" / "latency_sweep_cpu.jsonl"], tmp_path / "lat")
    html = paths["html"].read_text()
    assert "<h3>Latency run</h3>" in html and "Device and ceilings" not in html
    assert "nothing to classify" not in html and "unmeasured ceilings" not in html
    assert "| ceiling |" not in paths["markdown"].read_text()
