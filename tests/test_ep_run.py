"""Expert parallelism run as costed (``--tp N --ep N``), on this CPU: two gloo ranks on 127.0.0.1.

Each rank holds E/N whole experts, attention and the rest as under --tp N; a MoE layer's routed rows go to the
rank of their expert (dispatch all-to-all) and come back (combine all-to-all): kernels.tp.ep_experts.

Run: pytest tests/test_ep_run.py   (each test that needs ranks spawns one extra process)
"""

from profiler.distributed import run_ranks
from roofline.models import load_model
from tests.test_tp_moe_mla import _errs, _steps  # two prefills, two decode steps: the same as for --tp

TINY_MOE = load_model("tiny-moe")        # Mixtral layout: 8 experts of 48, top-2, GQA 4:2


def _ep(ctx):
    from kernels.tp import TPGroup

    return TPGroup(ctx.rank, ctx.world, ep=ctx.world)


def _parity(ctx, cfg):
    from kernels.model import LlamaModel

    kw = dict(dtype="fp32", backend="torch", device="cpu", seed=0, max_slots=2, max_len=16)
    m = LlamaModel(cfg, tp=_ep(ctx), **kw)
    got = _steps(m)
    shapes = ctx.gather(tuple(m.w["layers"][0]["experts_gate"].shape))
    if ctx.rank != 0:
        return None
    want = _steps(LlamaModel(cfg, **kw))
    return {"errs": _errs(got, want),
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


# ---- the CLI: a bad --ep is refused in one line before any rank starts; a good one writes its results --------

def _profile(*args):
    from click.testing import CliRunner

    from profiler.cli import main

    return CliRunner().invoke(main, ["profile", "--device", "cpu", "--quick", "--quiet", *args])


def test_profile_ep_refusals_are_one_line_before_any_rank_starts(tmp_path):
    cases = {("--model", "tiny-moe", "--ep", "2"): "give --tp 2 --ep 2",
             ("--model", "tiny-moe", "--tp", "2", "--ep", "4"): "give --tp 4 --ep 4",
             ("--model", "tiny", "--tp", "2", "--ep", "2"): "has no routed experts",
             ("--model", "tiny-moe", "--tp", "3", "--ep", "3"): "Valid --ep for it: 1, 2, 4"}
    for args, words in cases.items():
        r = _profile(*args, "--out", str(tmp_path / "out"))
        assert r.exit_code != 0, args
        assert words in r.output, (args, r.output)
        assert not (tmp_path / "out" / "results.jsonl").exists()


def test_profile_tp2_ep2_writes_each_ranks_experts_and_the_all_to_alls(tmp_path, monkeypatch):
    from roofline import formulas as F
    from roofline import workload as W
    from roofline.layer import op_names
    from roofline.records import read_results

    from profiler.cli import main
    from click.testing import CliRunner

    cfg = TINY_MOE
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "o"
    r = _profile("--model", "tiny-moe", "--tp", "2", "--ep", "2", "--phases", "decode", "--batches", "2",
                 "--contexts", "8", "--backends", "torch", "--dtype", "fp32", "--budget-ms", "2", "--no-report",
                 "--out", str(out))
    assert r.exit_code == 0, r.output
    # the step's own collectives: the all-to-alls replace the MoE layers' MLP all-reduce (tiny-moe: all MoE)
    coll = ("embedding_allreduce", "attn_allreduce", "moe_dispatch", "moe_combine", "lm_head_gather")
    names = op_names(cfg) + ("layer",) + coll
    assert f"{2 * len(names)} measured, 0 skipped, 0 resumed" in r.output
    rf = read_results(out / "results.jsonl")
    assert rf.header.settings["tp"] == 2 and rf.header.settings["ep"] == 2
    assert "--tp 2 --ep 2" in rf.header.command
    by = {(m.point.op, m.rank): m for m in rf.measurements}
    assert set(by) == {(n, k) for n in names for k in (0, 1)}
    assert all(m.ok and m.point.tp == 2 and m.point.ep == 2 and m.times_s for m in by.values())
    T, msg = 2, F.moe_all_to_all_bytes(2, cfg.n_active, cfg.hidden, 2, act_dtype="fp32")
    ph = W.decode(cfg, 2, 8, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32", tp=2, ep=2)
    rows = []
    for rank in (0, 1):
        e = by[("experts", rank)]
        want = F.moe_experts_ep(T, cfg.hidden, cfg.moe_intermediate, cfg.n_experts, cfg.n_active, 2,
                                rows=e.config["rows"], distinct=e.config["experts_touched"], act_dtype="fp32",
                                weight_dtype="fp32")
        assert (e.point.cost.flops, e.point.cost.bytes) == (want.flops, want.bytes), rank
        rows.append(e.config["rows"])
        for name in ("moe_dispatch", "moe_combine"):
            m = by[(name, rank)]
            assert "communication" in m.flags and m.point.cost.flops == m.point.cost.bytes == 0
            assert m.config["detail"]["message_bytes"] == msg == ph.collective(name).message_bytes
    assert sum(rows) == T * cfg.n_active          # every routed row reached exactly one rank
    # the analysis keeps the expert-parallel step apart and says so
    from roofline.analysis import analyze

    (step,) = analyze(rf).steps
    assert step.key.tp == 2 and step.key.ep == 2 and step.where == "b2/ctx8 tp2 ep2"
    # the file reads back and renders
    rep = CliRunner().invoke(main, ["report", str(out / "results.jsonl"), "--out", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    assert (tmp_path / "rep" / "report.html").stat().st_size > 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"{2 * len(names)} measurements" in md and "--tp 2 --ep 2" in md
    # a resume must keep --ep: without it the run is refused in one line, the file untouched
    before = (out / "results.jsonl").read_bytes()
    r = _profile("--model", "tiny-moe", "--tp", "2", "--phases", "decode", "--batches", "2", "--contexts", "8",
                 "--backends", "torch", "--dtype", "fp32", "--budget-ms", "2", "--no-report", "--out", str(out),
                 "--resume")
    assert r.exit_code != 0 and "measured with --ep 2, this run has --ep 1" in r.output, r.output
    assert (out / "results.jsonl").read_bytes() == before


def test_points_older_than_ep_read_as_ep_1_and_ep_is_in_the_key():
    from roofline.cost import Cost
    from roofline.records import WorkloadPoint

    p = WorkloadPoint(model="tiny-moe", op="experts", phase="decode", batch=2, new_tokens=1, context=8,
                      cost=Cost(1.0, 2.0), tp=2)
    d = p.to_dict()
    assert "ep" not in d and WorkloadPoint.from_dict(d).ep == 1        # a file written before --ep
    q = WorkloadPoint.from_dict({**d, "ep": 2})
    assert q.ep == 2 and q.key != p.key                                 # points of different --ep never mix
    assert q.to_dict()["ep"] == 2
    from roofline.analysis import StepKey
    from roofline.verdicts.comparison import CHANGE_FIELDS, POINT_FIELDS, STEP_FIELDS

    assert StepKey.of(p) != StepKey.of(q) and StepKey.of(q).ep == 2     # steps of different --ep never sum together
    assert "ep" in POINT_FIELDS and "ep" in STEP_FIELDS and "ep" in CHANGE_FIELDS   # compare pairs by it too
