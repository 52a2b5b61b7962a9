"""Latent attention (DeepSeek's MLA) with quantized weights: what is quantized, the logits against the float model,
the two backends and the decode path, and the cost every MLA op records against the formulas.

kv_b_proj is read two ways (``kernels.quant.absorbed_kv_b``): prefill up-projects every key with the quantized
weight (a quantized linear's cost), absorbed decode reads W_UK / W_UV from a copy dequantized once at load into
the activation dtype (the decode "mla_up" cost: activation-dtype weight bytes, no scales).

Run: pytest tests/test_mla_quant.py   (about 15 s on 2 cores: interpreter steps of tiny-mla, one tiny CPU sweep)
"""

from dataclasses import replace

import pytest
import torch

import kernels  # noqa: F401  (the interpreter before triton)
from kernels.check import quality_notes
from kernels.model import LlamaModel
from kernels.quant import ABSORBED_KV_B, quantize_weight
from kernels.quant_weight import QuantExperts, QuantWeight
from kernels.runners import make_runners
from roofline import formulas as F
from roofline import workload as W
from roofline.cost import Cost
from roofline.errors import RooflineError
from roofline.models import PRESETS

# tiny-mla: H 64, 4 heads, q_lora_rank 32, kv_lora_rank R 32, rope P 8, nope N 16, v V 16; layer 0 dense
# (I 96), layer 1 routed (4 experts of 32, top-2, a shared expert of 32). Every in-feature is a multiple of 32.
MLA = PRESETS["tiny-mla"]
MLA_KEYS = {"wq_a", "wq_b", "wkv_a", "wkv_b", "wo"}
QUANTS = (("int8", {}), ("int4", dict(group_size=32)), ("int4", dict(group_size=32, zero_point=True)))
QIDS = ["int8", "int4-g32", "int4-g32-zp"]
FP32 = dict(dtype="fp32", max_len=32, max_slots=2)


def _rel(a, b) -> float:
    return float((a - b).abs().max()) / float(b.abs().max())


def _dequantized_twin(m: LlamaModel, **kw) -> LlamaModel:
    """A float model holding ``m``'s quantized weights dequantized (kv_b_proj's float weight only: no absorbed copy)."""
    deq = LlamaModel(MLA, **kw)
    for qd, fd in zip(m.w["layers"], deq.w["layers"]):
        fd.update({k: v.dequantize(torch.float32) for k, v in qd.items() if isinstance(v, (QuantWeight, QuantExperts))})
    deq.w["lm_head"] = m.w["lm_head"].dequantize(torch.float32)
    return deq


# ---------------------------------------------------------------- what is quantized

@pytest.mark.parametrize("dtype,kw", QUANTS, ids=QIDS)
def test_the_model_quantizes_the_latent_projections_and_decode_reads_a_dequantized_kv_b(dtype, kw):
    """q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj are QuantWeights (what the workload charges in
    the weight dtype); the norms stay fp32; absorbed decode's kv_b_proj is the quantized one dequantized, in fp32.
    Prefill and decode logits equal a float model's holding the dequantized weights (1e-5 of the largest)."""
    m = LlamaModel(MLA, backend="torch", weight_dtype=dtype, **kw, **FP32)
    for lw in m.w["layers"]:
        assert MLA_KEYS <= {k for k, v in lw.items() if isinstance(v, QuantWeight)}
        assert all(lw[k].dtype == dtype for k in MLA_KEYS)
        assert lw["q_a_norm"].dtype == lw["kv_a_norm"].dtype == torch.float32
        absorbed = lw[ABSORBED_KV_B]                        # [R, H * (N + V)] = [32, 4 x 32]
        assert absorbed.shape == (32, 128) and absorbed.dtype == torch.float32
        assert torch.equal(absorbed, lw["wkv_b"].dequantize(torch.float32))
    assert m.w["layers"][0]["wkv_b"].torch_impl == ("aten._weight_int8pack_mm" if dtype == "int8"
                                                    else "aten._weight_int4pack_mm_for_cpu")
    deq = _dequantized_twin(m, backend="torch", **FP32)
    toks = torch.randint(0, MLA.vocab, (1, 12), generator=torch.Generator().manual_seed(3))
    a, b = m.forward_full(toks), deq.forward_full(toks)
    assert _rel(a, b) <= 1e-5
    steps = [(mm.prefill(toks[0, :10], 0), mm.decode_step(toks[0, 10:11], torch.tensor([0]))[0]) for mm in (m, deq)]
    for x, y in zip(*steps):                                # the naive prefill, then one absorbed decode step
        assert _rel(x, y) <= 1e-5


