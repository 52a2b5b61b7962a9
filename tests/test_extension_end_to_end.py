"""Issue 28's acceptance: a new op kind and a new trace rule, added from this test file alone (registry entries, no
package file edited), reach the costs, a sweep, the compile check's variant list and a trace's costed share.

The toy kind "toy_gate" scales each layer's hidden rows by a constant after the MLP: H FLOPs per row (one
multiply), the rows read and written once in the activation dtype. A toy family (a Llama reader plus an
``edit_ops`` that places one toy op per layer before the MLP's residual add) brings it into a model.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import profiler.ceilings as C
import profiler.kernel_checks as R
from kernels import runner_registry as RR
from profiler.cli import main
from roofline import formulas as F
from roofline import workload as W
from roofline.cost import Cost
from roofline.devices import cpu_device
from roofline.families import Family, register, registry
from roofline.families.llama import llama_like
from roofline.layer import model_ops
from roofline.op_spec import OpSpec
from roofline.models import load_model
from roofline.ops import KINDS, OpKind
from roofline.ops import register as register_kind
from roofline.records import read_results
from roofline.traces import registry as trace_registry
from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace
from roofline.traces.opcost import numel, signature

ROOT = Path(__file__).resolve().parent.parent
H, I, L, NH, NKV, V = 32, 48, 2, 4, 2, 128
CONFIG = dict(model_type="toy_gated_llama", hidden_size=H, intermediate_size=I, num_hidden_layers=L,
              num_attention_heads=NH, num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=256)


def toy_gate_cost(op, s):
    """rows x width multiplies; the rows read and written once in the activation dtype."""
    e = s.rows * op.dims["width"]
    return F.elementwise(e, ((e, s.dtypes.act),), out_dtype=s.dtypes.act)


def place_toy_gate(cfg, sh, ops):
    at = [o.name for o in ops].index("mlp_residual")
    every = tuple(range(cfg.n_layers))
    return ops[:at] + [OpSpec("toy_gate", "toy_gate", "layer", "mlp", cfg.n_layers, (), {"width": cfg.hidden},
                              every)] + ops[at:]


def register_everything():
    """The registry entries (idempotent, so the compile-check subprocess can call it too)."""
    if "toy_gate" not in KINDS:
        register_kind(OpKind("toy_gate", "mlp", toy_gate_cost))
    if "toy_gated_llama" not in registry.model_types():
        register(Family("toy_gated_llama", llama_like, edit_ops=place_toy_gate))
    if "toy_gate" not in RR.RUNNERS:
        @RR.runner("toy_gate")
        def toy_gate(ctx, spec):
            x, two = ctx.x, torch.tensor(2.0, dtype=ctx.dt, device=ctx.dev)
            return (lambda: x * two), {}

        @RR.launches("toy_gate")
        def toy_gate_launch(rec, combo):
            from kernels import residual
            x = torch.empty(combo.tokens, 29, dtype=combo.dt, device=torch.device("meta"))  # 29: a variant of its own
            rec.context = dict(combo.where, op="toy_gate")
            residual.residual_add(x, x)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    register_everything()
    yield load_model(_write(tmp_path))
    KINDS.pop("toy_gate")
    registry._FAMILIES.pop("toy_gated_llama")
    RR.RUNNERS.pop("toy_gate")
    RR.LAUNCHES.pop("toy_gate")


def _write(tmp_path) -> Path:
    d = tmp_path / "toy-model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def test_the_toy_kind_is_costed(toy):
    names = [o.name for o in model_ops(toy)]
    assert names[names.index("down_proj") + 1:names.index("down_proj") + 3] == ["toy_gate", "mlp_residual"]
    ph = W.decode(toy, 3, 40, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
    assert ph.op("toy_gate").cost == Cost(3 * H, 2 * 3 * H * 4)            # 96 multiplies; 3 x 32 fp32 in and out
    assert ph.op("toy_gate").count == L
    pf = W.prefill(toy, 2, 10, act_dtype="bf16", weight_dtype="bf16", kv_dtype="bf16")
    assert pf.op("toy_gate").cost == Cost(20 * H, 2 * 20 * H * 2)          # 20 rows of 32, bf16
    without = sum((o.total for o in ph.ops if o.name != "toy_gate"), Cost(0, 0))
    assert ph.total == without + Cost(3 * H, 2 * 3 * H * 4) * L


@pytest.fixture
def quick_measures(monkeypatch):
    monkeypatch.setattr(R, "validate_kernels", lambda backends, dtype, device="cpu": [])
    monkeypatch.setattr(C, "get_ceilings", lambda device="cpu", **kw: C.Ceilings(
        cpu_device(C.device_name("cpu"), {"fp32": 1e11, "bf16": 5e10}, 2e10), None,
        {"bandwidth": {}, "gemm": {}, "label": "achievable"}))


def test_the_toy_kind_is_swept_with_its_registered_cost(toy, tmp_path, quick_measures):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["profile", "--device", "cpu", "--model", str(_write(tmp_path)), "--phases",
                                  "decode", "--batches", "2", "--contexts", "16", "--backends", "torch", "--dtype",
                                  "fp32", "--budget-ms", "2", "--quick", "--out", str(out), "--no-report"])
    assert r.exit_code == 0, r.output
    rf = read_results(out / "results.jsonl")
    gate, = [m for m in rf.measurements if m.point.op == "toy_gate"]
    assert gate.point.cost == Cost(2 * H, 2 * 2 * H * 4)                 # the registry's cost, as recorded
    assert W.op_count("toy_gate", rf.header.model) == L                   # its count, from the model's ops
    assert gate.median_s > 0 and len(gate.times_s) >= 1


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import test_extension_end_to_end as T
    from kernels import variants as V
    T.register_everything()
    t = V.TARGETS["sm_90"]
    vs = V.variants(t, V.record(t, [("llama-3-8b", "decode", 2, 128, "bf16")]))
    print(json.dumps([[v.kernel, [tag for _, tag in v.launches]] for v in vs
                      if any(tag.endswith("toy_gate") for _, tag in v.launches)]))
""")


