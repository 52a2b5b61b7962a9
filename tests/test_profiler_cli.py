"""`roofline profile` through CliRunner: bad input fails before anything runs; a tiny sweep end to end."""

import json

import pytest
from click.testing import CliRunner

import profiler.ceilings as C
import profiler.kernel_checks as R
from profiler.cli import main
from roofline.devices import cpu_device
from roofline.errors import RooflineError


@pytest.fixture
def ran(monkeypatch):
    """Records what ran: kernel validation and ceilings are replaced by fast stand-ins."""
    log = []

    def checks(backends, dtype, device="cpu"):
        log.append(("check", tuple(backends), dtype))
        return []

    def ceilings(device="cpu", **kw):
        log.append(("ceilings", device))
        return C.Ceilings(cpu_device(C.device_name("cpu"), {"fp32": 1e11, "bf16": 5e10}, 2e10), None,
                          {"bandwidth": {}, "gemm": {}, "label": "achievable"})
    monkeypatch.setattr(R, "validate_kernels", checks)
    monkeypatch.setattr(C, "get_ceilings", ceilings)
    return log


def invoke(args):
    return CliRunner().invoke(main, ["profile", "--device", "cpu", *args])


TINY = ["--model", "tiny", "--batches", "1", "--contexts", "8", "--budget-ms", "1", "--quiet", "--no-report"]


