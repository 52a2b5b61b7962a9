"""Runs at the checkpoint's own precision (issue 29): ``kernels.run_precision`` maps each module's format (the
checkpoint's, or the flags' over it) onto what our kernels hold; a sweep on the CPU runs an FP8 checkpoint through
the torch path with every measured point's cost equal to the registry's (``roofline.workload`` at that precision),
keyed by the weights it ran, its header recording each module's format; the run commands take every format a kernel
of ours runs, and refuse the others in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernels.run_precision import run_precision  # noqa: E402
from kernels.runners import make_runners  # noqa: E402
from roofline import workload as W  # noqa: E402
from roofline.devices import Device  # noqa: E402
from roofline.errors import RooflineError  # noqa: E402
from roofline.models import load_model  # noqa: E402
from roofline.precision.formats import names, run_names  # noqa: E402

QUANT = Path(__file__).parent / "data" / "hf_configs" / "quant"


@pytest.mark.parametrize("name,label,kv", [
    ("gpt-oss-120b", "experts=mxfp4", "bf16"),
    ("qwen3-32b-fp8", "mlp=fp8-block,attention=fp8-block", "bf16"),
    ("deepseek-v3", "experts=fp8-block,shared_experts=fp8-block,mlp=fp8-block,mla=fp8-block", "bf16"),
    ("kimi-k2-thinking", "experts=int4", "bf16"),
    ("qwen2.5-32b-instruct-gptq-int4", "mlp=int4,attention=int4", "bf16"),
    ("llama-3.1-70b-instruct-fp8", "mlp=fp8-tensor,attention=fp8-tensor", "fp8"),
])
def test_a_published_checkpoint_runs_at_its_own_precision_as_our_kernels_hold_it(name, label, kv):
    rp = run_precision(load_model(str(QUANT / name)), "bf16")
    assert rp.weight_label == label and rp.kv_dtype == kv and not rp.flagged
    assert rp.describe().startswith("weights from ")


def test_what_our_kernels_hold_otherwise_than_the_checkpoint_is_said():
    gptq = run_precision(load_model(str(QUANT / "qwen2.5-32b-instruct-gptq-int4")), "bf16")
    f = dict(gptq.run.weights)["mlp"]
    assert (f.name, f.group_size, f.zero_point) == ("int4", 128, True)           # GPTQ as our int4 with zero points
    assert "mlp: int4 GPTQ (g128) in the checkpoint, run as int4 (g128, zero points)" in " ".join(gptq.notes)
    ds = run_precision(load_model(str(QUANT / "deepseek-v3")), "bf16")
    assert "experts" not in dict(ds.run.acts) and dict(ds.run.acts)["mla"].name == "fp8-group"   # W8A16 experts
    assert any(n.startswith("experts: the checkpoint's activations are fp8 e4m3 (1x128 dynamic groups)")
               for n in ds.notes)
    mo = run_precision(load_model(str(QUANT / "llama-3.1-70b-instruct-fp8")), "bf16")
    assert any(n.startswith("KV cache: fp8 e4m3 (per-tensor scales, as vLLM) in the checkpoint, run as fp8 e4m3 "
                            "(per-token, per-head scales)") for n in mo.notes)


def test_flags_over_the_checkpoint_and_formats_no_kernel_runs():
    cfg = load_model("tiny-moe")
    rp = run_precision(cfg, "fp32", "experts=nvfp4,attention=fp8")
    assert rp.flagged and rp.weight_label == "experts=nvfp4,attention=fp8"
    assert dict(rp.run.acts)["attention"].name == "fp8"                          # fp8's GEMM quantizes x per token
    assert run_precision(cfg, "fp32", "int8").weight_label == "int8" and not run_precision(cfg, "fp32", "int8").notes
    assert "attention: our kernel for its weights quantizes the activations too: run as fp8 e4m3 (per-token " \
        "dynamic scales)" in run_precision(cfg, "fp32", "fp8").notes       # a weight flag, a W8A8 kernel: said
    assert run_precision(cfg, "fp32", "fp32").weight_label == "fp32"
    with pytest.raises(RooflineError, match=r"^experts: no kernel of ours runs mxfp8 .*--weight-dtype experts="):
        run_precision(cfg, "fp32", "experts=mxfp8")
    with pytest.raises(RooflineError, match=r"the KV cache is fp32 \(the activation dtype\) or 8-bit \(int8 or fp8\), "
                       "but 'bf16' was given"):
        run_precision(cfg, "fp32", kv="bf16")
    with pytest.raises(RooflineError, match=r"--weight-dtype bf16: the weights are held in the activation dtype"):
        run_precision(cfg, "fp32", "bf16")
    assert set(run_names("weight")) < set(names("weight")) and "mxfp8" not in run_names("weight")


def test_a_published_fp8_kv_cache_on_a_cpu_is_refused_with_what_to_give():
    cfg = load_model(str(QUANT / "llama-3.1-70b-instruct-fp8")).with_layers(1)
    with pytest.raises(RooflineError, match=r"the checkpoint's KV cache is fp8 e4m3 .* give --kv-dtype int8 or fp32"):
        make_runners(cfg, "decode", 1, 8, dtype="fp32", backend="torch")


# ---------------------------------------------------------------- an FP8 checkpoint's sweep, on the CPU

@pytest.fixture(scope="module")
def fp8_sweep(tmp_path_factory):
    import hf_tiny_quant as Q
    from profiler.run import RunSpec, default_plan, run_profile

    q, _ = Q.build("fp8-block", tmp_path_factory.mktemp("fp8-block"))
    plan, _ = default_plan(model=str(q), phases=("prefill", "decode"), batches=(1,), contexts=(8,),
                           backends=("torch",), dtype="fp32", device="cpu", budget_ms=1,
                           weight_dtypes=("fp8-block", "fp32"))
    out = tmp_path_factory.mktemp("fp8-sweep")
    dev = Device(key="cpu", name="cpu", kind="cpu", peak_flops={"fp32": 1e11}, bandwidth=2e10, source="measured")
    # the checkpoint's own precision (no flag), then dequantized (fp32): two runs, one file
    own = run_profile(RunSpec(default_plan(model=str(q), phases=("prefill", "decode"), batches=(1,), contexts=(8,),
                                           backends=("torch",), dtype="fp32", device="cpu", budget_ms=1)[0],
                              out=out, mode="overwrite", report=False, check_kernels=False, flop_check=False,
                              device=dev))
    both = run_profile(RunSpec(plan, out=tmp_path_factory.mktemp("fp8-both"), mode="overwrite", report=False,
                               check_kernels=False, flop_check=False, device=dev))
    return load_model(str(q)), own, both


def test_an_fp8_checkpoint_sweeps_at_its_precision_with_the_registrys_costs(fp8_sweep):
    cfg, own, _ = fp8_sweep
    rp = run_precision(cfg, "fp32")
    ms = [m for m in own.result_file.measurements if m.ok]
    assert ms and {m.point.weight_dtype for m in ms} == {"mlp=fp8-block,attention=fp8-block"}
    for m in ms:
        p = m.point
        kw = dict(weight_dtype=rp.weight_label, act_dtype="fp32", kv_dtype="fp32", precision=rp.run)
        ph = W.prefill(cfg, 1, 8, **kw) if p.phase == "prefill" else W.decode(cfg, 1, 8, **kw)
        assert p.cost == ph.op(p.op).cost, p.op                     # the registry's cost, exactly
        assert p.compute_dtype == ph.op(p.op).compute_dtype
    q = next(m for m in ms if m.point.op == "q_proj" and m.point.phase == "decode")
    # [128, 128] e4m3 + one fp32 block scale, x and y fp32: 128 x 128 + 4 + (128 + 128) x 4
    assert q.point.cost.bytes == 128 * 128 + 4 + 256 * 4 and q.point.compute_dtype == "fp8"
    assert q.config["checkpoint"] == "attention: fp8-block checkpoint, run as stored (fp8-block on the torch backend)."
    assert q.config["impl"].startswith("dequantize reference: fp8 x and w dequantized to fp32")
    p = own.result_file.header.settings["precision"]["mlp=fp8-block,attention=fp8-block"]
    assert p["run"]["modules"]["attention"] == {"weight": "fp8-block", "weight_label": "fp8 e4m3 (128x128 blocks)",
                                                "act": "fp8-group"}
    assert p["weights"].startswith("weights from quantization_config: mlp fp8 e4m3 (128x128 blocks)")


def test_the_same_checkpoint_dequantized_sits_beside_it_keyed_apart(fp8_sweep):
    _, _, both = fp8_sweep
    q = {m.point.weight_dtype: m for m in both.result_file.measurements
         if m.ok and m.point.op == "q_proj" and m.point.phase == "decode"}
    assert set(q) == {"fp8-block", "fp32"}
    assert q["fp32"].point.cost.bytes == 128 * 128 * 4 + 256 * 4 and q["fp32"].point.compute_dtype == "fp32"
    assert "weights" not in q["fp32"].config                         # a float weight: no quantized kernel
    assert set(both.result_file.header.settings["precision"]) == {"fp8-block", "fp32"}


def test_the_cli_takes_each_format_a_kernel_runs_and_refuses_the_rest():
    from click.testing import CliRunner
    from profiler.cli import main as cli

    r = CliRunner().invoke(cli, ["profile", "--model", "tiny", "--weight-dtype", "mxfp8", "--out", "/nonexistent"])
    assert r.exit_code != 0 and "--weight-dtype must be fp8, fp8-tensor, fp8-block, mxfp4, nvfp4, int8, int4" in \
        r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["latency", "--model", "tiny", "--weight-dtype", "experts=gptq-int4"])
    assert r.exit_code != 0 and "no kernel of ours runs gptq-int4" in r.output


def test_explain_linear_takes_every_registered_format_and_pairs_the_activations():
    from click.testing import CliRunner
    from profiler.cli import main as cli
    import json

    def linear(*a):
        r = CliRunner().invoke(cli, ["explain", "linear", "--tokens", "4096", "--in", "4096", "--out", "4096",
                                     "--device", "b200", "--json", *a])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    d = linear("--dtype", "nvfp4")               # W4A4 at the FP4 rate: 4096 x 4096 / 2 + 256 x 4096 e4m3 + 4
    assert (d["act_format"], d["compute_dtype"], d["scale_bytes"]) == ("nvfp4", "fp4", 256 * 4096 + 4)
    d = linear("--dtype", "fp8-block")           # W8A8 at the fp8 rate, 1 x 128 activation groups
    assert (d["act_format"], d["compute_dtype"], d["scale_bytes"]) == ("fp8-group", "fp8", 32 * 32 * 4)
    d = linear("--weight-dtype", "nvfp4")        # weight-only: dequantized into bf16
    assert (d["act_format"], d["compute_dtype"]) == ("bf16", "bf16")
    r = CliRunner().invoke(cli, ["explain", "linear", "--tokens", "1", "--in", "4008", "--out", "64", "--dtype",
                                 "mxfp4"])
    assert r.exit_code != 0 and "its groups of 32 do not divide --in 4,008 (K)" in r.output


def test_the_formats_a_kernel_runs_are_the_ones_the_kernels_register():
    """``Format.kernel`` (what the CLI offers the run commands) and ``kernels.quant_weight.FORMATS`` (what the
    backends run) name the same weight formats, and each kernel module named exists and registers its own."""
    import importlib

    from kernels.quant_weight import FORMATS as KERNEL_FORMATS
    from roofline.precision import lookup

    assert set(run_names("weight")) == set(KERNEL_FORMATS)
    for n in run_names("weight"):
        mod = importlib.import_module(lookup(n, "weight").kernel)
        assert KERNEL_FORMATS[n].triton_linear.__module__ == mod.__name__, n
