"""Speculative decoding in the serving loop (profiler/speculation.py, profiler/serving.py) on tiny torch models.

Greedy speculation must reproduce the plain greedy run token for token; the measured acceptance must be the
recorded accept/reject decisions; a draft equal to the target accepts everything; rejection sampling must
preserve the target's distribution (exactly, from the acceptance probability and the residual, and empirically
with a fixed seed). A FakeClock stands in for time: nothing here depends on how fast the CPU is.
"""

from dataclasses import replace

import pytest
import torch

from kernels.model import LlamaModel
from profiler.serving import FakeClock, RequestSpec, serve
from profiler.speculation import (Round, Sampler, accept_probability, residual, spec_summary, verify_greedy,
                                  verify_sampled)
from profiler.tokenizer import make_prompt
from roofline.errors import RooflineError
from roofline.models import load_model

TINY = load_model("tiny")
K = 3


def model(cfg=TINY, seed=0, slots=3):
    return LlamaModel(cfg, dtype="fp32", backend="torch", seed=seed, max_slots=slots, max_len=96)


def layer_skip_draft(target):
    """The target's first layer with its embedding, final norm and head (same seed: layer 0 is the target's)."""
    d = model(replace(TINY, name="tiny-1-layer", n_layers=1))
    for key in ("embed", "final_norm", "lm_head"):
        d.w[key] = target.w[key]
    return d


def requests(n=3, out=1 + 3 * (K + 1)):
    return [RequestSpec(i, 0.0, make_prompt(18 + 5 * i, seed=i), out) for i in range(n)]


def rounds_of(run):
    return [r for st in run.steps for r in st.get("rounds", [])]


@pytest.fixture(scope="module")
def target():
    return model()


@pytest.fixture(scope="module")
def plain(target):
    return serve(target, requests(), clock=FakeClock(), chunk_budget=32)


def test_greedy_speculation_equals_plain_greedy_and_acceptance_is_the_decisions(target, plain):
    run = serve(target, requests(), clock=FakeClock(), chunk_budget=32, draft=layer_skip_draft(target), spec_k=K)
    assert run.texts == plain.texts
    assert [t.n for t in run.timelines] == [t.n for t in plain.timelines] == [13] * 3
    rs = rounds_of(run)
    s = spec_summary(rs)
    a = sum(r[3].count("A") for r in rs)                      # the decisions themselves, counted
    rejected = sum(r[3].count("R") for r in rs)
    assert s["accepted"] == s["decisions_accepted"] == a
    assert s["decisions_rejected"] == rejected
    assert s["acceptance"] == a / sum(r[1] for r in rs)
    assert 0 < s["acceptance"] < 1                             # a real draft: some accepted, some not
    # every request got its 12 decode tokens from its rounds: accepted + 1 per round
    for rid in range(3):
        assert sum(r[2] + 1 for r in rs if r[0] == rid) == 12
    assert all(r[3].count("R") <= 1 and (r[3].endswith("R") or r[3] == "A" * r[1]) for r in rs)
    assert all(st["drafted"] == sum(r[1] for r in st["rounds"]) for st in run.steps if "rounds" in st)


def test_draft_equal_to_the_target_accepts_everything(target, plain):
    run = serve(target, requests(), clock=FakeClock(), chunk_budget=32, draft=model(), spec_k=K)
    assert run.texts == plain.texts
    s = spec_summary(rounds_of(run))
    assert s["acceptance"] == 1.0
    assert s["tokens_per_step"] == K + 1
    assert s["rounds"] == 3 * 3 and s["per_position"] == [1.0] * K
    assert s["decisions_rejected"] == 0


def test_kv_rollback_leaves_both_caches_at_the_accepted_length(target):
    draft = layer_skip_draft(target)
    spec = [RequestSpec(0, 0.0, make_prompt(20, seed=7), 9)]
    run = serve(target, spec, clock=FakeClock(), draft=draft, spec_k=K, prefix_cache=True)
    # parked with its KV: the prompt and every delivered token but the last (never fed back), in both caches
    n_prompt = run.timelines[0].prompt_tokens
    assert int(target.lengths[0]) == int(draft.lengths[0]) == n_prompt + 9 - 1
    assert spec_summary(rounds_of(run))["rounds"] > 2
    plain = serve(model(), spec, clock=FakeClock())
    assert run.texts == plain.texts


def test_sampled_speculation_with_the_target_as_draft_accepts_everything(target):
    run = serve(target, requests(2), clock=FakeClock(), chunk_budget=32, draft=model(), spec_k=K,
                sampler=Sampler(sampled=True, seed=3))
    s = spec_summary(rounds_of(run))
    assert s["acceptance"] == 1.0 and s["tokens_per_step"] == K + 1