def test_int4_group_that_does_not_divide_the_latent_rank_is_refused_naming_kv_b_proj():
    """kv_b_proj's in-features are the latent rank: a group that does not divide it is a one-line refusal."""
    cfg = replace(MLA, name="tiny-mla-r48", kv_lora_rank=48)
    for build in (lambda: LlamaModel(cfg, backend="torch", weight_dtype="int4", group_size=32, **FP32),
                  lambda: make_runners(cfg, "decode", 1, 8, dtype="fp32", weight_dtype="int4", group_size=32)):
        with pytest.raises(RooflineError) as e:
            build()
        msg = str(e.value)
        assert "int4 group size 32 does not divide tiny-mla-r48's kv_b_proj in-features (48)" in msg
        assert "use int8 weights" in msg and "\n" not in msg


def test_an_8bit_latent_cache_stays_refused_in_one_line():
    for build in (lambda: LlamaModel(MLA, backend="torch", weight_dtype="int8", kv_dtype="int8", **FP32),
                  lambda: make_runners(MLA, "decode", 1, 8, dtype="fp32", weight_dtype="int8", kv_dtype="int8")):
        with pytest.raises(RooflineError, match="8-bit KV cache is not implemented for a latent cache") as e:
            build()
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------- accuracy

def test_int8_mla_logits_stay_within_the_dense_int8_bound():
    """tests/test_quant_runs.py's bound: max |logit difference| under 5% of the largest logit, top-1 agreement on at
    least 90% of 32 tokens; tiny-mla with every linear, kv_b_proj, the experts and lm_head int8 (measured 1.8%,
    31/32)."""
    (w,) = quality_notes("fp32", "cpu", model="tiny-mla", tokens=32,
                         cases=(("int8 weights", dict(weight_dtype="int8")),))
    assert 0 < w.max_abs_diff <= 0.05 * w.logit_scale and w.top1 >= 0.9 * w.tokens


@pytest.mark.parametrize("zp", [False, True], ids=["g32", "g32-zp"])
def test_int4_latent_attention_moves_logits_within_the_moe_int4_bound(zp):
    """tests/test_moe_quant.py's int4 bound, 35% of the largest logit (random weights, g32): latent attention's five
    projections quantized alone (the rest float) move tiny-mla by 20% (zero points: 13%). The whole int4 model
    (g32) moves it 31%; with zero points 59%, set by the routed experts (they alone: 63%, DeepSeek's sigmoid-group
    routing flips experts), not by the attention: the whole model is only bounded by its dequantized twin above."""
    toks = torch.randint(0, MLA.vocab, (1, 32), generator=torch.Generator().manual_seed(5))
    kw = dict(dtype="fp32", backend="torch", max_len=32, max_slots=1)
    ref = LlamaModel(MLA, **kw).forward_full(toks)
    att = LlamaModel(MLA, **kw)
    for lw in att.w["layers"]:
        lw.update({k: quantize_weight(lw[k], "int4", group_size=32, zero_point=zp).dequantize(torch.float32)
                   for k in MLA_KEYS})
    a = att.forward_full(toks)
    assert 0 < _rel(a, ref) <= 0.35
    assert int((a.argmax(-1) == ref.argmax(-1)).sum()) >= 0.7 * 32          # measured 28/32 (zero points 24/32)
    if not zp:
        q = LlamaModel(MLA, **kw, weight_dtype="int4", group_size=32).forward_full(toks)
        assert 0 < _rel(q, ref) <= 0.35


