"""Quantized expert weights run: the fused MoE kernels with int8 / int4 experts against the torch path, the cost a
sweep records against the formula, the model's logits against the float model, and the compile check's variants.

Run: pytest tests/test_moe_quant.py   (about 40 s on 2 cores: interpreter launches on tiny grids, one tiny CPU
sweep, two real compilations)
"""

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import kernels  # noqa: F401  (the interpreter before triton)
from kernels import moe as M
from kernels.check import quality_notes
from kernels.model import LlamaModel
from kernels.quant import quantize_experts, quantize_weight
from kernels.quant_weight import QuantExperts, QuantWeight
from kernels.runners import make_runners
from roofline import formulas as F
from roofline.errors import RooflineError
from roofline.models import PRESETS

ROOT = Path(__file__).resolve().parent.parent
TINY_MOE = PRESETS["tiny-moe"]                                   # H 64, experts' I 48, E 8, top-2, 2 layers
MOE64 = replace(TINY_MOE, name="tiny-moe-64", moe_intermediate=64)   # every in-feature a multiple of 32 (int4)
# int8 and int4 (group 32, with and without zero points): the dense linears' three ways
QUANTS = (("int8", {}), ("int4", dict(group_size=32)), ("int4", dict(group_size=32, zero_point=True)))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def _case(gen, T, E, k, H, I, *, bias=False, dt=torch.float32):  # noqa: E741
    """Random float experts [E, H, I] / [E, I, H] (std 1/sqrt(in)), x [T, H], a routing with expert 0 overloaded."""
    r = lambda *s, std=1.0: (torch.randn(*s, generator=gen) * std).to(dt)  # noqa: E731
    w = (r(E, H, I, std=H ** -0.5), r(E, H, I, std=H ** -0.5), r(E, I, H, std=I ** -0.5))
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    for t in range(T // 2):                                     # half the tokens: expert 0 first, then k-1 others
        ids[t] = torch.cat([torch.zeros(1, dtype=ids.dtype), torch.randperm(E - 1, generator=gen)[: k - 1] + 1])
    weights = torch.softmax(torch.randn(T, k, generator=gen), -1)
    bb = dict(b_gate=r(E, I, std=0.1), b_up=r(E, I, std=0.1), b_down=r(E, H, std=0.1)) if bias else {}
    return r(T, H), w, weights, ids, bb


def _err(y, ref):
    return float((y.double() - ref.double()).abs().max() / ref.double().abs().max()) if torch.isfinite(y).all() \
        else float("inf")


# ---------------------------------------------------------------- the container

def test_quantized_experts_are_the_dense_quantization_expert_by_expert(gen):
    _, (wg, _, _), *_ = _case(gen, 1, 3, 2, 64, 96)
    for dtype, kw in QUANTS:
        qe = quantize_experts(wg, dtype, **kw)
        assert isinstance(qe, QuantExperts) and qe.shape == (3, 64, 96) and qe.n_experts == 3
        # int8: q [E, N, K] + a scale per output channel [E, N]; int4: two per byte [E, N, K/2] + [E, K/32, N]
        assert qe.qweight.shape == ((3, 96, 64) if dtype == "int8" else (3, 96, 32))
        assert qe.scales.shape == ((3, 96) if dtype == "int8" else (3, 2, 96))
        assert (qe.zeros is not None) == kw.get("zero_point", False)
        for e in range(3):
            one = quantize_weight(wg[e], dtype, **kw)
            view = qe.expert(e)
            assert isinstance(view, QuantWeight) and view.qweight.data_ptr() == qe.qweight[e].data_ptr()
            assert torch.equal(view.qweight, one.qweight) and torch.equal(view.scales, one.scales)
        assert torch.equal(qe.dequantize(torch.float64)[2], quantize_weight(wg[2], dtype, **kw).dequantize(
            torch.float64))


# ---------------------------------------------------------------- the kernels against the torch path

@pytest.mark.parametrize("dtype,kw", QUANTS, ids=["int8", "int4-g32", "int4-g32-zp"])
@pytest.mark.parametrize("T,act,bias", [(7, "silu", False), (5, "swiglu_oai", True), (40, "silu", True)])
def test_triton_quantized_experts_equal_the_torch_path(dtype, kw, T, act, bias, gen):
    """fp32 under the interpreter: the fused kernels (skinny at T 5 and 7, tiled at T 40: 80 rows > 16 x 4) against
    torch_moe (aten's int8 / int4 GEMM per expert) to 1e-5, and against the fp64 dequantize reference. H 64 and I 96
    are not multiples of BLOCK_N = 64; expert 0 takes half the tokens, one expert may get none."""
    x, w, weights, ids, bb = _case(gen, T, 4, 2, 64, 96, bias=bias)
    q = [quantize_experts(t, dtype, **kw) for t in w]
    out = torch.full((T, 64), float("nan"))
    y = M.moe_experts(x, *q, weights, ids, activation=act, out=out, **bb)
    assert y is out
    ref = M.torch_moe(x, *q, weights, ids, activation=act, **bb)
    assert q[0].torch_impl.startswith("aten._weight_int")       # the ecosystem op, not its dequantize fallback
    assert _err(y, ref) < 1e-5
    assert _err(y, M.reference(x, *q, weights, ids, activation=act, compute_dtype=torch.float64, **bb)) < 1e-5
    c = M.moe_config(T, 4, 2, 64, 96, torch.float32, group_size=kw.get("group_size", 0))
    assert c["kind"] == ("skinny" if T * 2 <= 16 * 4 else "tiled")


def test_int4_tiles_stay_in_one_group_and_small_blocks_agree(gen):
    # a K tile inside one group: BLOCK_K 64 (fp32 skinny takes 32) capped at g 32; tiled int4 takes at most 32
    assert M.moe_config(1, 8, 2, 4096, 14336, torch.bfloat16, group_size=32)["block_k"] == 32
    assert M.moe_config(1, 8, 2, 4096, 14336, torch.bfloat16, group_size=128)["block_k"] == 64
    assert M.moe_config(512, 8, 2, 4096, 14336, torch.bfloat16, group_size=128)["block_k"] == M.INT4_TILED_BLOCK_K
    with pytest.raises(ValueError, match=r"block_k \(64\) must divide the int4 group size \(32\)"):
        M.moe_config(1, 8, 2, 64, 64, group_size=32, block_k=64)
    x, w, weights, ids, _ = _case(gen, 9, 6, 2, 64, 64)
    q = [quantize_experts(t, "int4", group_size=32, zero_point=True) for t in w]
    y = M.moe_experts(x, *q, weights, ids, block_m=16, block_n=16, block_k=16)
    assert _err(y, M.torch_moe(x, *q, weights, ids)) < 1e-5


def test_bf16_activations_upcast_and_stay_close(gen):
    """bf16 x and scales (the interpreter upcasts every load): within bf16 rounding of the torch path."""
    x, w, weights, ids, bb = _case(gen, 6, 4, 2, 64, 64, bias=True, dt=torch.bfloat16)
    q = [quantize_experts(t, "int8") for t in w]
    assert q[0].scales.dtype == torch.bfloat16
    y = M.moe_experts(x, *q, weights, ids, activation="swiglu_oai", **bb)
    assert y.dtype == torch.bfloat16
    ref = M.reference(x, *q, weights, ids, activation="swiglu_oai", compute_dtype=torch.float64, **bb)
    assert _err(y, ref) < 1.6e-2


def test_quantized_experts_refusals(gen):
    x, w, weights, ids, _ = _case(gen, 3, 4, 2, 64, 64)
    q8 = [quantize_experts(t, "int8") for t in w]
    with pytest.raises(ValueError, match="w_up is a Tensor but another expert weight is quantized"):
        M.moe_experts(x, q8[0], w[1], q8[2], weights, ids)
    q4 = quantize_experts(w[1], "int4", group_size=32)
    with pytest.raises(ValueError, match="quantized alike"):
        M.moe_experts(x, q8[0], q4, q8[2], weights, ids)
    with pytest.raises(ValueError, match=r"w_down must hold \[E, K, N\] = \[4, 64, 64\]"):
        M.moe_experts(x, q8[0], q8[1], quantize_experts(w[2][:, :, :32], "int8"), weights, ids)
    with pytest.raises(ValueError, match="x must have dtype torch.float32"):
        M.moe_experts(x.double(), *q8, weights, ids)


# ---------------------------------------------------------------- the model and the runners

def test_the_model_quantizes_routed_and_shared_experts_not_the_router():
    """What the workload charges in the weight dtype is what is quantized: every linear (the shared expert's too)
    and the routed experts; the router and the shared expert's gate stay fp32. The int4 model's logits equal a
    float model's holding the dequantized weights (so nothing else changed), 1e-5 of the largest logit."""
    cfg = replace(MOE64, name="tiny-qwen2-moe", arch="qwen2_moe", shared_intermediate=32, shared_gate=True)
    m = LlamaModel(cfg, dtype="fp32", backend="torch", weight_dtype="int4", group_size=32, max_len=16)
    lw = m.w["layers"][0]
    assert {k for k, v in lw.items() if isinstance(v, QuantWeight)} == {"wq", "wk", "wv", "wo", "ws_gate", "ws_up",
                                                                        "ws_down"}
    assert {k for k, v in lw.items() if isinstance(v, QuantExperts)} == {"experts_gate", "experts_up",
                                                                         "experts_down"}
    assert lw["router"].dtype == torch.float32 and lw["ws_gate_vec"].dtype == torch.float32
    assert lw["experts_down"].expert(0).torch_impl == "aten._weight_int4pack_mm_for_cpu"   # prepared at build
    deq = LlamaModel(cfg, dtype="fp32", backend="torch", max_len=16)
    for qd, fd in zip(m.w["layers"], deq.w["layers"]):
        fd.update({k: v.dequantize(torch.float32) for k, v in qd.items() if isinstance(v, (QuantWeight, QuantExperts))})
    deq.w["lm_head"] = m.w["lm_head"].dequantize(torch.float32)
    toks = torch.randint(0, cfg.vocab, (1, 12), generator=torch.Generator().manual_seed(3))
    a, b = m.forward_full(toks), deq.forward_full(toks)
    assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())


