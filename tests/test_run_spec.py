"""profiler.run_spec: one run description, serialised once (the header's settings, the resume command), the
resume check on --tp / --ep (a header without them reads as 1), and the sweep's memory estimate = capacity's."""

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from profiler.commands.profile import profile
from profiler.run import entry_point
from profiler.run_spec import RunSpec, spec_from_options
from roofline.devices import cpu_device
from roofline.models import load_model
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

BASE = ["--model", "tiny", "--phases", "decode", "--batches", "1,2", "--contexts", "8", "--backends", "torch",
        "--dtype", "fp32", "--device", "cpu", "--budget-ms", "2", "--threads", "1"]
VARIANTS = [[], ["--quick", "--flush-cache"], ["--weight-dtype", "fp32,int4", "--group-size", "32", "--zero-point",
                                               "--kv-dtype", "fp32,int8"], ["--tp", "2"], ["--model", "tiny-moe",
                                                                                         "--tp", "2", "--ep", "2"]]


def spec_of(args, tmp_path, mode="new") -> RunSpec:
    params = profile.make_context("profile", [*BASE, *args, "--out", str(tmp_path / "o")]).params
    return spec_from_options(params, mode)


def write_file(spec: RunSpec, threads: int = 1) -> Path:
    header = RunHeader(device=cpu_device("test cpu", {"fp32": 1e11}, 1e10), model=spec.plan.model, dtype="fp32",
                       settings=spec.to_header(threads), command=spec.command())
    spec.out.mkdir(parents=True, exist_ok=True)
    with ResultWriter(spec.path, header):
        pass
    return spec.path


@pytest.mark.parametrize("args", VARIANTS)
def test_a_spec_round_trips_through_the_header_exactly(args, tmp_path):
    spec = spec_of(args, tmp_path)
    back = RunSpec.from_header(read_results(write_file(spec)).header, out=spec.out)
    assert back == spec


@pytest.mark.parametrize("args", VARIANTS)
def test_the_resume_command_regenerates_the_same_spec(args, tmp_path):
    spec = spec_of(args, tmp_path)
    argv = shlex.split(spec.command(resume=True))
    assert argv[0] == entry_point() and Path(argv[0]).name == "roofline" and argv[1] == "profile"
    assert argv[-1] == "--resume"
    params = profile.make_context("profile", argv[2:]).params
    assert spec_from_options(params, "resume") == RunSpec(**{**spec.__dict__, "mode": "resume"})


def _resume(tmp_path, *extra):
    return CliRunner().invoke(main, ["profile", *BASE, "--out", str(tmp_path / "o"), "--no-report", "--quiet",
                                     *extra, "--resume"])


def test_resume_without_tp_into_a_tp_2_file_is_refused_naming_both(tmp_path):
    path = write_file(spec_of(["--tp", "2"], tmp_path))
    before = path.read_bytes()
    r = _resume(tmp_path)
    assert r.exit_code != 0 and r.output.count("\n") == 1, r.output
    assert "measured with --tp 2, this run has --tp 1" in r.output and "Resume with --tp 2" in r.output, r.output
    assert path.read_bytes() == before


def test_resume_with_tp_2_into_a_one_rank_file_is_refused_naming_both(tmp_path):
    path = write_file(spec_of([], tmp_path))
    assert "tp" not in read_results(path).header.settings        # one rank's header records no tp: it reads as 1
    before = path.read_bytes()
    r = _resume(tmp_path, "--tp", "2")
    assert r.exit_code != 0 and r.output.count("\n") == 1, r.output
    assert "measured with --tp 1, this run has --tp 2" in r.output and "Resume with --tp 1" in r.output, r.output
    assert path.read_bytes() == before


@pytest.mark.parametrize("name", ["tiny-moe", "mixtral-8x7b"])
def test_the_moe_sweeps_memory_estimate_is_the_capacity_estimate(name):
    from types import SimpleNamespace

    from profiler.sweep import point_bytes
    from roofline.capacity import capacity, weight_bytes
    from roofline.dtypes import bytes_per_element

    cfg = load_model(name)
    one = cfg.with_layers(1)
    for prefill, batch, context in ((True, 1, 128), (False, 8, 512)):
        cap = capacity(one, SimpleNamespace(name="x", memory_bytes=0), batch, context,
                       new_tokens=context if prefill else 1, weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16",
                       windowed_kv=False)
        assert point_bytes(cfg, batch, context, "bf16", prefill) == cap.total_bytes
    # every expert of the layer is resident: the weights the hand-written Llama layer left out
    experts = cfg.n_experts * 3 * cfg.hidden * cfg.moe_intermediate * bytes_per_element("bf16")
    assert weight_bytes(one, weight_dtype="bf16", act_dtype="bf16") > experts
