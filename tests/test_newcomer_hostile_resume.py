"""Issue 33, data never lost: ``profile --overwrite`` with a checkpoint that lacks a tensor refuses before its old
file is touched; a resume after the checkpoint's weights changed is refused in one line (the sha256 of the header
against the files')."""

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from click.testing import CliRunner  # noqa: E402

import hf_tiny as H  # noqa: E402
from cli_errors import one_line_error  # noqa: E402
from profiler.ceilings import device_name  # noqa: E402
from profiler.cli import main  # noqa: E402
from profiler.commands.profile import profile  # noqa: E402
from profiler.run_spec import spec_from_options  # noqa: E402
from roofline.devices import cpu_device  # noqa: E402
from roofline.records import RunHeader  # noqa: E402
from roofline.writer import ResultWriter  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return H.build_checkpoint("llama", tmp_path_factory.mktemp("hostile-resume") / "llama")


def base(folder, out):
    return ["--model", str(folder), "--phases", "decode", "--batches", "1", "--contexts", "8", "--backends", "torch",
            "--dtype", "fp32", "--device", "cpu", "--budget-ms", "2", "--threads", "1", "--out", str(out)]


def results_of(folder, out, lines=3) -> Path:
    """A results file of a run of ``folder``'s checkpoint: its header and ``lines`` lines after it."""
    spec = spec_from_options(profile.make_context("profile", base(folder, out)).params, "new")
    header = RunHeader(device=cpu_device(device_name("cpu"), {"fp32": 1e11}, 1e10), model=spec.plan.model, dtype="fp32",
                       settings=spec.to_header(1), command=spec.command())
    spec.out.mkdir(parents=True, exist_ok=True)
    with ResultWriter(spec.path, header):
        pass
    with open(spec.path, "a") as f:
        f.writelines('{"kind": "note", "n": %d}\n' % i for i in range(lines))
    return spec.path


def run(folder, out, *extra):
    return CliRunner().invoke(main, ["profile", *base(folder, out), "--no-report", "--quiet", *extra])


def test_overwrite_with_a_checkpoint_that_lacks_a_tensor_keeps_the_old_file(built, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(built, d)
    path = results_of(d, tmp_path / "o", lines=18)
    before = path.read_bytes()
    sd = safetensors_torch.load_file(str(d / "model.safetensors"))
    del sd["model.layers.0.mlp.down_proj.weight"]
    safetensors_torch.save_file(sd, str(d / "model.safetensors"))
    one_line_error(run(d, tmp_path / "o", "--overwrite"), "lacks the tensor 'model.layers.0.mlp.down_proj.weight'")
    assert path.read_bytes() == before


def test_resume_after_the_weights_changed_is_refused(built, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(built, d)
    path = results_of(d, tmp_path / "o", lines=0)
    before = path.read_bytes()
    sd = safetensors_torch.load_file(str(d / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] * 2
    safetensors_torch.save_file(sd, str(d / "model.safetensors"))
    one_line_error(run(d, tmp_path / "o", "--resume"), f"cannot resume {path}",
                   "the checkpoint's weights changed since it was measured (sha256")
    assert path.read_bytes() == before


def test_resume_mismatch_names_a_changed_sha256_for_every_kind_of_run():
    from dataclasses import replace

    from roofline.writer import resume_mismatch

    dev = cpu_device("test cpu", {"fp32": 1e11}, 1e10)
    old = RunHeader(device=dev, kind="latency", dtype="fp32",
                    settings={"threads": 1, "weights": {"weights": "checkpoint", "sha256": "a" * 64, "bytes": 10}})
    assert resume_mismatch(old, old) == ""
    new = replace(old, settings={**old.settings, "weights": {**old.settings["weights"], "sha256": "b" * 64}})
    assert resume_mismatch(old, new) == ("the checkpoint's weights changed since it was measured (sha256 "
                                         "aaaaaaaaaaaa... then, bbbbbbbbbbbb... now)")
    random = replace(old, settings={"threads": 1, "weights": {"weights": "random (seeded)"}})
    assert resume_mismatch(random, random) == ""