def test_sampled_speculation_records_its_decisions(target):
    run = serve(target, requests(2), clock=FakeClock(), chunk_budget=32, draft=layer_skip_draft(target), spec_k=K,
                sampler=Sampler(sampled=True, temperature=0.7, seed=1))
    rs = rounds_of(run)
    s = spec_summary(rs)
    assert s["accepted"] == sum(r[3].count("A") for r in rs)
    assert [t.n for t in run.timelines] == [13, 13]
    for rid in range(2):
        assert sum(r[2] + 1 for r in rs if r[0] == rid) == 12


def test_greedy_verification_by_hand():
    logits = torch.tensor([[0., 5., 1.], [3., 0., 0.], [0., 0., 9.], [1., 2., 0.]])    # argmax 1, 0, 2, 1
    v = verify_greedy([1, 0, 2], logits)
    assert (v.accepted, v.token, v.decisions) == (3, 1, (True, True, True))      # all accepted + bonus
    v = verify_greedy([1, 2, 2], logits)
    assert (v.accepted, v.token, v.decisions) == (1, 0, (True, False))            # the target's token at 1
    v = verify_greedy([0, 0, 2], logits)
    assert (v.accepted, v.token, v.decisions) == (0, 1, (False,))


P = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
Q = torch.tensor([0.2, 0.2, 0.3, 0.3], dtype=torch.float64)


def test_rejection_sampling_preserves_the_target_distribution_exactly():
    beta = sum(float(Q[x]) * accept_probability(P, Q, x) for x in range(4))
    assert beta == pytest.approx(float(torch.minimum(P, Q).sum()))              # 0.2 + 0.2 + 0.2 + 0 = 0.6
    assert beta == pytest.approx(0.6)
    r = residual(P, Q)
    assert r.tolist() == pytest.approx([0.75, 0.25, 0.0, 0.0])                   # (0.3, 0.1, 0, 0) / 0.4
    emitted = [float(Q[x]) * accept_probability(P, Q, x) + (1 - beta) * float(r[x]) for x in range(4)]
    assert emitted == pytest.approx(P.tolist(), abs=1e-12)
    assert accept_probability(P, Q, 3) == 0.0 and accept_probability(P, Q, 0) == 1.0
    assert accept_probability(P, Q, 2) == pytest.approx(2 / 3)


def test_rejection_sampling_empirically_with_a_fixed_seed():
    s = Sampler(sampled=True, seed=0)
    n, counts, accepted = 4000, torch.zeros(4, dtype=torch.float64), 0
    p2 = torch.stack([P, torch.full((4,), 0.25, dtype=torch.float64)])
    for _ in range(n):
        d = s.draw(Q)
        v = verify_sampled([d], Q[None], p2, s)
        first = d if v.accepted else v.token
        counts[first] += 1
        accepted += v.accepted
        assert v.decisions == ((True,) if v.accepted else (False,))
    assert (counts / n).tolist() == pytest.approx(P.tolist(), abs=0.03)
    assert counts[3] == 0                                                       # p(3) = 0: never emitted
    assert accepted / n == pytest.approx(0.6, abs=0.03)


def test_spec_summary_counts():
    rs = [Round(0, 3, 3, (True,) * 3), Round(1, 3, 1, (True, False)), Round(0, 2, 0, (False,)), Round(1, 0, 0, ())]
    s = spec_summary(rs)
    assert (s["rounds"], s["drafted"], s["accepted"]) == (4, 8, 4)
    assert s["acceptance"] == 0.5
    assert s["tokens_per_step"] == (4 + 4) / 4
    assert s["per_position"] == [2 / 3, 1 / 3, 1 / 2]
    assert spec_summary([r.to_list() for r in rs]) == s


def test_a_draft_with_another_vocabulary_is_refused(target):
    other = model(replace(TINY, name="tiny-v128", vocab=128, n_layers=1))
    with pytest.raises(RooflineError, match="vocabulary of 128 tokens"):
        serve(target, requests(1), clock=FakeClock(), draft=other, spec_k=2)


# ------------------------------------------------------------------ roofline latency --spec

def latency_cli(*args):
    from click.testing import CliRunner

    from profiler.cli import main

    return CliRunner().invoke(main, ["latency", "--model", "tiny", "--device", "cpu", "--prompt-tokens", "24",
                                     "--output-tokens", "9", "--requests", "2", "--rate", "1000", "--json",
                                     *[str(a) for a in args]])


