"""Expert parallelism run as costed (``--tp N --ep N``), on this CPU: two gloo ranks on 127.0.0.1.

Each rank holds E/N whole experts, attention and the rest as under --tp N; a MoE layer's routed rows go to the
rank of their expert (dispatch all-to-all) and come back (combine all-to-all): kernels.tp.ep_experts.

Run: pytest tests/test_ep_run.py   (each test that needs ranks spawns one extra process)
"""

import torch

from profiler.distributed import run_ranks
from roofline.models import load_model

TINY_MOE = load_model("tiny-moe")        # Mixtral layout: 8 experts of 48, top-2, GQA 4:2
PROMPTS = ([(7 * i + 3) % 256 for i in range(12)], [(11 * i + 5) % 256 for i in range(7)])
DECODE_TOKENS = ([17, 42], [99, 3])      # two decode steps over slots 0 and 1


def _ep(ctx):
    from kernels.tp import TPGroup

    return TPGroup(ctx.rank, ctx.world, ep=ctx.world)


def _steps(m) -> dict:
    out = {"prefill": m.prefill(torch.tensor(PROMPTS[0]), 0),
           "prefill, 2nd slot": m.prefill(torch.tensor(PROMPTS[1]), 1)}
    for i, toks in enumerate(DECODE_TOKENS):
        out[f"decode {i + 1}"] = m.decode_step(torch.tensor(toks), torch.tensor([0, 1]))
    return out


def _parity(ctx, cfg):
    from kernels.model import LlamaModel

    kw = dict(dtype="fp32", backend="torch", device="cpu", seed=0, max_slots=2, max_len=16)
    m = LlamaModel(cfg, tp=_ep(ctx), **kw)
    got = _steps(m)
    shapes = ctx.gather(tuple(m.w["layers"][0]["experts_gate"].shape))
    if ctx.rank != 0:
        return None
    want = _steps(LlamaModel(cfg, **kw))
    return {"errs": {k: (float((got[k] - want[k]).abs().max()), float(want[k].abs().max())) for k in want},
            "shapes": shapes}


def test_ep_logits_equal_one_rank_for_a_prefill_and_two_decode_steps():
    r = run_ranks(2, "cpu", _parity, _parity, (TINY_MOE,), threads=1)
    for case, (err, scale) in r["errs"].items():
        assert scale > 0.1 and err <= 1e-5 * scale, (case, err, scale)
    # each rank holds 4 of the 8 whole experts (width 48, not sliced)
    assert r["shapes"] == [(4, 64, 48)] * 2


# ---- the sweep's runners: each rank's experts op and the all-to-alls against the cost model -----------------

def _runners(ctx, cfg, points):
    from kernels.runners import make_runners
    from roofline import workload as W

    out = []
    for phase, batch, context in points:
        rs = make_runners(cfg, phase, batch, context, dtype="fp32", backend="torch", device="cpu", seed=0,
                          tp=_ep(ctx))
        for r in rs:                       # every runner runs (the all-to-alls must meet on both ranks)
            r.fn()
        by = {r.name: r for r in rs}
        e = by["experts"]
        T = batch * (context if phase == "prefill" else 1)
        kw = dict(weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32", tp=ctx.world, ep=ctx.world)
        ph = W.prefill(cfg, batch, context, **kw) if phase == "prefill" else W.decode(cfg, batch, context, **kw)
        out.append({"names": [r.name for r in rs], "cost": e.cost, "rows": e.config["rows"],
                    "touched": e.config["experts_touched"], "T": T,
                    "a2a": {n: (by[n].config["detail"]["message_bytes"], by[n].config["detail"]["sent_bytes"],
                                by[n].flags, by[n].cost) for n in ("moe_dispatch", "moe_combine")},
                    "model_a2a": {c.name: c.message_bytes for c in ph.collectives if c.kind == "all_to_all"}})
    return ctx.gather(out)


def test_each_rank_costs_its_own_experts_and_the_all_to_alls_are_the_models():
    from roofline import formulas as F
    from roofline.parallel import COLLECTIVE_OPS, EP_COLLECTIVES

    cfg = TINY_MOE
    points = (("decode", 4, 8), ("prefill", 1, 6))
    per_rank = run_ranks(2, "cpu", _runners, _runners, (cfg, points), threads=1)
    for i, (phase, batch, context) in enumerate(points):
        got = [per_rank[r][i] for r in range(2)]
        T = got[0]["T"]
        # every routed (token, expert) row reaches exactly one rank
        assert sum(g["rows"] for g in got) == T * cfg.n_active
        for g in got:
            want = F.moe_experts_ep(T, cfg.hidden, cfg.moe_intermediate, cfg.n_experts, cfg.n_active, 2,
                                    rows=g["rows"], distinct=g["touched"], act_dtype="fp32", weight_dtype="fp32")
            assert (g["cost"].flops, g["cost"].bytes) == (want.flops, want.bytes), (phase, g)
            assert 0 < g["touched"] <= cfg.n_experts // 2
            # the step's collectives: no MLP all-reduce (no shared expert), the two all-to-alls
            assert [n for n in g["names"] if n in COLLECTIVE_OPS + EP_COLLECTIVES] == [
                "embedding_allreduce", "attn_allreduce", "moe_dispatch", "moe_combine", "lm_head_gather"]
            msg = F.moe_all_to_all_bytes(T, cfg.n_active, cfg.hidden, 2, act_dtype="fp32")
            for name, (model_bytes, sent, flags, cost) in g["a2a"].items():
                assert model_bytes == msg == g["model_a2a"][name]
                assert "communication" in flags and cost.flops == cost.bytes == 0
            # T divisible by the ranks: each rank sends its T/2 tokens' k rows, the model's message exactly
            assert g["a2a"]["moe_dispatch"][1] == msg
        # the combine returns what the dispatch sent: rank r gets back its own rows
        assert [g["a2a"]["moe_combine"][1] for g in got] == [g["rows"] * cfg.hidden * 4 for g in got]


# ---- the CLI: --ep is refused in one line before any rank starts ---------------------------------------------

def _profile(*args):
    from click.testing import CliRunner

    from profiler.cli import main

    return CliRunner().invoke(main, ["profile", "--device", "cpu", "--quick", "--quiet", *args])


def test_profile_ep_refusals_are_one_line_before_any_rank_starts(tmp_path):
    cases = {("--model", "tiny-moe", "--ep", "2"): "give --tp 2 --ep 2",
             ("--model", "tiny-moe", "--tp", "2", "--ep", "4"): "give --tp 4 --ep 4",
             ("--model", "tiny", "--tp", "2", "--ep", "2"): "has no routed experts",
             ("--model", "tiny-moe", "--tp", "3", "--ep", "3"): "Valid --ep for it: 1, 2, 4",
             ("--model", "tiny-moe", "--tp", "2", "--ep", "2"): "not wired to the sweep yet"}
    for args, words in cases.items():
        r = _profile(*args, "--out", str(tmp_path / "out"))
        assert r.exit_code != 0, args
        assert words in r.output, (args, r.output)
        assert not (tmp_path / "out" / "results.jsonl").exists()
