"""Mixtures of experts and latent attention under --tp, run on this CPU: two gloo ranks on 127.0.0.1.

Every rank holds every expert with its intermediate dimension split (gate/up columns, down rows), the router
replicated, the shared expert column/row split; MLA's heads split and its latent replicated (kernels.tp).

Run: pytest tests/test_tp_moe_mla.py   (each test that needs ranks spawns one extra process; ~40 s on 2 cores)
"""

import pytest
import torch
from click.testing import CliRunner
from torch.utils._python_dispatch import TorchDispatchMode

from profiler.cli import main
from profiler.distributed import run_ranks
from roofline import formulas as F
from roofline import workload as W
from roofline.errors import RooflineError
from roofline.layer import model_ops, op_names, weight_elements
from roofline.models import ModelConfig, load_model
from roofline.parallel import COLLECTIVE_OPS, shard

TINY_MOE = load_model("tiny-moe")        # Mixtral layout: 8 experts of 48, top-2, GQA 4:2
TINY_MLA = load_model("tiny-mla")        # DeepSeek: MLA (q_lora, 4 heads), a dense layer 0, 4 experts + a shared one
# Qwen2-MoE-like: q/k/v biases, 8 experts of 32 top-4 unnormalised, a shared expert of 48 behind its sigmoid gate,
# layer 1 dense (mlp_only_layers)
QWEN_MOE = ModelConfig("tiny-qwen2-moe", 64, 96, 2, 4, 2, 256, 512, arch="qwen2_moe", qkv_bias=True, n_experts=8,
                       n_active=4, moe_intermediate=32, norm_topk=False, shared_intermediate=48, shared_gate=True,
                       dense_layers=(1,))
# GPT-OSS-like: sinks (split by query head), a router bias, expert biases (the down bias on rank 0 only), the
# clamped SwiGLU, a sliding layer
OSS_MOE = ModelConfig("tiny-gpt-oss", 64, 32, 2, 4, 2, 256, 512, head_dim=16, arch="gpt_oss", qkv_bias=True,
                      o_bias=True, attn_sinks=True, sliding_window=8, layer_types=("sliding", "full"), n_experts=4,
                      n_active=2, moe_intermediate=32, router="topk_softmax", router_bias=True, expert_bias=True,
                      expert_activation="swiglu_oai")
PARITY = (TINY_MOE, TINY_MLA, QWEN_MOE, OSS_MOE)
PROMPTS = ([(7 * i + 3) % 256 for i in range(12)], [(11 * i + 5) % 256 for i in range(7)])
DECODE_TOKENS = ([17, 42], [99, 3])      # two decode steps over slots 0 and 1 (lengths 12 and 7, then 13 and 8)


# ---- logits ------------------------------------------------------------------------------------------------

def _steps(m) -> dict:
    """A prefill of each of two prompts (slots 0 and 1), then two decode steps over both: every logit row."""
    out = {"prefill": m.prefill(torch.tensor(PROMPTS[0]), 0),
           "prefill, 2nd slot": m.prefill(torch.tensor(PROMPTS[1]), 1)}
    for i, toks in enumerate(DECODE_TOKENS):
        out[f"decode {i + 1}"] = m.decode_step(torch.tensor(toks), torch.tensor([0, 1]))
    return out


def _errs(got: dict, want: dict) -> dict:
    """Per step: (largest |difference|, largest |logit| of the reference)."""
    return {k: (float((got[k] - want[k]).abs().max()), float(want[k].abs().max())) for k in want}


def _held(m) -> int:
    """Elements of every weight this rank holds (a tied lm_head is the embedding: counted once)."""
    w = m.w
    n = w["embed"].numel() + w["final_norm"].numel() + (0 if m.cfg.tie_embeddings else w["lm_head"].numel())
    return n + sum(t.numel() for lw in w["layers"] for t in lw.values())


def _parity(ctx, cfgs):
    from kernels.model import LlamaModel

    out = {}
    for cfg in cfgs:
        kw = dict(dtype="fp32", backend="torch", device="cpu", seed=0, max_slots=2, max_len=16)
        m = LlamaModel(cfg, tp=ctx.tp, **kw)
        got = _steps(m)
        held = ctx.gather(_held(m))
        counts = ctx.gather(m.expert_counts)
        if ctx.rank != 0:
            continue
        ref = LlamaModel(cfg, **kw)
        want = _steps(ref)
        out[cfg.name] = {
            "errs": _errs(got, want),
            "held": held, "counts": counts, "ref_counts": ref.expert_counts,
            "cache": (tuple(m.k_cache.shape), tuple(ref.k_cache.shape)),
            "local_heads": m.lcfg.n_heads,
            "expert_shape": tuple(m.w["layers"][cfg.moe_layers[0]]["experts_gate"].shape)}
    return out


