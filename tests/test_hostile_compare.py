"""``roofline compare`` says a torn last line in either file, as every other reader does (issue 23)."""

from pathlib import Path

from click.testing import CliRunner

from profiler.cli import main
from roofline.verdicts.comparison import compare
from roofline.records import read_results

H100 = Path(__file__).parent / "data" / "reports_h100.jsonl"


def test_a_torn_last_line_in_after_is_said(tmp_path):
    after = tmp_path / "after.jsonl"
    text = H100.read_text()
    after.write_text(text + text.splitlines()[-1][:40])            # a run killed mid-write: 40 bytes, no newline
    c = compare(read_results(H100), read_results(after))
    torn = [n for n in c.notes if n.startswith("AFTER: the last line of ")]
    assert len(torn) == 1 and "was cut off (40 bytes" in torn[0], c.notes
    assert not any(n.startswith("BEFORE:") for n in c.notes)
    r = CliRunner().invoke(main, ["compare", str(H100), str(after), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    assert "AFTER: the last line of " in r.output and "was cut off (40 bytes" in r.output
