"""Issue 33, commands: a model typo gets a "did you mean" as a device typo does; profile's and serve's --dtype list
(and take) only the dtypes they run; the compile check's progress says how many variants, about how long, that a
first run compiles for minutes, and the time left at the rate so far (a fake clock: no timing)."""

import pytest
from click.testing import CliRunner

from cli_errors import one_line_error
from profiler.cli import main
from roofline.errors import RooflineError, did_you_mean
from roofline.models import load_model


@pytest.mark.parametrize("typo, first", [("llama3-8b", "llama-3-8b"), ("Llama-3-8B ", None),
                                         ("gemma2-9b", "gemma-2-9b"), ("gpt-oss", "gpt-oss-20b"), ("qwen3", "qwen3-8b")])
def test_a_model_typo_gets_did_you_mean(typo, first):
    if first is None:                                 # case and spaces aside, a preset is itself
        assert load_model(typo).name == "llama-3-8b"
        return
    with pytest.raises(RooflineError, match=rf"Unknown model '{typo}' \(did you mean {first}( or [^)]*)?\?\)"):
        load_model(typo)


@pytest.mark.parametrize("command", ["explain", "profile", "latency", "check"])
def test_the_cli_says_did_you_mean_for_a_model(command):
    res = CliRunner().invoke(main, [command, "--model", "llama3-8b"])
    one_line_error(res, "Unknown model 'llama3-8b' (did you mean llama-3-8b")


def test_nothing_close_says_nothing_and_devices_keep_theirs():
    with pytest.raises(RooflineError) as e:
        load_model("zzzz")
    assert "did you mean" not in str(e.value)
    assert did_you_mean("h10", {"h100": "h100-sxm", "h20": "h20"}) == " (did you mean h100-sxm or h20?)"
    res = CliRunner().invoke(main, ["explain", "--model", "tiny", "--device", "h10"])
    assert "Unknown device 'h10' (did you mean h100-sxm" in res.output


@pytest.mark.parametrize("command", ["profile", "serve"])
def test_dtype_lists_only_what_the_command_runs(command):
    help_text = CliRunner().invoke(main, [command, "--help"]).output
    line = " ".join(help_text.split("--dtype", 1)[1].split("--device", 1)[0].split())
    assert "(fp32, bf16, fp16)" in line and "int8" not in line and "fp8" not in line and "tf32" not in line, line
    one_line_error(CliRunner().invoke(main, [command, "--dtype", "int8", "--model", "tiny"]),
                   "--dtype takes fp32, bf16, fp16 (int8 is costed by `roofline explain`", "--weight-dtype")
    line = one_line_error(CliRunner().invoke(main, [command, "--dtype", "xx", "--model", "tiny"]),
                          "--dtype takes fp32, bf16, fp16, but 'xx' was given")
    assert "int4" not in line


def test_compile_progress_says_the_estimate_the_first_run_and_the_time_left():
    from kernels.compile_check import COLD_S_PER_VARIANT, CompileProgress

    said, t = [], iter([100.0, 130.0, 160.0, 250.0, 400.0])
    p = CompileProgress(40, 0, 2, said.append, clock=lambda: next(t), every=10)
    p.begin()
    steps = [p.step(i) for i in range(1, 41)]
    assert steps.count(True) == 4 and steps[9] and steps[39]
    assert said[0] == (f"compiling 40 variants (0 cached) in 2 processes: about {40 * COLD_S_PER_VARIANT / 2:.0f} s "
                       "-- a first run compiles every variant, for minutes; later runs read the cache")
    assert said[1:] == ["  10/40 compiled in 30 s, about 2 min left", "  20/40 compiled in 60 s, about 60 s left",
                        "  30/40 compiled in 2 min, about 50 s left", "  40/40 compiled in 5 min"]
    warm = []
    CompileProgress(1200, 16, 1, warm.append, clock=lambda: 0.0).begin()
    assert warm == ["compiling 1200 variants (16 cached) in 1 process: about 56 min"]