def test_sharded_logits_equal_one_rank_for_a_prefill_and_two_decode_steps():
    res = run_ranks(2, "cpu", _parity, _parity, (PARITY,), threads=1)
    assert set(res) == {c.name for c in PARITY}
    for cfg in PARITY:
        r = res[cfg.name]
        for case, (err, scale) in r["errs"].items():
            assert scale > 0.1 and err <= 1e-5 * scale, (cfg.name, case, err, scale)  # fp32: the all-reduce's rounding
        # every rank routes the same replicated rows the same way: each rank's expert counts are the one-rank model's
        assert all(torch.equal(c, r["ref_counts"]) for c in r["counts"]), cfg.name
        assert int(r["ref_counts"].sum()) == len(cfg.moe_layers) * cfg.n_active * (12 + 7 + 2 * 2)   # tokens x k
        # each rank holds exactly the cost model's per-rank weights (roofline.layer's WeightSpecs at shard(cfg, 2))
        assert r["held"] == [weight_elements(cfg, shard(cfg, 2))] * 2, cfg.name
        assert r["local_heads"] == cfg.n_heads // 2
        assert r["expert_shape"] == (cfg.n_experts, cfg.hidden, cfg.moe_intermediate // 2)     # every expert, I/2
    # MLA: the latent cache [L, slots, max_len, kv_lora_rank] is replicated, the same shape as at one rank
    assert res["tiny-mla"]["cache"] == ((2, 2, 16, 32), (2, 2, 16, 32))


# ---- each rank's FLOPs and bytes against the cost model ---------------------------------------------------

GEMM_KINDS = ("linear", "experts", "router", "mla_up", "mla_attention", "gate")
REPLICATED = ("router", "q_a_proj", "kv_a_proj", "shared_expert_gate")   # every rank does the whole op
POINTS = (("decode", 2, 8), ("prefill", 1, 6))


class _Operands(TorchDispatchMode):
    """Records every matrix product's operands and output: (bytes of all of them, bytes of the second operand,
    the weight in ``x @ w``)."""

    def __init__(self):
        super().__init__()
        self.bytes = self.weight_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default):
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in ts) + out.numel() * out.element_size()
            self.weight_bytes += ts[-1].numel() * ts[-1].element_size()
        return out


def _measure(fn) -> tuple:
    """(FLOPs torch's FlopCounterMode counts, matmul operand + output bytes, matmul weight-operand bytes)."""
    from torch.utils.flop_counter import FlopCounterMode

    rec = _Operands()
    with FlopCounterMode(display=False) as fc, rec:
        fn()
    return fc.get_total_flops(), rec.bytes, rec.weight_bytes


def _rank_costs(ctx, cfgs):
    """Every GEMM-bearing op's measurement on this rank (and, on rank 0, at one rank), with its runner's cost."""
    from kernels.runners import make_runners

    mine, one = {}, {}
    for cfg in cfgs:
        kinds = {o.name: o.kind for o in model_ops(cfg)}
        for phase, batch, context in POINTS:
            for tp, box in ((ctx.tp, mine), (None, one)):
                if tp is None and ctx.rank != 0:
                    continue
                for r in make_runners(cfg, phase, batch, context, dtype="fp32", backend="torch", tp=tp):
                    if kinds.get(r.name) in GEMM_KINDS:
                        box[(cfg.name, phase, r.name)] = (*_measure(r.fn), r.cost, dict(r.config))
    got = ctx.gather(mine)
    return (got, one) if ctx.rank == 0 else None


