"""Quantization through the toolkit: logits parity, a CPU sweep with int8 weights, the measured effect in
diagnose, the charts, and the compile check's coverage of the new kernels.

Run: pytest tests/test_quant_runs.py   (about 15 s on 2 cores: one tiny sweep, a few interpreter steps,
two real compilations)
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernels  # noqa: F401  (the interpreter before triton)
from kernels.check import quality_notes
from kernels.model import LlamaModel
from roofline import formulas as F
from roofline.analysis import analyze
from roofline.cost import Cost
from roofline.devices import Device
from roofline.verdicts.diagnosis import diagnose
from roofline.models import PRESETS
from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
from roofline.writer import ResultWriter

ROOT = Path(__file__).resolve().parent.parent
TINY = PRESETS["tiny"]
# ridge bf16 = 100e12 / 1e12 = 100 FLOP/B
DEV = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12,
             source="measured", provenance="made up")


# ---------------------------------------------------------------- quality

def test_int8_logits_stay_close_to_full_precision():
    """The quality note's numbers, bounded: int8 weights move the largest logit difference to under 5% of the
    largest logit with top-1 agreement of at least 90% over 32 tokens (measured: 1.4%, 31/32); an int8 KV
    cache under 2% (measured 0.5%, 32/32). Random weights: a check of the rounding, not of a trained model."""
    notes = {n.name: n for n in quality_notes("fp32", "cpu", model="tiny", tokens=32,
                                              cases=(("int8 weights", dict(weight_dtype="int8")),
                                                     ("int8 KV cache", dict(kv_dtype="int8"))))}
    w, kv = notes["int8 weights"], notes["int8 KV cache"]
    assert 0 < w.max_abs_diff <= 0.05 * w.logit_scale and w.top1 >= 0.9 * w.tokens
    assert 0 < kv.max_abs_diff <= 0.02 * kv.logit_scale and kv.top1 >= 0.9 * kv.tokens
    assert str(w).startswith("note int8 weights vs fp32 (tiny, random weights, 32-token prompt): max |logit "
                             "difference|")


def test_quantized_model_backends_agree_and_decode_equals_a_full_forward():
    kw = dict(dtype="fp32", seed=7, max_slots=2, max_len=32, weight_dtype="int8", kv_dtype="int8")
    toks = torch.randint(0, TINY.vocab, (1, 10), generator=torch.Generator().manual_seed(1))
    tri, tor = LlamaModel(TINY, backend="triton", **kw), LlamaModel(TINY, backend="torch", **kw)
    full = tor.forward_full(toks)
    assert (tri.forward_full(toks) - full).abs().max() <= 1e-4 * full.abs().max()
    out = [tri.prefill(toks[0, :8], 0)] + [tri.decode_step(toks[0, 8 + i][None], torch.tensor([0]))[0]
                                           for i in range(2)]
    assert (torch.stack(out) - full[7:10]).abs().max() <= 1e-4 * full.abs().max()
    assert tri.k_cache.dtype == torch.int8 and tri.quant_label == "int8 weights, int8 KV cache"


def test_runners_build_int4_weights_with_the_group_asked_for():
    from dataclasses import replace

    from kernels.runners import make_runners
    from roofline import workload as W

    cfg = replace(TINY, name="tiny-192", intermediate=192)        # every in-feature a multiple of 32
    ph = W.decode(cfg, 2, 8, weight_dtype="int4", act_dtype="fp32", kv_dtype="int8", group_size=32, zero_point=True)
    for backend in ("torch", "triton"):
        rs = {r.name: r for r in make_runners(cfg, "decode", 2, 8, dtype="fp32", backend=backend, weight_dtype="int4",
                                              kv_dtype="int8", group_size=32, zero_point=True,
                                              ops=["q_proj", "down_proj", "attention", "kv_append"])}
        for r in rs.values():
            r.fn()
            assert r.cost == ph.op(r.name).cost
        assert rs["down_proj"].config["weights"] == "int4 (g32, zero points)"
        assert rs["attention"].config["kv_cache"] == "int8, fp32 scale per token per KV head"
    assert rs["down_proj"].config["block_k"] == 32                 # triton: a K tile inside one group


# ---------------------------------------------------------------- a CPU sweep with int8 weights

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from profiler.run import RunSpec, default_plan, run_profile

    plan, _ = default_plan(model="tiny", phases=("decode",), batches=(1, 4), contexts=(16,), backends=("torch",),
                           dtype="fp32", device="cpu", budget_ms=2, weight_dtypes=("fp32", "int8"))
    out = tmp_path_factory.mktemp("quant-sweep")
    dev = Device(key="cpu", name="cpu", kind="cpu", peak_flops={"fp32": 1e11}, bandwidth=2e10, source="measured")
    return run_profile(RunSpec(plan, out=out, mode="overwrite", report=False, check_kernels=False,
                                  flop_check=False, device=dev))


def test_sweep_records_carry_the_weight_dtype_and_count_int8_bytes_and_scales(sweep):
    ms = [m for m in sweep.result_file.measurements if m.ok]
    assert {m.point.weight_dtype for m in ms} == {"fp32", "int8"} and {m.point.kv_dtype for m in ms} == {"fp32"}
    q = {(m.point.weight_dtype, m.point.batch): m for m in ms if m.point.op == "q_proj"}
    for b in (1, 4):
        # int8 [64, 64] + 64 fp32 scales + x and y fp32: 64 x 64 + 64 x 4 + b x (64 + 64) x 4
        assert q["int8", b].point.cost.bytes == 64 * 64 + 64 * 4 + b * 128 * 4 == \
            F.linear(b, 64, 64, weight_dtype="int8", act_dtype="fp32").bytes
        assert q["fp32", b].point.cost.bytes == 64 * 64 * 4 + b * 128 * 4
        assert q["int8", b].config["impl"] == "aten._weight_int8pack_mm"
        assert q["int8", b].config["weights"] == "int8 (per channel)"
    header = sweep.result_file.header
    assert header.settings["weight_dtypes"] == ["fp32", "int8"] and "--weight-dtype fp32,int8" in header.command
    titles = [s.title for s in analyze(sweep.result_file).steps]
    assert "Decode at batch 1, context 16 with int8 weights" in titles and "Decode at batch 1, context 16" in titles
    assert "w:int8" in sweep.table


def test_the_sweep_chart_draws_each_dtype_apart(sweep):
    from reports.style import new_figure
    from reports.sweep_plot import plot_intensity_sweep, style_note

    fig, ax = new_figure(6, 4)
    plot_intensity_sweep(ax, sweep.result_file, "decode", "batch", 16)
    gids = {ln.get_gid() for ln in ax.lines}
    assert {"intensity:q_proj:torch", "intensity:q_proj:torch:w-int8"} <= gids
    styles = {ln.get_gid(): ln.get_linestyle() for ln in ax.lines}
    assert styles["intensity:q_proj:torch"] != styles["intensity:q_proj:torch:w-int8"]
    assert style_note(sweep.result_file) == " Line styles: solid torch fp32, dashed torch w:int8."


def test_diagnose_quotes_the_effect_measured_in_the_sweep(sweep):
    found = {f.rule: f for f in diagnose([sweep.result_file])}
    f = found["weight-quantization-measured"]
    assert f.claim.startswith("Weight quantization measured in this file (weights fp32 -> int8): decode bytes 0.")
    assert [s["batch"] for s in f.data["steps"]] == [1, 4]
    assert all(0 < s["bytes_ratio"] < 0.5 for s in f.data["steps"])          # fp32 -> int8: under half the bytes


# ---------------------------------------------------------------- the measured effect, on recorded numbers

def _file(tmp_path, rows):
    """rows: (weight dtype, batch, flops, bytes, seconds) of one q_proj per decode step (2 layers)."""
    path = tmp_path / "w8.jsonl"
    with ResultWriter(path, RunHeader(device=DEV, model=TINY.to_dict(), dtype="bf16")) as w:
        for wd, b, fl, nb, t in rows:
            p = WorkloadPoint(model="tiny", op="q_proj", phase="decode", batch=b, new_tokens=1, context=512,
                              cost=Cost(fl, nb), weight_dtype=wd, compute_dtype="bf16")
            w.write(Measurement(point=p, times_s=(t, t, t), config={"impl": "x"} if wd != "bf16" else {}))
    return read_results(path)


def test_diagnose_says_what_int8_did_and_where_it_stopped_mattering(tmp_path):
    # batch 1: 2e6 B at 1e12 B/s = 2 us at the roof, measured 2.5 us (80%: weight-bound); int8 moves 1.06e6 B
    # (0.53x) in 1.525 us (0.61x). Batch 64: 2e9 FLOP / 4e6 B = 500 FLOP/B, compute-bound (20 us roof, 25 us);
    # int8: 2.84e6 B (0.71x), 22.5 us (0.90x): the bf16 step was not weight-bound there.
    rf = _file(tmp_path, [("bf16", 1, 2e6, 2e6, 2.5e-6), ("int8", 1, 2e6, 1.06e6, 1.525e-6),
                          ("bf16", 64, 2e9, 4e6, 2.5e-5), ("int8", 64, 2e9, 2.84e6, 2.25e-5)])
    found = {f.rule: f for f in diagnose([rf])}
    assert found["weight-quantization-measured"].claim == (
        "Weight quantization measured in this file (weights bf16 -> int8): decode bytes 0.53x, step time 0.61x at "
        "batch 1; at batch 64 bytes 0.71x, step time 0.90x: no longer weight-bound (context 512).")
    ev = found["weight-quantization-measured"].evidence
    assert "the roofline predicted step time 0.53x at b1, 1.00x at b64" in ev and "100% at b1, 0% at b64" in ev
    assert "dequant-bound" not in found          # 1.64x faster where the bytes promise 1.89x: realised 72%


def test_diagnose_warns_when_the_kernel_is_dequantization_bound(tmp_path):
    # int8 at batch 1 in 2.2 us: 1.14x faster where its bytes (1.06e6 of 2e6) promise 1.89x: 15% realised
    rf = _file(tmp_path, [("bf16", 1, 2e6, 2e6, 2.5e-6), ("int8", 1, 2e6, 1.06e6, 2.2e-6)])
    found = {f.rule: f for f in diagnose([rf])}
    d = found["dequant-bound"]
    assert d.claim.startswith("1 of 1 int8 decode linears run slower than their bytes predict: a "
                              "dequantization-bound kernel")
    assert "decode q_proj b1 c512: bytes 0.53x, time 0.88x (the bytes predict 1.89x faster)" in d.evidence
    assert "kernel: x" in d.evidence and "dequantizes in registers" in d.action


# ---------------------------------------------------------------- the compile check covers the new kernels

_SCRIPT = textwrap.dedent("""
    import json, torch
    from kernels import compile_check as C, variants as V
    out = {}
    combo = [("llama-3-8b", "decode", 1, 128, "bf16")]
    for tgt in ("sm_80", "sm_90"):
        t = V.TARGETS[tgt]
        vs = V.variants(t, V.record(t, combo))
        out[tgt] = sorted({(v.kernel, "*fp8e4nv" in v.signature.values(), v.config) for v in vs})
        # the two that spilled before their configs were fixed: fp8 decode attention (sm_90), int4 with zero
        # points on the lm_head's M = 1, no split-K (sm_80)
        pick = [v for v in vs if (tgt == "sm_90" and v.kernel == "_decode_split_kernel" and
                                  "*fp8e4nv" in v.signature.values()) or
                (tgt == "sm_80" and v.kernel == "_linear_int4_kernel" and "ZERO_POINT=True" in v.config and
                 "SPLIT_K=False" in v.config)]
        out[tgt + " rows"] = [C.evaluate(v, C.compile_task(v.task(), t.capability), t) for v in pick[:1]]
    print(json.dumps(out))
""")


def compile_script(script: str, tmp_path) -> dict:
    """Run a compile-check ``script`` for real NVIDIA targets (no interpreter, its own Triton cache) in a fresh
    process; the JSON it prints last."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this triton")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DUMP_PTXAS_LOG="1", TRITON_ALWAYS_COMPILE="1",
               PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_compile_check_discovers_and_compiles_the_quantized_kernels(tmp_path):
    out = compile_script(_SCRIPT, tmp_path)
    for tgt in ("sm_80", "sm_90"):
        kernels_seen = {k for k, _, _ in out[tgt]}
        assert {"_linear_int8_kernel", "_linear_int4_kernel", "_kv_append_kernel"} <= kernels_seen
        assert any(k == "_decode_split_kernel" and "KV_QUANT=True" in c for k, _, c in out[tgt])
        (row,) = out[tgt + " rows"]
        assert row["status"] == "ok" and row["spill_stores"] == 0 and row["spill_loads"] == 0, row
    fp8 = {tgt: any(f for _, f, _ in out[tgt]) for tgt in ("sm_80", "sm_90")}
    assert fp8 == {"sm_80": False, "sm_90": True}      # fp8 KV only where the target has it
