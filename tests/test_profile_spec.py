"""``roofline profile --spec`` (issue 34): verify steps of k drafts timed beside plain decode on the CPU (torch
backend, the tiny model, the real runners), each op's recorded cost = ``roofline.speculative.verify_step``'s, keyed
so that each k is its own step, drawn on the roofline, and carried through the header and the rerun command."""

from __future__ import annotations

import pytest

from profiler import sweep as S
from profiler.commands.profile import profile
from profiler.run_spec import RunSpec, spec_from_options
from roofline import speculative as SP
from roofline.analysis import analyze
from roofline.devices import cpu_device
from roofline.errors import RooflineError
from roofline.models import load_model
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

TINY = load_model("tiny")
KS = (1, 3)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    p = S.SweepPlan(model=TINY, phases=("decode", "verify"), batches=(1, 2), contexts=(8,), backends=("torch",),
                    dtype="fp32", budget_s=0.002, warmup_s=0.0, spec=KS)
    path = tmp_path_factory.mktemp("spec") / "r.jsonl"
    head = RunHeader(device=cpu_device("test cpu", {"fp32": 1e11}, 1e10), model=TINY.to_dict(), dtype="fp32",
                     settings=p.settings())
    with ResultWriter(path, head) as w:
        stats = S.run_sweep(p, w, device_name="test cpu")
    return p, stats, read_results(path)


def test_verify_points_cost_what_the_speculative_formulas_say(run):
    p, stats, rf = run
    names = S.expected_ops(TINY)
    ver = [m for m in rf.measurements if m.point.phase == "verify"]
    assert stats.skipped == 0 and len(ver) == 2 * len(KS) * len(names)        # batches x k x ops
    assert len(rf.measurements) == len(ver) + 2 * len(names)                   # beside plain decode
    for m in ver:
        pt = m.point
        k = pt.new_tokens - 1
        assert k in KS and pt.cached == 8 and pt.context == 8 + k + 1 and m.ok
        step = SP.verify_step(TINY, pt.batch, 8, k, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
        want = step.op(pt.op)
        assert (pt.cost.flops, pt.cost.bytes) == (want.cost.flops, want.cost.bytes), (pt.op, pt.batch, k)
        assert pt.compute_dtype == want.compute_dtype
    # the verify step's lm_head runs on every position: (k + 1) x batch rows, its weight read once
    lm = {(m.point.batch, m.point.new_tokens): m.point.cost for m in ver if m.point.op == "lm_head"}
    assert lm[(2, 4)].flops == 8 * 2 * TINY.hidden * TINY.vocab and lm[(2, 2)].flops == 4 * 2 * TINY.hidden * TINY.vocab


def test_each_k_is_its_own_step_beside_decode(run):
    _, _, rf = run
    steps = analyze(rf).steps
    titles = sorted(s.title for s in steps if s.phase == "verify")
    assert titles == sorted(f"Verify step of {k} draft{'s' * (k != 1)} at batch {b}, context 8"
                            for b in (1, 2) for k in KS)
    assert sorted((s.batch, s.context) for s in steps if s.phase == "decode") == [(1, 8), (2, 8)]
    for s in steps:
        if s.phase == "verify":            # the step's cost: the verify step's per-layer ops x layers + the rest
            k = s.context - s.cached - 1
            ph = SP.verify_step(TINY, s.batch, 8, k, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
            assert s.cost.flops == pytest.approx(ph.total.flops) and s.cost.bytes == pytest.approx(ph.total.bytes)


def test_the_roofline_figure_draws_the_verify_points(run):
    from reports.roofline_plot import plot_roofline
    from reports.style import new_figure

    _, _, rf = run
    fig, ax = new_figure(8, 6)
    plot_roofline(ax, rf)
    gids = [c.get_gid() for c in ax.collections]
    assert "points:verify" in gids and "steps:verify" in gids
    assert "verify" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_option_reaches_the_header_and_the_rerun(tmp_path):
    args = ["--model", "tiny", "--phases", "decode", "--spec", "1,3,5", "--batches", "1", "--contexts", "8",
            "--device", "cpu", "--out", str(tmp_path / "o")]
    spec = spec_from_options(profile.make_context("profile", args).params, "new")
    assert spec.plan.phases == ("decode", "verify") and spec.plan.spec == (1, 3, 5)
    assert spec.plan.points == 1 + 3
    cmd = spec.command()
    assert "--spec 1,3,5" in cmd and "--phases decode " in cmd                  # verify follows from --spec
    head = RunHeader(device=cpu_device("c", {"fp32": 1e11}, 1e10), model=TINY.to_dict(), dtype="fp32",
                     settings=spec.to_header(threads=1))
    again = RunSpec.from_header(head, out=tmp_path / "o", mode="resume")
    assert again.plan.spec == (1, 3, 5) and again.plan.phases == spec.plan.phases


@pytest.mark.parametrize("kw, says", [(dict(phases=("decode", "verify")), "--spec"),
                                      (dict(spec=(2,)), "--spec"),
                                      (dict(phases=("verify",), spec=(0,)), "at least 1"),
                                      (dict(phases=("verify",), spec=(3,), contexts=(TINY.max_context - 3,)),
                                       "maximum context")])
def test_bad_plans_are_refused(kw, says):
    p = S.SweepPlan(model=TINY, **{**dict(phases=("decode",), batches=(1,), contexts=(8,)), **kw})
    with pytest.raises(RooflineError, match=says):
        p.validate()


def test_the_phase_table_says_k_and_the_context(run):
    from reports.tables import phase_rows

    _, _, rf = run
    steps = [s for s in analyze(rf).steps if s.phase == "verify"]
    rows = phase_rows(steps)
    assert sorted((r[0][0], r[1][0], r[2][0]) for r in rows) == sorted(
        (f"verify k={k}", str(b), "8") for b in (1, 2) for k in KS)


def test_the_profile_table_says_k_and_the_context(run):
    from profiler.export import phase_table

    _, _, rf = run
    lines = phase_table(rf).splitlines()
    ver = [ln.split() for ln in lines if ln.startswith("verify")]
    assert sorted((ln[1], ln[3], ln[4]) for ln in ver) == sorted((f"k={k}", str(b), "8") for b in (1, 2) for k in KS)


def test_a_chunked_attention_model_is_refused_before_anything_runs():
    from dataclasses import replace

    chunked = replace(TINY, attention_chunk=4)
    p = S.SweepPlan(model=chunked, phases=("decode", "verify"), batches=(1,), contexts=(8,), spec=(3,))
    with pytest.raises(RooflineError, match="chunked local attention .* no verify-step kernel yet"):
        p.validate()


def test_counters_with_spec_is_refused_in_one_line(tmp_path):
    from click.testing import CliRunner

    from profiler.cli import main

    r = CliRunner().invoke(main, ["profile", "--model", "tiny", "--phases", "decode", "--spec", "3", "--batches", "1",
                                  "--contexts", "8", "--device", "cpu", "--counters", "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and "--counters reads the prefill and decode points only" in r.output
    assert not (tmp_path / "o" / "results.jsonl").exists()