def test_each_rank_measures_the_cost_models_sharded_flops_and_bytes():
    cfgs = (TINY_MOE, TINY_MLA, QWEN_MOE)
    ranks, one = run_ranks(2, "cpu", _rank_costs, _rank_costs, (cfgs,), threads=1)
    assert set(ranks[0]) == set(ranks[1]) == set(one)
    checked = set()
    for cfg in cfgs:
        sh = shard(cfg, 2)
        specs = {o.name: o for o in model_ops(cfg, sh)}
        for phase, batch, context in POINTS:
            ph = (W.decode if phase == "decode" else W.prefill)(cfg, batch, context, weight_dtype="fp32",
                                                                 act_dtype="fp32", kv_dtype="fp32", tp=2)
            T = batch * (1 if phase == "decode" else context)
            for (name, ph_name, op), (flops, nbytes, wbytes, cost, conf) in ranks[0].items():
                if (name, ph_name) != (cfg.name, phase):
                    continue
                spec, key = specs[op], (name, phase, op)
                assert cost == ph.op(op).cost, key                  # the runner's cost is the sharded cost model's
                assert ranks[1][key][:3] == (flops, nbytes, wbytes), key   # every rank does the same work
                f1, b1, w1 = one[key][:3]
                if op in REPLICATED:
                    assert (flops, wbytes) == (f1, w1), key
                elif spec.kind == "mla_attention" and phase == "decode":   # heads split, the latent replicated:
                    assert flops * 2 == f1 and wbytes == w1, key    # every rank reads all of it
                else:                                               # split exactly in two
                    assert flops * 2 == f1 and wbytes * 2 == w1, key
                if op == "experts":                                 # the same routing as at one rank
                    assert conf["experts_touched"] == one[key][4]["experts_touched"], key
                d = spec.dims
                if spec.kind == "linear" or (spec.kind == "mla_up" and phase == "prefill"):
                    bias = T * d["out_features"] if d.get("bias") else 0
                    assert flops + bias == cost.flops, key          # 2*T*K*N (+ T*N bias adds, not counted)
                    assert nbytes == cost.bytes, key                # weight + input + output, each once
                elif spec.kind == "mla_up":                          # absorbed: q_nope W_UK and o_latent W_UV
                    assert flops == cost.flops == F.mla_absorb_flops(T, sh.n_heads, cfg.qk_nope_dim,
                                                                       cfg.v_head_dim, cfg.kv_lora_rank), key
                elif spec.kind == "mla_attention" and phase == "prefill":  # naive: per-head K and V, split
                    Hq, qk, V = sh.n_heads, cfg.qk_nope_dim + cfg.qk_rope_dim, cfg.v_head_dim
                    assert flops == 2 * batch * Hq * context * context * (qk + V), key   # the counter: no causal mask
                    assert cost.flops == 2 * batch * Hq * F.causal_pairs(context, 0) * (qk + V), key
                elif spec.kind == "mla_attention":
                    S = context + 1
                    assert flops == cost.flops, key                 # 2BHS(R + P) + 2BHSR at Hq/2 heads
                    assert wbytes == batch * S * (2 * cfg.kv_lora_rank + cfg.qk_rope_dim) * 4, key   # c_kv twice
                elif spec.kind == "router":                          # the gate GEMM, replicated: all E logits
                    assert flops == 2 * T * cfg.hidden * cfg.n_experts, key
                elif spec.kind == "gate":
                    assert flops == 2 * T * cfg.hidden, key
                elif spec.kind == "experts":
                    E, k, H, I = cfg.n_experts, cfg.n_active, cfg.hidden, cfg.moe_intermediate // 2
                    rows = T * k
                    assert d["intermediate"] == I and d["n_experts"] == E   # every expert, I/2 of each
                    # the three GEMMs of every routed row at width I/2, then the vector work the formula adds:
                    # silu 5 per element of [rows, I], the routing-weight multiply, the sum of k partials
                    assert flops == 2 * rows * 3 * H * I, key
                    assert cost.flops == flops + 5 * rows * I + rows * H + T * (k - 1) * H, key
                    # weights read: the touched experts' slices, each the cost model's per-expert bytes at I/2
                    touched = conf["experts_touched"]
                    assert 0 < touched <= E and wbytes == touched * F.moe_expert_weight_bytes(
                        H, I, weight_dtype="fp32", act_dtype="fp32"), key
                checked.add((spec.kind, phase))
    assert {("experts", "decode"), ("experts", "prefill"), ("router", "decode"), ("mla_up", "decode"),
            ("mla_up", "prefill"), ("mla_attention", "decode"), ("mla_attention", "prefill"), ("gate", "decode"),
            ("linear", "prefill")} <= checked


# ---- the CLI -----------------------------------------------------------------------------------------------

