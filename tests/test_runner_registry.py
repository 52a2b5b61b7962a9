"""The runner registry (``kernels.runner_registry``): a toy op kind registered from this file has a runner and
its compile-check launches appear in the compile check's variant list (no package file touched); an unknown kind
is refused in one line.

Run: pytest tests/test_runner_registry.py
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernels  # noqa: F401
from kernels import runner_registry as RR
from roofline.errors import RooflineError

ROOT = Path(__file__).resolve().parent.parent


def register_toy():
    """The toy kind "toy": a runner that adds the context's hidden rows to themselves, and one compile-check launch
    (the residual add on a [tokens, 23] meta tensor: an element count no 16 divides, a variant of its own)."""
    from kernels import residual as R

    @RR.runner("toy")
    def toy(ctx, spec):
        h = ctx.h
        return (lambda: h + h), {"toy": spec.name}

    @RR.launches("toy")
    def toy_launch(rec, combo):
        x = torch.empty(combo.tokens, 23, dtype=combo.dt, device=torch.device("meta"))
        rec.context = dict(combo.where, op="toy residual")
        R.residual_add(x, x)
    return toy, toy_launch


@pytest.fixture
def toy():
    fns = register_toy()
    yield fns
    RR.RUNNERS.pop("toy")
    RR.LAUNCHES.pop("toy")


def test_a_toy_kind_registered_here_has_a_runner(toy):
    from types import SimpleNamespace

    assert "toy" in RR.RUNNERS and RR.builder("toy") is toy[0]
    assert list(RR.LAUNCHES)[-1] == "toy" and RR.LAUNCHES["toy"] is toy[1]
    fn, conf = RR.builder("toy")(SimpleNamespace(h=torch.ones(2, 3)), SimpleNamespace(name="toy_op"))
    assert conf == {"toy": "toy_op"} and torch.equal(fn(), torch.full((2, 3), 2.0))


def test_an_unknown_kind_is_refused_in_one_line():
    import kernels.runners  # noqa: F401  (registers the package's kinds)

    with pytest.raises(RooflineError) as e:
        RR.builder("warp_drive")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("no runner for op kind 'warp_drive': the registered kinds are ")
    assert all(k in msg for k in ("linear", "attention", "experts", "mla_attention"))
    with pytest.raises(RooflineError, match="already has a runner"):
        RR.runner("linear")(lambda ctx, spec: None)


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import test_runner_registry as T
    from kernels import variants as V
    T.register_toy()
    t = V.TARGETS["sm_90"]
    vs = V.variants(t, V.record(t, [("llama-3-8b", "decode", 2, 128, "bf16")]))
    toy = [v for v in vs if any(tag.endswith("toy residual") for _, tag in v.launches)]
    print(json.dumps([[v.kernel, v.config, [tag for _, tag in v.launches]] for v in toy]))
""")


pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this triton")


def test_the_toy_kinds_launch_is_in_the_compile_checks_variant_list():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "tests")], env=env, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    toy = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(k, tags) for k, _, tags in toy] == [("_add_kernel", ["llama-3-8b decode b=2 ctx=128 bf16 toy residual"])]


def test_kernels_that_need_a_higher_target_are_not_unreached_on_a_lower_one():
    """fp8 kernels are launched from sm_89 on: a compile check of sm_80 alone does not call them unreached."""
    from kernels import compile_launches  # noqa: F401  (declares the fp8 kernels' capability)
    from kernels import variants as V

    every = dict.fromkeys(("_linear_fp8_kernel", "_act_quant_kernel", "_rmsnorm_kernel"))   # none launched
    assert RR.NEEDS["_linear_fp8_kernel"] == RR.NEEDS["_act_quant_kernel"] == 89
    gone = V.unreached(set(), every, 80)
    assert gone == ["_rmsnorm_kernel"]
    assert V.unreached(set(), every, 90) == ["_act_quant_kernel", "_linear_fp8_kernel", "_rmsnorm_kernel"]


def test_roofline_check_enumerates_the_same_registry():
    """Every kind with a runner has roofline check rows, but for the four that run only inside the model (checked
    by the transformers parity tests); a group registered here runs in its part, in its order."""
    import kernels.check as CK
    import kernels.runners  # noqa: F401  (registers the package's kinds)
    from kernels.check_result import CheckResult

    covered = {k for g in RR.CHECKS.values() for k in g.kinds}
    assert set(RR.RUNNERS) - covered == {"scale", "gate", "latent_append", "index_append"}
    assert [g.name for g in RR.check_groups()] == ["kernels", "deltanet", "mamba", "model", "quantized", "fp8", "fp4",
                                                   "quantized model"]
    RR.checks("toy rows", "kernels", ("toy",), order=5)(
        lambda ops, dt, dev, quick, model: [CheckResult("toy T=3", 0.0, 1e-5, True, ops.name)])
    try:
        assert [g.name for g in RR.check_groups(("kernels",))] == ["toy rows", "kernels", "deltanet", "mamba"]
        rows = CK.run_checks(backend="torch", dtype="fp32", parts=("kernels",))
        assert rows[0] == CheckResult("toy T=3", 0.0, 1e-5, True, "torch") and len(rows) > 1
    finally:
        RR.CHECKS.pop("toy rows")
    with pytest.raises(RooflineError, match="part 'warp' is not one of kernels, model, quant"):
        RR.checks("bad", "warp", (), order=1)
