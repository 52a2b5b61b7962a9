"""Issue 29's acceptance: a new weight format added from this test file alone -- one entry in the precision
registry (``roofline.precision.formats.register``) and one kernel module (this file's functions, registered with
``kernels.quant_weight.register_format``) -- is costed by ``explain``, held and run per module by ``make_runners``
on both backends, offered by the run commands' ``--weight-dtype`` and swept into a result file keyed by it, with no
package file edited.

The toy format "int8-tensor": int8 values with one fp32 scale for the whole tensor (w = q x s), weight-only (the
GEMM dequantizes into the activation dtype). A [K, N] weight's bytes: K x N + 4."""

import pytest
import torch
from click.testing import CliRunner

from kernels import quant_weight as QW
from kernels.quant_weight import QuantWeight
from kernels.run_precision import run_precision
from kernels.runners import make_runners
from profiler.cli import main
from roofline import workload as W
from roofline.models import load_model
from roofline.precision import formats as PF
from roofline.records import read_results

NAME = "int8-tensor"
FMT = PF.Format(NAME, "int8", 8, PF.Scales(0, 0, "fp32"), ("weight",), "act", None, "int8 (one scale per tensor)",
                kernel=__name__)


def quantize(w, **_):
    K, N = w.shape
    s = (w.abs().max().float() / 127).clamp_min(1e-12)
    q = torch.round(w.float().t() / s).clamp(-127, 127).to(torch.int8).contiguous()        # [N, K]
    return QuantWeight(NAME, q, s.reshape(1), None, K, N, act=w.dtype)


def dequantize(qw, dtype=torch.float32):
    return (qw.qweight.double() * qw.scales.double()).t().to(dtype)


def prepare_torch(qw):
    qw.torch_impl = "dequantize reference (the toy format's)"


def linear(x, qw, bias=None, **_):
    y = x.float() @ dequantize(qw)
    return (y if bias is None else y + bias.float()).to(x.dtype)


def cut(q, axis, start, stop):
    rows = slice(start, stop)
    qw = q.qweight[rows] if axis == "out" else q.qweight[:, rows]
    K, N = (q.in_features, stop - start) if axis == "out" else (stop - start, q.out_features)
    return QuantWeight(NAME, qw.contiguous(), q.scales.clone(), None, K, N, act=q.act)


def pad_out(q, n):
    extra = q.qweight.new_zeros(n - q.out_features, q.in_features)
    return QuantWeight(NAME, torch.cat([q.qweight, extra]), q.scales, None, q.in_features, n, act=q.act)


@pytest.fixture
def toy():
    PF.register(FMT)
    QW.register_format(NAME, quantize=quantize, dequantize=dequantize, prepare_torch=prepare_torch,
                       torch_linear=linear, triton_linear=linear, triton_config=lambda qw, M, dtype, device: {},
                       slice=cut, pad_out=pad_out)
    yield
    for k in [k for k in PF.FORMATS if k[1] == NAME]:
        del PF.FORMATS[k]
    QW.FORMATS.pop(NAME)


def test_a_format_from_one_registry_entry_and_one_kernel_module_is_costed_held_and_run(toy):
    cfg = load_model("tiny")                                  # hidden 64: q_proj [64, 64]
    assert W.decode(cfg, 1, 8, weight_dtype=NAME, act_dtype="fp32").op("q_proj").cost.bytes == \
        64 * 64 + 4 + (64 + 64) * 4                           # the weight as stored + one scale, x and y in fp32
    rp = run_precision(cfg, "fp32", NAME)
    assert rp.weight_label == NAME and dict(rp.run.weights)["mlp"] is FMT and not rp.notes
    for backend in ("torch", "triton"):
        rs = {r.name: r for r in make_runners(cfg, "decode", 1, 8, dtype="fp32", backend=backend, weight_dtype=NAME)}
        for r in rs.values():
            r.fn()
        q = rs["q_proj"]
        assert q.cost == W.decode(cfg, 1, 8, weight_dtype=NAME, act_dtype="fp32", kv_dtype="fp32",
                                  precision=rp.run).op("q_proj").cost
        assert q.config["weights"] == "int8 (one scale per tensor)"


def test_the_run_commands_offer_it_and_a_sweep_keys_its_points_by_it(toy, tmp_path):
    r = CliRunner().invoke(main, ["profile", "--model", "tiny", "--weight-dtype", f"fp32,{NAME}", "--backends",
                                  "torch", "--phases", "decode", "--batches", "1", "--contexts", "8", "--budget-ms",
                                  "1", "--out", str(tmp_path / "o"), "--no-report", "--quiet"])
    assert r.exit_code == 0, r.output
    ms = [m for m in read_results(tmp_path / "o" / "results.jsonl").measurements if m.point.op == "q_proj"]
    by = {m.point.weight_dtype: m.point.cost.bytes for m in ms}
    assert by == {"fp32": 64 * 64 * 4 + 128 * 4, NAME: 64 * 64 + 4 + 128 * 4}