def test_profile_tiny_moe_over_two_ranks_writes_every_ranks_shard(tmp_path, monkeypatch):
    from roofline.analysis import analyze
    from roofline.records import read_results

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))
    args = ["profile", "--model", "tiny-moe", "--tp", "2", "--phases", "decode", "--batches", "2", "--contexts", "8",
            "--backends", "torch", "--dtype", "fp32", "--device", "cpu", "--budget-ms", "2", "--quick",
            "--out", str(tmp_path / "o"), "--no-report", "--quiet"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    names = op_names(TINY_MOE) + ("layer",) + COLLECTIVE_OPS
    assert f"{2 * len(names)} measured, 0 skipped, 0 resumed" in res.output
    rf = read_results(tmp_path / "o" / "results.jsonl")
    ph = W.decode(TINY_MOE, 2, 8, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32", tp=2)
    by = {(m.point.op, m.rank): m for m in rf.measurements}
    assert set(by) == {(n, r) for n in names for r in (0, 1)}
    for (op, rank), m in by.items():
        assert m.ok and m.point.tp == 2 and m.times_s, (op, rank)
        if op in COLLECTIVE_OPS:
            assert "communication" in m.flags
        elif op != "layer":
            assert m.point.cost == ph.op(op).cost, op
    # the experts' per-rank cost: every expert at I/2 = 24 (roofline.parallel), the router's whole [H, E] GEMM
    assert by[("experts", 0)].point.cost.flops == F.moe_experts(2, 64, 24, 8, 2, act_dtype="fp32",
                                                           weight_dtype="fp32").flops
    assert by[("router", 1)].point.cost.flops == W.decode(TINY_MOE, 2, 8, act_dtype="fp32", weight_dtype="fp32",
                                                     kv_dtype="fp32").op("router").cost.flops
    assert by[("experts", 0)].config["experts_touched"] == by[("experts", 1)].config["experts_touched"]
    steps = analyze(rf).steps
    assert [(s.phase, s.batch, s.context, s.tp) for s in steps] == [("decode", 2, 8, 2)]
    assert steps[0].communication_s > 0 and [r for r, _ in steps[0].rank_s] == [0, 1]


# ---- what stays unsupported, refused before any rank starts -----------------------------------------------

def test_what_tp_does_not_run_is_refused_in_one_line_before_the_ranks_start(tmp_path):
    from profiler.run import RunSpec, default_plan
    from profiler.run_spec import validate_tp

    # an 8-bit latent cache with --tp: refused by the plan before validate_tp, nothing written (quantized weights
    # and 8-bit KV caches of other models run sharded: tests/test_tp_quant.py)
    res = CliRunner().invoke(main, ["profile", "--model", "tiny-mla", "--tp", "2", "--device", "cpu", "--dtype",
                                    "fp32", "--kv-dtype", "int8", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "an 8-bit KV cache is not implemented for a latent cache" in res.output
    assert not (tmp_path / "o").exists()
    # an expert width four ranks cannot split: shard's rule, from validate_tp, before any rank starts
    odd = ModelConfig("odd-moe", 64, 96, 2, 4, 2, 256, 512, arch="mixtral", n_experts=4, n_active=2,
                      moe_intermediate=50)
    plan, _ = default_plan(model="tiny-moe", device="cpu")
    run = RunSpec(plan.__class__(**{**plan.__dict__, "model": odd}), out=tmp_path / "p", tp=4)
    with pytest.raises(RooflineError) as e:
        validate_tp(run)
    msg = str(e.value)
    assert "\n" not in msg and "its expert width 50 does not divide into 4 ranks" in msg
    assert msg.endswith("Valid --tp for it: 1, 2."), msg
    # MLA has no KV heads to split (a config's num_key_value_heads is not read): only its 4 query heads bound --tp,
    # and nothing is "replicated per KV head" (the latent is every rank's)
    from dataclasses import replace

    from roofline.parallel import valid_tp

    one_kv = replace(TINY_MLA, name="tiny-mla-1kv", n_kv_heads=1)
    assert valid_tp(TINY_MLA) == valid_tp(one_kv) == [1, 2, 4]
    assert [(shard(c, 4).n_heads, shard(c, 4).kv_replicas) for c in (TINY_MLA, one_kv)] == [(1, 1), (1, 1)]
    with pytest.raises(RooflineError, match=r"--tp 3 cannot split tiny-mla: its 4 attention heads do not divide"):
        shard(TINY_MLA, 3)
