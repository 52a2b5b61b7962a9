"""Issue 33, hostile input: absurd custom devices, expert-load files past a float, UTF-16 and contradictory
counter exports: one line each, naming the file (or option) and what is wrong."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline.counters import read_counters
from roofline.devices import custom_device, load_device_file
from roofline.errors import RooflineError

from cli_errors import one_line_error

NCU = Path(__file__).parent / "data" / "ncu"


def test_absurd_custom_device_is_refused_with_the_range():
    res = CliRunner().invoke(main, ["explain", "--model", "tiny", "--context", "10", "--peak-tflops", "1e300",
                                    "--bandwidth-gbs", "1e300"])
    one_line_error(res, "--peak-tflops must be between 1e-06 and 1e+09 dense TFLOP/s", "1e+300 was given")
    assert "nan" not in res.output
    with pytest.raises(RooflineError, match=r"--bandwidth-gbs must be between 1e-06 and 1e\+09 GB/s"):
        custom_device(989, 1e300)
    assert custom_device(989, 3350).ridge("bf16") == pytest.approx(989e12 / 3350e9)


def test_absurd_device_file_names_the_key(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"name": "x", "peak_tflops": {"bf16": 1e300}, "bandwidth_gbs": 3350}))
    with pytest.raises(RooflineError, match=r"peak_tflops bf16 must be between 1e-06 and 1e\+09.*1e\+300"):
        load_device_file(p)
    p.write_text(json.dumps({"name": "x", "peak_tflops": {"bf16": 989}, "bandwidth_gbs": 1e300}))
    with pytest.raises(RooflineError, match=r"bandwidth_gbs must be between 1e-06 and 1e\+09 GB/s, but 1e\+300"):
        load_device_file(p)


def explain_load(tmp_path, text):
    p = tmp_path / "load.json"
    p.write_text(text)
    return p, CliRunner().invoke(main, ["explain", "--model", "mixtral-8x7b", "--device", "h100", "--context", "16",
                                        "--expert-load", str(p)])


@pytest.mark.parametrize("first, shown", [
    ("1" + "0" * 400, "holds 1000000000"),
    ("Infinity", "holds Infinity"),
    ("1e308", "holds 1e+308"),
    ("NaN", "holds NaN"),
])
def test_expert_load_counts_past_a_token_count_are_one_line(tmp_path, first, shown):
    p, res = explain_load(tmp_path, f"[{first}, 1, 1, 1, 1, 1, 1, 1]")
    line = one_line_error(res, f"expert load {p}: expert 0 {shown}", "not a token count", "from 0 to 1e+15")
    assert "nan" not in line.replace("NaN", "") and "OverflowError" not in res.output


def test_expert_load_integer_past_pythons_digit_limit(tmp_path):
    p, res = explain_load(tmp_path, "[1" + "0" * 5000 + ", 1, 1, 1, 1, 1, 1, 1]")
    one_line_error(res, f"expert load {p} holds an integer of more than 4,300 digits")


def test_expert_load_names_the_layer(tmp_path):
    p, res = explain_load(tmp_path, "[[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1e308]]")
    one_line_error(res, f"expert load {p}: layer 1, expert 7 holds 1e+308")


@pytest.mark.parametrize("codec, name", [("utf-16", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_export_is_read_and_said(tmp_path, codec, name):
    p = tmp_path / "k.csv"
    p.write_bytes((NCU / "h100_long.csv").read_text().encode(codec))       # Python writes the BOM
    cf = read_counters(p)
    assert len(cf.launches) == len(read_counters(NCU / "h100_long.csv").launches) == 4
    assert any(f"read as {name}" in n for n in cf.notices), cf.notices


def test_utf16_without_a_mark_is_named(tmp_path):
    p = tmp_path / "k.csv"
    p.write_bytes((NCU / "h100_long.csv").read_text().encode("utf-16-le"))
    with pytest.raises(RooflineError, match=f"counters file {p} looks like UTF-16-LE text without a byte-order mark"):
        read_counters(p)


def test_a_metric_given_twice_with_two_values_is_refused(tmp_path):
    lines = (NCU / "h100_long.csv").read_text().splitlines()
    row = next(ln for ln in lines if '"gpu__time_duration.sum","usecond","14.30"' in ln)
    p = tmp_path / "twice.csv"
    p.write_text("\n".join(lines + [row.replace('"14.30"', '"99.00"')]) + "\n")
    res = CliRunner().invoke(main, ["counters", str(p)])
    one_line_error(res, str(p), "gpu__time_duration.sum of launch 0 (_linear_kernel) is given twice")
    same = tmp_path / "same.csv"      # the same row twice says the same thing: taken
    same.write_text("\n".join(lines + [row]) + "\n")
    assert len(read_counters(same).launches) == 4


def test_a_raw_page_launch_given_twice_with_two_values_is_refused(tmp_path):
    lines = (NCU / "h100_raw.csv").read_text().splitlines()
    data = [ln for ln in lines if ln.startswith('"0"')]
    assert data
    head = next(ln for ln in lines if ln.startswith('"ID"')).split('","')
    cells = data[0].split('","')
    i = next(k for k, h in enumerate(head) if h.startswith("gpu__time_duration.sum"))
    cells[i] = "99.00"
    p = tmp_path / "twice_raw.csv"
    p.write_text("\n".join(lines + ['","'.join(cells)]) + "\n")
    with pytest.raises(RooflineError, match="gpu__time_duration.sum of launch 0 .* is given twice"):
        read_counters(p)
