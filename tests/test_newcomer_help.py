"""Issue 33: help and tables a newcomer reads: whole summaries, units in headers, dtype lists that hold."""

import re

from click.testing import CliRunner

from profiler.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_top_level_summaries_are_whole():
    res = run("--help")
    assert res.exit_code == 0, res.output
    rows = res.output.split("Commands:")[1].strip().splitlines()
    assert len(rows) == 13, rows
    for row in rows:
        assert not row.rstrip().endswith("..."), row
        assert len(row) <= 78, row


def test_devices_headers_carry_units_and_rates_say_per_second():
    res = run("devices")
    assert res.exit_code == 0, res.output
    head = "\n".join(res.output.splitlines()[:2])
    assert "TFLOP/s" in head and "TB/s" in head and "FLOP/B" in head, head
    h100 = next(ln for ln in res.output.splitlines() if ln.startswith("h100-sxm "))
    figures = h100[42:]      # past the key and the name (which says "80GB")
    assert re.search(r"\b3\.35\b", figures) and not re.search(r"TB|GB|MB", figures), h100


def test_latency_help_lists_only_the_dtypes_it_runs():
    res = run("latency", "--help")
    text = " ".join(res.output.split())
    dtype_help = text.split("--dtype TEXT")[1].split("[default")[0]
    assert "fp32, bf16, fp16" in dtype_help and not re.search(r"fp8|int8|int4|tf32", dtype_help), dtype_help
    bad = run("latency", "--dtype", "fp8")
    assert bad.exit_code == 2 and "--dtype takes fp32, bf16, fp16 (fp8 is costed" in bad.output, bad.output


def test_explain_act_dtype_prints_one_list():
    text = " ".join(run("explain", "--help").output.split())
    act = text.split("--act-dtype TEXT")[1].split("[default")[0]
    assert act.count("(") == 1 and "fp32, bf16, fp16" in act and "int4" not in act, act
    bad = run("explain", "--act-dtype", "int8")
    assert bad.exit_code == 2 and "--act-dtype takes fp32, bf16, fp16 (int8 quantizes weights" in bad.output


def test_explain_linear_says_what_weight_only_means():
    res = run("explain", "linear", "--tokens", "16", "--in", "64", "--out", "64", "--device", "h100")
    assert res.exit_code == 0, res.output
    assert "seed" not in res.output and "weight-only counts the weight bytes alone" in res.output