def test_int8_moe_logits_stay_close_to_full_precision():
    """The dense int8 test's bound (tests/test_quant_runs.py: max |logit difference| under 5% of the largest logit,
    top-1 agreement on at least 90% of 32 tokens) holds for tiny-moe with int8 attention, lm_head and experts
    (measured 1.1%, 31/32). int4 has no dense bound; g32 on random weights moves tiny-192 (dense) by 27% and its
    MoE twin by 20% (zero points: 15% and 28%): bounded at 35% here, the dense model's order."""
    (w,) = quality_notes("fp32", "cpu", model="tiny-moe", tokens=32, cases=(("int8 weights", dict(weight_dtype="int8")),))
    assert 0 < w.max_abs_diff <= 0.05 * w.logit_scale and w.top1 >= 0.9 * w.tokens
    toks = torch.randint(0, MOE64.vocab, (1, 32), generator=torch.Generator().manual_seed(5))
    kw = dict(dtype="fp32", backend="torch", max_len=32, max_slots=1)
    ref = LlamaModel(MOE64, **kw).forward_full(toks)
    for zp in (False, True):
        q = LlamaModel(MOE64, **kw, weight_dtype="int4", group_size=32, zero_point=zp).forward_full(toks)
        assert 0 < float((q - ref).abs().max()) <= 0.35 * float(ref.abs().max()), zp


