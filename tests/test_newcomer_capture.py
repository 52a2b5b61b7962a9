"""Issue 33: `roofline trace --capture` given a trace, a missing script, or a script that exits with a message."""

import gzip
import re
from pathlib import Path

from click.testing import CliRunner

from profiler.capture import run_script, script_problem
from profiler.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def run(*args):
    return CliRunner().invoke(main, ["trace", *map(str, args)])


def test_readme_gives_capture_traces_with_capture_trace():
    text = README.read_text()
    # `--capture` takes no value: it runs `-- python SCRIPT.py`; a capture trace is `--capture-trace FILE`
    wrong = re.findall(r"--capture (?!--)\S+", text)
    assert not wrong, wrong
    assert "--capture-trace CAPTURE.json" in text


def test_the_readme_wrong_form_names_the_trace_and_what_capture_expects(tmp_path):
    trace = tmp_path / "trace.json.gz"
    with gzip.open(trace, "wb") as f:
        f.write(b'{"traceEvents": []}')
    cap = tmp_path / "CAPTURE.json"
    cap.write_text('{"traceEvents": []}')
    res = run(trace, "--capture", cap, "--out", tmp_path / "o")
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert f"{trace} is not a Python script" in lines[0] and "--capture-trace FILE" in lines[0], lines[0]
    assert "null bytes" not in res.output and not (tmp_path / "o").exists()


def test_a_binary_or_json_target_is_not_a_script(tmp_path):
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"\x00\x01\x02binary")
    js = tmp_path / "t.json"
    js.write_text("{}")
    assert "is not a Python script" in script_problem(blob)
    assert "is not a Python script" in script_problem(js)
    ok = tmp_path / "ok.py"
    ok.write_text("print(1)\n")
    assert script_problem(ok) is None


def test_a_missing_script_is_reported_missing(tmp_path):
    res = run("--capture", "--out", tmp_path / "o", "--", "python", tmp_path / "nope.py")
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / 'nope.py'} does not exist" in res.output, res.output
    assert "not a Python script" not in res.output


def test_a_scripts_own_exit_message_is_shown(tmp_path, capsys):
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit('boom')\n")
    status = run_script(tmp_path / "t.json", [str(script)])
    assert status == 1
    assert "boom" in capsys.readouterr().err


def test_the_trace_command_names_the_scripts_exit_message(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit('boom')\n")
    res = run("--capture", "--out", tmp_path / "o", "--", "python", script)
    assert res.exit_code == 2, res.output
    assert "exited with status 1 (it said: boom)" in res.output, res.output