@pytest.mark.parametrize("dtype,kw", [QUANTS[0], QUANTS[2]], ids=["int8", "int4-g32-zp"])
def test_quantized_mla_backends_agree_and_decode_equals_a_full_forward(dtype, kw):
    """Triton (interpreter) and torch on the same quantized weights: full forwards within 1e-4; two slots of
    different lengths prefilled, then one batched absorbed decode step, equal each prompt's full forward."""
    mk = dict(seed=7, weight_dtype=dtype, **kw, **FP32)
    tri, tor = LlamaModel(MLA, backend="triton", **mk), LlamaModel(MLA, backend="torch", **mk)
    toks = torch.randint(0, MLA.vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    fulls = [tor.forward_full(toks[i:i + 1, :n]) for i, n in ((0, 6), (1, 4))]
    assert _rel(tri.forward_full(toks[:1, :6]), fulls[0]) <= 1e-4
    for m in (tri, tor):
        assert _rel(m.prefill(toks[0, :5], 0), fulls[0][4]) <= 1e-4
        assert _rel(m.prefill(toks[1, :3], 1), fulls[1][2]) <= 1e-4
        d = m.decode_step(torch.stack([toks[0, 5], toks[1, 3]]), torch.tensor([0, 1]))    # lengths 6 and 4
        assert _rel(d[0], fulls[0][5]) <= 1e-4 and _rel(d[1], fulls[1][3]) <= 1e-4
    assert tri.quant_label == ("int8 weights" if dtype == "int8" else "int4 weights (g32, zero points)")


# ---------------------------------------------------------------- costs

def _want(op: str, phase: str, batch: int, ctx: int, wd: str, kw: dict) -> Cost:
    """The cost of one MLA op by formula, fp32 activations (4 B), R 32, H 4, N 16, V 16, q_lora_rank 32."""
    T = batch * (ctx if phase == "prefill" else 1)
    q = dict(weight_dtype=wd, act_dtype="fp32", **kw)
    shapes = {"q_a_proj": (64, 32), "q_b_proj": (32, 4 * (16 + 8)), "kv_a_proj": (64, 32 + 8), "o_proj": (4 * 16, 64)}
    if op in shapes:
        return F.linear(T, *shapes[op], **q)
    assert op == "kv_b_proj"
    if phase == "prefill":                      # every key (batch x ctx rows) up-projected by the quantized weight
        return F.linear(batch * ctx, 32, 4 * (16 + 16), **q)
    # decode, absorbed: 2 x T x H x R x (N + V) FLOPs; W_UK / W_UV read in fp32 (dequantized at load, no scales)
    # + q_nope, q_latent, o_latent, o: T x H x (N + R + R + V) x 4 B
    return Cost(2 * T * 4 * 32 * 32, 32 * 128 * 4 + T * 4 * (16 + 32 + 32 + 16) * 4)


def test_the_formulas_worked_by_hand():
    # prefill, batch 2, 8 tokens: kv_b_proj on 16 rows, K 32, N 128: 2 x 16 x 32 x 128 = 131,072 FLOPs
    # int8: 32 x 128 + 128 scales x 4 B + x 16 x 32 x 4 + y 16 x 128 x 4 = 4,096 + 512 + 2,048 + 8,192 = 14,848 B
    assert _want("kv_b_proj", "prefill", 2, 8, "int8", {}) == Cost(131_072, 14_848)
    # int4 g32 zero points: 32 x 128 / 2 + 1 group x 128 x (scale + zero) x 4 B + 2,048 + 8,192 = 13,312 B
    assert _want("kv_b_proj", "prefill", 2, 8, "int4", dict(group_size=32, zero_point=True)) == Cost(131_072, 13_312)
    # decode, batch 2: 2 x 2 x 4 x 32 x 32 = 16,384 FLOPs; 32 x 128 x 4 + 2 x 4 x 96 x 4 = 16,384 + 3,072 = 19,456 B,
    # whatever the weight dtype
    assert _want("kv_b_proj", "decode", 2, 8, "int4", dict(group_size=32)) == Cost(16_384, 19_456)
    # q_a_proj int8, 2 decode rows: 2 x 2 x 64 x 32 = 8,192 FLOPs; 64 x 32 + 32 x 4 + 2 x 64 x 4 + 2 x 32 x 4 B
    assert _want("q_a_proj", "decode", 2, 8, "int8", {}) == Cost(8_192, 2_048 + 128 + 512 + 256)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("dtype,kw", [QUANTS[0], QUANTS[2]], ids=["int8", "int4-g32-zp"])
def test_runner_costs_of_every_mla_op_are_the_formulas(phase, dtype, kw):
    """Each MLA op's runner carries the cost model's cost, which is the formula (``_want``): the projections as
    quantized linears, kv_b_proj quantized in prefill and in fp32 (dequantized at load) in decode. The weightless
    ops (norms, rope, the latent append, the attention) cost what they cost with fp32 weights. Both backends run
    every op; the runner's config says what kv_b_proj read."""
    batch, ctx = 2, 8
    weighted = ("q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj")
    other = ("q_a_norm", "kv_a_norm", "rope", "kv_append", "attention")
    ph = (W.prefill if phase == "prefill" else W.decode)(MLA, batch, ctx, weight_dtype=dtype, act_dtype="fp32",
                                                         kv_dtype="fp32", **kw)
    for backend in ("torch", "triton"):
        rs = {r.name: r for r in make_runners(MLA, phase, batch, ctx, dtype="fp32", backend=backend,
                                              weight_dtype=dtype, ops=list(weighted + other), **kw)}
        fl = {r.name: r for r in make_runners(MLA, phase, batch, ctx, dtype="fp32", backend=backend,
                                              ops=list(other))}
        for name in weighted:
            assert rs[name].cost == ph.op(name).cost == _want(name, phase, batch, ctx, dtype, kw), name
        for name in other:
            assert rs[name].cost == fl[name].cost == ph.op(name).cost, name
        label = "int8 (per channel)" if dtype == "int8" else "int4 (g32, zero points)"
        for name in ("q_a_proj", "q_b_proj", "kv_a_proj", "o_proj"):
            assert rs[name].config["weights"] == label
        kvb = rs["kv_b_proj"].config["weights"]
        assert kvb == (label if phase == "prefill" else f"{dtype} kv_b_proj dequantized at load (fp32)")
        T = batch * (ctx if phase == "prefill" else 1)
        outs = {name: r.fn() for name, r in rs.items()}
        for name, n_out in (("q_a_proj", 32), ("q_b_proj", 96), ("kv_a_proj", 40), ("o_proj", 64)):
            assert outs[name].shape == (T, n_out) and torch.isfinite(outs[name]).all()
        up = outs["kv_b_proj"]                      # prefill: [B x S, H x (N + V)]; decode: o [T, H, V]
        assert up.shape == ((batch * ctx, 128) if phase == "prefill" else (T, 4, 16)) and torch.isfinite(up).all()


@pytest.mark.parametrize("dtype,kw", [QUANTS[0], QUANTS[2]], ids=["int8", "int4-g32-zp"])
def test_the_step_reads_kv_b_proj_as_stored_in_prefill_and_in_the_activation_dtype_in_decode(dtype, kw):
    """Phase.weight_bytes: every other weight is read the same in both phases, so (experts aside) prefill minus
    decode is 2 layers x (kv_b_proj quantized - its fp32 copy): int8 2 x (4,096 + 512 - 16,384) = -23,552 B."""
    q = dict(weight_dtype=dtype, act_dtype="fp32", kv_dtype="fp32", **kw)
    pre, dec = W.prefill(MLA, 1, 8, **q), W.decode(MLA, 1, 8, **q)
    assert pre.chunks == (8,)
    diff = (pre.weight_bytes - pre.expert_weight_bytes) - (dec.weight_bytes - dec.expert_weight_bytes)
    assert diff == 2 * (F.quantized_weight_bytes(32, 128, weight_dtype=dtype, act_dtype="fp32", **kw) - 32 * 128 * 4)
    if dtype == "int8":
        assert diff == -23_552


# ---------------------------------------------------------------- the result file

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from profiler.run_spec import RunSpec, default_plan
    from profiler.run import run_profile
    from roofline.devices import Device

    plan, _ = default_plan(model="tiny-mla", phases=("prefill", "decode"), batches=(2,), contexts=(8,),
                           backends=("torch",), dtype="fp32", device="cpu", budget_ms=2,
                           weight_dtypes=("fp32", "int4"), group_size=32, zero_point=True)
    dev = Device(key="cpu", name="cpu", kind="cpu", peak_flops={"fp32": 1e11}, bandwidth=2e10, source="measured")
    return run_profile(RunSpec(plan, out=tmp_path_factory.mktemp("mla-quant-sweep"), mode="overwrite",
                                  report=False, check_kernels=False, flop_check=False, device=dev))


def test_sweep_records_every_mla_op_at_the_formula_cost(sweep):
    """`roofline profile --model tiny-mla --weight-dtype fp32,int4 --group-size 32 --zero-point`: every op ran, and
    the result file's MLA ops carry the formulas' bytes and FLOPs at both phases, fp32 and int4 (the fp32 ones are
    the same formulas with fp32 weights); int4 reads fewer bytes at the same FLOPs, except decode's kv_b_proj (its
    fp32 copy: the same bytes)."""
    ms = sweep.result_file.measurements
    assert ms and all(m.ok for m in ms)
    got = {(m.point.phase, m.point.op, m.point.weight_dtype): m for m in ms}
    zp = dict(group_size=32, zero_point=True)
    for phase in ("prefill", "decode"):
        for op in ("q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj"):
            q, f = got[phase, op, "int4"], got[phase, op, "fp32"]
            assert q.point.cost == _want(op, phase, 2, 8, "int4", zp), (phase, op)
            assert f.point.cost == _want(op, phase, 2, 8, "fp32", {}), (phase, op)
            assert q.point.cost.flops == f.point.cost.flops
            if phase == "decode" and op == "kv_b_proj":
                assert q.point.cost.bytes == f.point.cost.bytes == 19_456
                assert q.config["weights"] == "int4 kv_b_proj dequantized at load (fp32)"
            else:
                assert q.point.cost.bytes < f.point.cost.bytes
                assert q.config["weights"] == "int4 (g32, zero points)"
        assert got[phase, "attention", "int4"].point.cost == got[phase, "attention", "fp32"].point.cost
    # prefill's kv_b_proj, fp32: 131,072 FLOPs; 32 x 128 x 4 + 16 x 32 x 4 + 16 x 128 x 4 = 16,384 + 2,048 + 8,192 B
    assert got["prefill", "kv_b_proj", "fp32"].point.cost == Cost(131_072, 26_624)


@pytest.mark.parametrize("dtype,kw", [QUANTS[0], QUANTS[2]], ids=["int8", "int4-g32-zp"])
def test_the_memory_estimate_counts_what_the_quantized_model_holds(dtype, kw):
    """capacity.weight_bytes = the bytes of every tensor the quantized model holds: kv_b_proj twice (quantized for
    prefill, fp32 for decode). int8: 2 layers x (4,096 + 128 x 4) more than with kv_b_proj in fp32 only."""
    from roofline.capacity import weight_bytes

    m = LlamaModel(MLA, backend="triton", weight_dtype=dtype, **kw, **FP32)

    def held(v):
        if isinstance(v, (QuantWeight, QuantExperts)):
            return sum(t.numel() * t.element_size() for t in (v.qweight, v.scales, v.zeros) if t is not None)
        return v.numel() * v.element_size()
    total = sum(held(v) for lw in m.w["layers"] for v in lw.values())
    total += held(m.w["embed"]) + held(m.w["final_norm"]) + held(m.w["lm_head"])
    assert weight_bytes(MLA, weight_dtype=dtype, act_dtype="fp32", **kw) == total
    if dtype == "int8":
        assert total - weight_bytes(MLA, weight_dtype="fp32", act_dtype="fp32") < 0
        assert sum(held(lw[k]) for lw in m.w["layers"] for k in ("wkv_b", ABSORBED_KV_B)) == 2 * (4_096 + 512 + 16_384)