def test_quantized_moe_backends_agree_and_decode_equals_a_full_forward():
    kw = dict(dtype="fp32", seed=7, max_slots=2, max_len=16, weight_dtype="int8")
    toks = torch.randint(0, TINY_MOE.vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    tri, tor = LlamaModel(TINY_MOE, backend="triton", **kw), LlamaModel(TINY_MOE, backend="torch", **kw)
    full = tor.forward_full(toks)
    assert (tri.forward_full(toks) - full).abs().max() <= 1e-4 * full.abs().max()
    out = [tri.prefill(toks[0, :5], 0), tri.decode_step(toks[0, 5][None], torch.tensor([0]))[0]]
    assert (torch.stack(out) - full[4:6]).abs().max() <= 1e-4 * full.abs().max()
    assert tri.quant_label == "int8 weights"


def test_int4_refusals_name_the_experts():
    with pytest.raises(RooflineError) as e:                        # tiny-moe's experts: I = 48, no group divides it
        LlamaModel(TINY_MOE, dtype="fp32", backend="torch", weight_dtype="int4", group_size=32)
    msg = str(e.value)
    assert "int4 group size 32 does not divide tiny-moe's experts down_proj in-features (48)" in msg
    assert "use int8 weights" in msg and "\n" not in msg   # latent attention's quantized weights: test_mla_quant.py
    with pytest.raises(RooflineError) as e:      # group 128 stops at q_proj (64) first: the hint names the experts
        LlamaModel(TINY_MOE, dtype="fp32", backend="torch", weight_dtype="int4", group_size=128)
    assert "(none divides experts down_proj's 48 in-features): use int8 weights" in str(e.value)


@pytest.mark.parametrize("phase,batch,context,wd,kw", [("decode", 2, 8, "int8", {}),
                                                       ("prefill", 1, 8, "int4", dict(group_size=32, zero_point=True))])
def test_runner_cost_is_the_quantized_expert_formula(phase, batch, context, wd, kw):
    """The experts op's cost is formulas.moe_experts with the weight dtype and its scales; the runner runs it."""
    cfg = MOE64
    T = batch * (context if phase == "prefill" else 1)
    distinct = F.expected_distinct_experts(8, 2, T)
    want = F.moe_experts(T, 64, 64, 8, 2, distinct=distinct, weight_dtype=wd, act_dtype="fp32", **kw)
    one = F.moe_expert_weight_bytes(64, 64, weight_dtype=wd, act_dtype="fp32", **kw)
    if wd == "int8":   # 3 x (64 x 64 int8 + 64 fp32 scales) = 3 x (4,096 + 256) = 13,056 per expert
        assert one == 3 * (64 * 64 + 64 * 4) == 13_056
    else:              # 3 x (64 x 64 / 2 + 2 groups x 64 x (scale + zero) x 4 B) = 3 x (2,048 + 1,024) = 9,216
        assert one == 3 * (64 * 64 // 2 + 2 * 64 * 2 * 4) == 9_216
    # + x and y T x 64 x 4 B each, h and the partials 2 x T x 2 x 64 x 4 B each, routing 12 x T x 2
    assert want.bytes == distinct * one + 2 * T * 64 * 4 + 2 * (2 * T * 64 * 4) * 2 + 12 * T * 2
    for backend in ("torch", "triton"):
        (r,) = make_runners(cfg, phase, batch, context, dtype="fp32", backend=backend, weight_dtype=wd,
                            ops=["experts"], **kw)
        assert r.cost == want == M.cost(T, 64, 64, 8, 2, "fp32", distinct=distinct, weight_dtype=wd, **kw)
        assert r.config["weights"] == ("int8 (per channel)" if wd == "int8" else "int4 (g32, zero points)")
        y = r.fn()
        assert y.shape == (T, 64) and torch.isfinite(y).all()
    assert r.config["backend"] == "triton" and "impl" not in r.config


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from profiler.run import RunSpec, default_plan, run_profile
    from roofline.devices import Device

    plan, _ = default_plan(model="tiny-moe", phases=("decode",), batches=(1, 4), contexts=(8,), backends=("torch",),
                           dtype="fp32", device="cpu", budget_ms=2, weight_dtypes=("fp32", "int8"))
    dev = Device(key="cpu", name="cpu", kind="cpu", peak_flops={"fp32": 1e11}, bandwidth=2e10, source="measured")
    return run_profile(RunSpec(plan, out=tmp_path_factory.mktemp("moe-quant-sweep"), mode="overwrite",
                                  report=False, check_kernels=False, flop_check=False, device=dev))


def test_sweep_records_the_quantized_expert_cost_of_the_formula(sweep):
    """The result file's experts op: bytes and FLOPs equal formulas.moe_experts with int8 weights and fp32 scales
    (the workload's expected distinct experts), int8 experts read fewer bytes than fp32 ones at the same FLOPs."""
    ms = [m for m in sweep.result_file.measurements if m.ok and m.point.op == "experts"]
    got = {(m.point.weight_dtype, m.point.batch): m for m in ms}
    assert set(got) == {("fp32", 1), ("fp32", 4), ("int8", 1), ("int8", 4)}
    for b in (1, 4):
        d = F.expected_distinct_experts(8, 2, b)
        q, f = got["int8", b], got["fp32", b]
        want = F.moe_experts(b, 64, 48, 8, 2, distinct=d, weight_dtype="int8", act_dtype="fp32")
        assert (q.point.cost.flops, q.point.cost.bytes) == (want.flops, want.bytes)
        # int8: 3 x (64 x 48 + 48 x 4) ... per expert: gate/up 3,072 + 48 x 4, down 3,072 + 64 x 4
        assert F.moe_expert_weight_bytes(64, 48, weight_dtype="int8", act_dtype="fp32") == \
            2 * (64 * 48 + 48 * 4) + (48 * 64 + 64 * 4) == 9_856
        assert f.point.cost.bytes - q.point.cost.bytes == d * (3 * 64 * 48 * 4 - 9_856)
        assert q.point.cost.flops == f.point.cost.flops
        assert q.config["weights"] == "int8 (per channel)"
        assert q.config["impl"] == "per expert: aten._weight_int8pack_mm"
    assert sweep.result_file.header.settings["weight_dtypes"] == ["fp32", "int8"]


# ---------------------------------------------------------------- the compile check

_SCRIPT = textwrap.dedent("""
    import json, torch
    from kernels import compile_check as C, compile_launches as CL, variants as V
    from kernels._launch import recording
    out = {}
    for tgt in ("sm_80", "sm_90"):
        t = V.TARGETS[tgt]
        with recording(t.sms) as rec:       # Mixtral / GPT-OSS experts at prefill 1 x 128 (tiled), decode 1 (skinny)
            for ph, c in (("prefill", 128), ("decode", 128)):
                CL.moe_launches(rec, dict(model="x", phase=ph, b=1, ctx=c, dtype="bf16"), ph, 1, c, torch.bfloat16)
        vs = V.variants(t, rec.launches)
        out[tgt] = sorted({(v.kernel, v.config) for v in vs})
        # the one that spilled before INT4_TILED_BLOCK_K: Mixtral's int4 g128 tiled gate_up (sm_80)
        pick = [v for v in vs if v.kernel == "_moe_gate_up_kernel" and "QUANT=2 GROUP=128" in v.config
                and "BLOCK_M=64" in v.config]
        out[tgt + " rows"] = [C.evaluate(v, C.compile_task(v.task(), t.capability), t) for v in pick[:1]]
    print(json.dumps(out))
""")


def test_compile_check_compiles_the_quantized_expert_kernels(tmp_path):
    from tests.test_quant_runs import compile_script

    out = compile_script(_SCRIPT, tmp_path)
    for tgt in ("sm_80", "sm_90"):
        configs = [c for k, c in out[tgt]]
        for code, zp in (("QUANT=1 GROUP=0 ZERO_POINT=False", False), ("QUANT=2 GROUP=128 ZERO_POINT=False", False),
                         ("QUANT=2 GROUP=32 ZERO_POINT=False", False), ("QUANT=2 GROUP=64 ZERO_POINT=True", True)):
            assert {k for k, c in out[tgt] if code in c} == {"_moe_gate_up_kernel", "_moe_down_kernel"}, code
        assert any("QUANT=0" in c for c in configs)                         # the float twins beside them
        (row,) = out[tgt + " rows"]
        assert "BLOCK_K=32" in row["config"]                                # INT4_TILED_BLOCK_K
        assert row["status"] == "ok" and row["spill_stores"] == 0 and row["spill_loads"] == 0, row