def test_latency_runs_without_and_with_speculation_on_the_same_requests(tmp_path):
    import json

    from roofline.records import read_results

    r = latency_cli("--spec", 2, "--draft", "tiny", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    plain, spec = json.loads(r.stdout)["summaries"]
    assert (plain["config"], spec["config"]) == ("chunk=64,prefix-cache=on", "chunk=64,prefix-cache=on,spec=2:tiny")
    assert plain["speculation"] == {}
    sp = spec["speculation"]
    # the draft is the target (same preset, same seed): 8 decode tokens = rounds of 2 + 1, all accepted, then K < 2
    assert (sp["acceptance"], sp["drafted"], sp["accepted"]) == (1.0, sp["accepted"], sp["decisions_accepted"])
    assert sp["rounds"] == 2 * 3 and sp["tokens_per_step"] == 8 / 3
    assert plain["tpot"]["n"] == spec["tpot"]["n"] == 2
    rf = read_results(tmp_path / "latency.jsonl")
    assert rf.header.settings["spec"] == 2 and rf.header.settings["draft"] == "tiny"
    assert [s.speculation.get("acceptance") for s in rf.summaries] == [None, 1.0]
    steps = [s for s in rf.serving_steps if s.config == spec["config"]]
    assert steps and all(s.decode >= 0 for s in steps)


@pytest.mark.parametrize("args, said", [
    (("--spec", 2), "--spec K needs a draft model"),
    (("--draft", "tiny"), "--draft names the draft of speculative decoding"),
    (("--spec", 2, "--draft", "small"), "vocabulary of 8192 tokens"),
    (("--spec", 0, "--draft", "tiny"), "from 1 to 64"),
    (("--temperature", 0.5), "--temperature goes with --verify sampled"),
    (("--spec", 2, "--draft", "tiny", "--verify", "sampled", "--temperature", 0), "positive number"),
    (("--spec", 2, "--draft", "tiny", "--endpoint", "http://127.0.0.1:9"), "with --endpoint the server schedules"),
])
def test_latency_speculation_options_are_checked_in_one_line(tmp_path, args, said):
    r = latency_cli(*args, "--out", tmp_path)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: ") and said in lines[0], r.output


@pytest.mark.parametrize("args, said", [
    (("--spec", 2), "--spec K needs a draft model"),
    (("--spec", 2, "--draft", "small"), "vocabulary of 8192 tokens"),
])
def test_serve_speculation_options_are_checked_in_one_line(args, said):
    from click.testing import CliRunner

    from profiler.cli import main

    r = CliRunner().invoke(main, ["serve", "--model", "tiny", "--device", "cpu", "--port", "0",
                                  *[str(a) for a in args]])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: ") and said in lines[0], r.output


class Costed:
    """A model whose every call advances a FakeClock by a fixed cost (a memory-bound step: the same for 1 or K + 1
    tokens), so TPOT and ITL are exact."""

    def __init__(self, m, clock, cost):
        self.m, self.clock, self.cost = m, clock, cost
        self.cfg, self.max_len, self.lengths, self.device = m.cfg, m.max_len, m.lengths, "cpu"

    def prefill(self, *a, **kw):
        self.clock.advance(self.cost)
        return self.m.prefill(*a, **kw)

    def decode_step(self, *a, **kw):
        self.clock.advance(self.cost)
        return self.m.decode_step(*a, **kw)

    def copy_prefix(self, *a):
        self.m.copy_prefix(*a)

    def reset(self, slot):
        self.m.reset(slot)


def test_tpot_and_itl_with_a_cheap_draft_follow_the_step_costs():
    from roofline.latency import summarize

    one = [RequestSpec(0, 0.0, make_prompt(20, seed=3), 1 + 3 * (K + 1))]
    clock = FakeClock()
    plain = summarize(serve(Costed(model(), clock, 0.010), one, clock=clock).timelines)
    clock = FakeClock()
    run = serve(Costed(model(), clock, 0.010), one, clock=clock, draft=Costed(model(), clock, 0.001), spec_k=K)
    spec = summarize(run.timelines)
    assert plain.tpot["p50"] == pytest.approx(0.010)            # one 10 ms decode step per token
    # a round: K draft steps (1 ms) + the verify step (10 ms) + the draft's catch-up (1 ms) -> K + 1 tokens
    assert spec.tpot["p50"] == pytest.approx(3 * (K * 0.001 + 0.010 + 0.001) / 12)
    assert spec.itl["p50"] == 0.0 and spec.itl["max"] == pytest.approx(K * 0.001 + 0.010 + 0.001)
    assert spec_summary(rounds_of(run))["tokens_per_step"] == K + 1
