"""Issue 22: a latency run removes only what was derived from its own file (a profile's report stays)."""

import json
from pathlib import Path

from profiler.run import REPORT_FILES, remove_derived
from reports import SOURCES_FILE, write_report

DATA = Path(__file__).parent / "data"


def _profile_report(out: Path, source: Path) -> None:
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "roofline.png").write_bytes(b"png")
    (out / "report.html").write_text("<html>")
    (out / "report.md").write_text("# Roofline report")
    (out / SOURCES_FILE).write_text(json.dumps([str(source.resolve())]))


def test_a_latency_run_keeps_the_report_a_profile_wrote_there(tmp_path):
    _profile_report(tmp_path, tmp_path / "results.jsonl")
    remove_derived(tmp_path, REPORT_FILES, source=tmp_path / "latency.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == [SOURCES_FILE, "figures", "report.html", "report.md"]
    assert (tmp_path / "figures" / "roofline.png").read_bytes() == b"png"


def test_a_report_made_from_the_rewritten_file_is_removed(tmp_path):
    _profile_report(tmp_path, tmp_path / "latency.jsonl")
    remove_derived(tmp_path, REPORT_FILES, source=tmp_path / "latency.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_a_report_without_a_record_of_its_sources_is_kept_by_a_latency_run(tmp_path):
    _profile_report(tmp_path, tmp_path / "results.jsonl")
    (tmp_path / SOURCES_FILE).unlink()
    remove_derived(tmp_path, REPORT_FILES, source=tmp_path / "latency.jsonl")
    assert (tmp_path / "report.html").exists() and (tmp_path / "figures").is_dir()


def test_a_profile_still_removes_its_stale_outputs(tmp_path):
    _profile_report(tmp_path, tmp_path / "results.jsonl")
    (tmp_path / "results.csv").write_text("op\n")
    remove_derived(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_write_report_records_its_sources(tmp_path):
    src = DATA / "latency_sweep_cpu.jsonl"
    write_report([src], tmp_path / "r")
    assert json.loads((tmp_path / "r" / SOURCES_FILE).read_text()) == [str(src.resolve())]


def test_roofline_latency_into_a_profile_folder_keeps_its_report(tmp_path):
    from click.testing import CliRunner

    from profiler.cli import main

    _profile_report(tmp_path, tmp_path / "results.jsonl")
    r = CliRunner().invoke(main, ["latency", "--model", "tiny", "--requests", "1", "--prompt-tokens", "8",
                                  "--output-tokens", "2", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "latency.jsonl").exists() and (tmp_path / "report.html").read_text() == "<html>"
    assert (tmp_path / "figures" / "roofline.png").exists()
