"""Issue 33, "Judgments that refuse what they cannot judge": ``diagnose`` and ``compare`` follow one rule
(``roofline.verdicts.same_setup``): inputs of different models or devices are refused in one line, or judged
only with --across-models and then said first; ``compare`` lists every recorded setting that differs."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline.devices import find_device
from roofline.errors import RooflineError
from roofline.models import load_model
from roofline.records import read_results
from roofline.verdicts.change_rules import summary
from roofline.verdicts.comparison import compare
from roofline.verdicts.diagnosis import diagnose
from roofline.verdicts.same_setup import ACROSS_FLAG, Setup, check_same_setup

DATA = Path(__file__).parent / "data"
H100 = DATA / "reports_h100.jsonl"            # llama-3-8b on an H100
LAT = DATA / "latency_sweep_cpu.jsonl"        # small on a CPU ("x86_64")


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(r, *words):
    assert r.exit_code != 0, r.output
    msg = r.output.strip().splitlines()
    assert len([ln for ln in msg if ln.strip()]) == 1, r.output
    for w in words:
        assert w in msg[0], (w, msg[0])


def test_one_rule_refuses_different_models_and_devices_and_ignores_what_is_unknown():
    with pytest.raises(RooflineError, match="different models: a.jsonl tiny, b.jsonl small") as e:
        check_same_setup([Setup("a.jsonl", "tiny", "cpu"), Setup("b.jsonl", "small", "cpu")])
    assert ACROSS_FLAG in str(e.value) and "\n" not in str(e.value)
    assert check_same_setup([Setup("a", "tiny", ""), Setup("b", "", "NVIDIA H100")]) == []   # unknown: no difference
    (note,) = check_same_setup([Setup("a", "tiny", "x"), Setup("b", "tiny", "y")], across_models=True)
    assert note.startswith("Across models or devices, as asked (--across-models): different devices")


def test_diagnose_refuses_a_profile_and_a_latency_file_of_other_models_and_devices():
    with pytest.raises(RooflineError, match="different models: .*llama-3-8b.*small"):
        diagnose([read_results(H100), read_results(LAT)])
    found = diagnose([read_results(H100), read_results(LAT)], across_models=True)
    assert found[0].rule == "across-models" and "different models" in found[0].claim
    assert "different devices" in found[0].claim


def test_diagnose_refuses_a_floor_on_another_model_or_device():
    with pytest.raises(RooflineError, match="different models: .* small, --model llama-3-8b; different devices: "
                                            ".* x86_64, --device NVIDIA H100 SXM5 80GB: these cannot be diagnosed"):
        diagnose([read_results(LAT)], model=load_model("llama-3-8b"), device=find_device("h100"))
    with pytest.raises(RooflineError, match="different devices: .*x86_64, --device NVIDIA H100"):
        diagnose([read_results(LAT)], device=find_device("h100"))


def test_the_diagnose_command_says_it_in_one_line_or_on_top(tmp_path):
    one_line_error(cli("diagnose", H100, LAT), "different models", ACROSS_FLAG)
    one_line_error(cli("diagnose", LAT, "--model", "llama-3-8b", "--device", "h100"), "different", ACROSS_FLAG)
    r = cli("diagnose", H100, LAT, "--across-models")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("- Across models or devices, as asked (--across-models)")


def test_the_compare_command_follows_the_same_rule(tmp_path):
    other = tmp_path / "other.jsonl"
    lines = H100.read_text().splitlines()
    head = json.loads(lines[0])
    head["model"] = dict(head["model"], name="llama-3-70b")
    other.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    one_line_error(cli("compare", H100, other, "--out", tmp_path / "c"), "different models", ACROSS_FLAG)
    r = cli("compare", H100, other, "--out", tmp_path / "c", "--across-models")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("note: Across models or devices, as asked (--across-models): different models")


def with_settings(src: Path, dst: Path, **settings) -> Path:
    lines = src.read_text().splitlines()
    head = json.loads(lines[0])
    head["settings"] = dict(head["settings"], **settings)
    dst.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return dst


def test_compare_lists_every_recorded_setting_that_differs(tmp_path):
    after = with_settings(LAT, tmp_path / "after.jsonl", threads=1, requests=4, output_tokens=16, shared_prefix=0)
    c = compare(read_results(LAT), read_results(after))
    assert c.settings == {"output_tokens": (8, 16), "requests": (6, 4), "shared_prefix": (96, 0), "threads": (2, 1)}
    claim = summary(c).claim
    for said in ("threads 2 -> 1", "requests 6 -> 4", "output_tokens 8 -> 16", "shared_prefix 96 -> 0"):
        assert said in claim, claim
    assert "no configuration field" not in claim and "no recorded setting" not in claim
    r = cli("compare", LAT, after, "--out", tmp_path / "c")
    assert r.exit_code == 0 and "threads 2 -> 1" in r.output, r.output
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["settings_changed"]["threads"] == [2, 1]


def test_a_setting_that_restates_the_change_under_test_is_not_listed_twice(tmp_path):
    c = compare(read_results(H100), read_results(DATA / "reports_h100_w8.jsonl"))
    assert "weight_dtype" in c.changed
    assert not any(k in c.settings for k in ("weight_dtypes",)) and c.change_text.startswith("weights ")


def test_the_same_sweep_still_says_nothing_changed(tmp_path):
    c = compare(read_results(LAT), read_results(with_settings(LAT, tmp_path / "same.jsonl")))
    assert c.settings == {} and "no recorded setting" in summary(c).claim


# ---------------------------------------------------------------- the first run on a busy box

def _spec(tmp_path, *args):
    from profiler.commands.profile import profile
    from profiler.run_spec import spec_from_options
    base = ["--model", "tiny", "--phases", "decode", "--batches", "1", "--contexts", "8", "--backends", "torch",
            "--dtype", "fp32", "--device", "cpu", "--out", str(tmp_path / "o")]
    return spec_from_options(profile.make_context("profile", [*base, *args]).params, "new")


def test_profile_keeps_a_core_free_by_default_as_latency_does(tmp_path, monkeypatch):
    import profiler.run as run_mod
    from profiler.profile_run import profile_threads, threads_line
    from profiler.run import cpu_threads_default
    monkeypatch.setattr(run_mod.os, "cpu_count", lambda: 8)
    spec = _spec(tmp_path)
    assert spec.threads is None
    assert profile_threads(spec) == cpu_threads_default("cpu", None) == 7     # latency and serve's default
    assert profile_threads(_spec(tmp_path, "--threads", "1")) == 1
    line = threads_line(spec, 7)
    assert line.startswith("CPU: 7 torch thread(s), one fewer than the 8 cores") and "--threads" in line


def test_the_ceilings_command_measures_with_profiles_threads(monkeypatch):
    import torch
    import profiler.commands.measure as M
    import profiler.run as run_mod
    monkeypatch.setattr(run_mod.os, "cpu_count", lambda: 3)
    seen = []

    class Stop(Exception):
        pass

    def fake(device, **kw):
        seen.append(torch.get_num_threads())
        raise Stop
    monkeypatch.setattr(M, "get_ceilings", fake)
    r = CliRunner().invoke(main, ["ceilings", "--device", "cpu"])
    assert isinstance(r.exception, Stop) and seen == [2]


def test_the_roofline_says_which_ceilings_judged_the_run():
    from dataclasses import replace
    from reports.roofline_plot import ceilings_said
    h = read_results(H100).header
    assert h.device.source == "measured"
    quiet = replace(h, ceilings={"cached": True, "flags": [], "cache_key": {"threads": 1}})
    busy = replace(h, ceilings={"flags": ["host-busy"], "cache_key": {"threads": 2}})
    assert ceilings_said(quiet) == " (cached, quiet, 1 thread)"
    assert ceilings_said(busy) == " (measured with the run, on a busy host, 2 threads)"
    fig_rf = read_results(H100)
    fig_rf.header = quiet
    from reports.roofline_plot import plot_roofline
    from reports.style import new_figure
    _, ax = new_figure(10, 6.4)
    plot_roofline(ax, fig_rf)
    assert "measured ceilings (cached, quiet, 1 thread)" in [t.get_text() for t in ax.get_legend().get_texts()]