def test_the_toy_kinds_launch_is_in_the_compile_checks_variant_list():
    pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this triton")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "tests")], env=env, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [["_add_kernel",
                                                            ["llama-3-8b decode b=2 ctx=128 bf16 toy_gate"]]]


def test_a_toy_trace_rule_costs_the_kernel_and_raises_the_costed_share(tmp_path):
    ev = []
    for i, (name, kernel, dur) in enumerate([("aten::mm", "ampere_sgemm_64x64_nn", 30),
                                             ("toyco::gate", "toy_gate_kernel", 90)]):
        dims = [[8, 64], [64, 64]] if name == "aten::mm" else [[16, 32]]
        ev += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 100 * i, "dur": 50,
                "args": {"External id": i + 1, "Input Dims": dims, "Input type": ["float"] * len(dims),
                         "Concrete Inputs": [""] * len(dims)}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 100 * i + 10,
                "dur": 5, "args": {"correlation": 500 + i, "External id": i + 1}},
               {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": 1000 + 100 * i, "dur": dur,
                "args": {"device": 0, "stream": 7, "correlation": 500 + i, "External id": i + 1}}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schemaVersion": 1, "record_shapes": 1, "traceEvents": ev,
                             "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    before = analyze_trace(read_trace(p)).summary
    assert before["costed_s"] / before["attributed_s"] == pytest.approx(30 / 120, rel=1e-12)

    @trace_registry.rule(pattern=r"^toyco::gate$", category="toy-gate")
    def toy_gate(a):   # what toy_gate_cost says, for the traced op's [16, 32] fp32 input
        (shape, dt), = a.tensors()
        e = numel(shape)
        return a.op(F.elementwise(e, ((e, "fp32"),), out_dtype="fp32"), dt, signature(shape, dtype=dt))

    try:
        res = analyze_trace(read_trace(p))
    finally:
        trace_registry.unregister(toy_gate)
    s = res.summary
    assert s["costed_s"] / s["attributed_s"] == pytest.approx(1.0, rel=1e-12)    # up by exactly 90 / 120
    gate, = [m for m in res.measurements if m.config["name"] == "toyco::gate"]
    assert gate.point.cost == Cost(512, 2 * 512 * 4) and gate.config["category"] == "toy-gate"