@pytest.mark.parametrize("args, message", [
    (["--batches", "1,x"], "'x' is not a positive integer"),
    (["--batches", "1,,0"], "'0' is not a positive integer"),
    (["--contexts", ""], "comma-separated list of positive integers"),
    (["--model", "tiny", "--contexts", "1024"], "maximum context of 512"),
    (["--model", "small", "--phases", "decode", "--contexts", "2048"], "needs 2049 positions"),
    (["--phases", "prefil"], "comma-separated list of prefill, decode"),
    (["--backends", "cuda"], "comma-separated list of triton, torch"),
    (["--model", "small", "--backends", "triton"], "Triton interpreter"),
    (["--model", "nope"], "Unknown model 'nope'"),
    (["--dtype", "int8"], "--dtype takes fp32, bf16, fp16"),
])
def test_bad_input_is_a_usage_error_before_anything_runs(ran, tmp_path, args, message):
    out = tmp_path / "out"
    r = invoke([*args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert ran == [] and not (out / "results.jsonl").exists()


def test_unwritable_output_directory(ran, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = invoke([*TINY, "--out", str(blocker / "sub")])
    assert r.exit_code == 2 and "cannot be written" in r.output and ran == []


def test_tiny_sweep_end_to_end_with_csv(ran, tmp_path):
    out = tmp_path / "out"
    r = invoke([*TINY, "--out", str(out), "--csv"])
    assert r.exit_code == 0, r.output
    assert ran[0] == ("check", ("torch",), "fp32")
    lines = (out / "results.jsonl").read_text().splitlines()
    h = json.loads(lines[0])
    assert h["type"] == "header" and h["model"]["name"] == "tiny" and h["settings"]["batches"] == [1]
    assert h["flop_check"]["points"][1]["ratio"] == pytest.approx(1.0)   # decode: nothing is causal
    assert h["versions"]["torch"] and "roofline profile" in h["command"]
    assert len(lines) == 1 + 2 * 19                                     # prefill + decode, 18 ops + layer
    csv = (out / "results.csv").read_text().splitlines()
    assert csv[0].startswith("model,op,phase") and len(csv) == 1 + 38
    assert "verdict" in r.output and "results:" in r.output
    # resume: nothing left to do
    r = invoke([*TINY, "--out", str(out), "--resume"])
    assert r.exit_code == 0 and "0 measured" in r.output and "38 resumed" in r.output


def test_resume_refuses_another_model_and_reports_corrupt_lines(ran, tmp_path):
    out = tmp_path / "out"
    assert invoke([*TINY, "--out", str(out)]).exit_code == 0
    ran.clear()
    r = invoke(["--model", "small", "--batches", "1", "--contexts", "8", "--out", str(out), "--resume"])
    assert r.exit_code == 2 and "it holds model name = 'tiny', this run has 'small'" in r.output and ran == []
    path = out / "results.jsonl"
    lines = path.read_text().splitlines()
    h = json.loads(lines[0])
    h["device"]["name"] = "NVIDIA H100 SXM5 80GB"
    path.write_text("\n".join([json.dumps(h)] + lines[1:]) + "\n")
    r = invoke([*TINY, "--out", str(out), "--resume"])
    assert r.exit_code == 2 and "it holds device 'NVIDIA H100 SXM5 80GB', this run is on" in r.output and ran == []
    lines[3] = '{"type": "measurement", "point": '
    path.write_text("\n".join(lines) + "\n")
    r = invoke([*TINY, "--out", str(out), "--resume"])
    assert r.exit_code == 2 and "line 4" in r.output and ran == []


def test_ctrl_c_prints_the_resume_command(ran, tmp_path, monkeypatch):
    import profiler.sweep as S

    real = S.run_sweep

    def interrupted(plan, writer, **kw):
        fake = lambda *a, **k: [_Interrupt(r) for r in S._default_make_runners()(*a, **k)]  # noqa: E731
        return real(plan, writer, **dict(kw, make_runners=fake))
    monkeypatch.setattr(S, "run_sweep", interrupted)
    out = tmp_path / "out"
    r = invoke([*TINY, "--out", str(out)])
    assert r.exit_code == 130
    assert "interrupted: 3 points are kept"  # embedding, attn_norm, q_proj in r.output
    assert f"--out {out} --budget-ms 1 --resume" in r.output
    assert len((out / "results.jsonl").read_text().splitlines()) == 4


class _Interrupt:
    """A runner that is Ctrl-C'd on its third op."""
    count = 0

    def __init__(self, r):
        self.name, self.cost, self.compute_dtype, self.config = r.name, r.cost, r.compute_dtype, r.config
        self._fn = r.fn

    def fn(self):
        if self.name == "k_proj":
            raise KeyboardInterrupt
        return self._fn()


def test_failed_kernel_check_refuses_to_time(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import kernels.check

    bad = SimpleNamespace(name="linear 17x33x65", max_rel_err=0.5, tol=1e-4, passed=False, detail="poisoned")
    monkeypatch.setattr(kernels.check, "run_checks", lambda **kw: [bad])
    r = invoke([*TINY, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "kernel validation failed, so nothing was timed: torch linear 17x33x65" in r.output
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_a_kernel_check_pass_is_remembered_and_a_failure_never_is(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import kernels.check

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    calls = []
    good = SimpleNamespace(name="linear 17x33x65", max_rel_err=1e-7, tol=1e-4, passed=True, detail="")
    bad = SimpleNamespace(name="linear 17x33x65", max_rel_err=0.5, tol=1e-4, passed=False, detail="poisoned")
    outcome = [bad]
    monkeypatch.setattr(kernels.check, "run_checks", lambda **kw: calls.append(kw) or list(outcome))
    for _ in range(2):                                   # a failure is checked again every time
        with pytest.raises(RooflineError, match="kernel validation failed"):
            R.validate_kernels(("torch",), "fp32", "cpu")
    assert len(calls) == 2
    outcome[:] = [good]
    R.validate_kernels(("torch",), "fp32", "cpu")
    R.validate_kernels(("torch",), "fp32", "cpu")       # the same sources, versions, device: remembered
    assert len(calls) == 3
    R.validate_kernels(("torch",), "fp16", "cpu")       # another dtype is another check
    assert len(calls) == 4
    key = R._check_key("torch", "fp32", "cpu")
    monkeypatch.setattr(R, "_check_key", lambda *a: dict(key, kernels="edited"))   # a kernel file changed
    R.validate_kernels(("torch",), "fp32", "cpu")
    assert len(calls) == 5
