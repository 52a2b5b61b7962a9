"""Tokens per expert read from real MoE traces (roofline.traces.experts) against the routers' own choices.

Each trace is captured here with torch.profiler (record_shapes=True) into tmp_path, from transformers' tiny MoE
checkpoints (tests/hf_tiny_moe.py) and our own tiny-moe model (torch backend); the truth is what each router
module returned in that same run (a forward hook), or our model's own ``expert_counts``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny as HT  # noqa: E402
import hf_tiny_moe as M  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from kernels.model import LlamaModel  # noqa: E402
from profiler.capture import capture  # noqa: E402
from roofline.verdicts.expert_rules import TRACE_MIN_MEAN, expert_findings  # noqa: E402
from roofline.models import load_model  # noqa: E402
from roofline.traces.analyze import analyze_trace  # noqa: E402
from roofline.traces.events import read_trace  # noqa: E402
from roofline.traces.experts import BY_INDEX, BY_ORDER, GROUPED, ExpertLoads, LayerPass, expert_sentence  # noqa: E402

T = 12                                     # prompt tokens


def _hf_trace(model_type: str, impl: str, path, *, decode: int = 0):
    """Trace one prefill of T tokens (and ``decode`` greedy steps through generate) of the tiny ``model_type``
    checkpoint with transformers' ``experts_implementation`` ``impl``; returns (trace path, the model config,
    the routers' choices in call order: [tokens, k] expert ids per router call)."""
    M.require(model_type)
    folder = M.checkpoint(model_type)
    kw = {HT._DTYPE(): torch.float32, "attn_implementation": "eager", "experts_implementation": impl}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kw).eval()
    seen = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.append(out[2].reshape(-1, out[2].shape[-1]).clone()))
             for _, m in model.named_modules() if M._is_router(m)]
    ids = torch.tensor([M.tokens(T, 0)])
    with HT.one_thread(), torch.no_grad():
        with capture(path, cuda=False):
            if decode:
                model.generate(ids, max_new_tokens=decode + 1, min_new_tokens=decode + 1, do_sample=False)
            else:
                model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    return path, load_model(str(folder)), seen


def _truth(ids, E: int) -> dict:
    """{expert: tokens} of one router call, experts with no token left out."""
    c = torch.bincount(ids.flatten(), minlength=E).tolist()
    return {e: n for e, n in enumerate(c) if n}


def _experts(path, cfg) -> dict:
    return analyze_trace(read_trace(path), model=cfg).summary["experts"]


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "minimax_m2"])
def test_the_expert_loop_gives_each_experts_tokens_by_index(model_type, tmp_path):
    path, cfg, seen = _hf_trace(model_type, "eager", tmp_path / "t.json")
    ex = _experts(path, cfg)
    k = cfg.n_active
    assert ex["how"] == BY_INDEX and ex["n_experts"] == cfg.n_experts and ex["k"] == k
    assert [p["layer"] for p in ex["passes"]] == list(M.MOE_LAYERS[model_type])   # shared / dense MLPs left out
    assert len(seen) == len(ex["passes"])
    for p, ids in zip(ex["passes"], seen):
        assert {int(e): n for e, n in p["counts"].items()} == _truth(ids, cfg.n_experts)
        # every assignment is visible: 12 tokens x top-k
        assert p["tokens"] == T and p["routed"] == p["expected"] == T * k and p["complete"]
        c = list(_truth(ids, cfg.n_experts).values())
        assert p["experts_hit"] == len(c) and p["imbalance"] == pytest.approx(max(c) / (T * k / len(c)))
    assert "by expert index" in ex["sentence"] and "every assignment seen" in ex["sentence"]


@pytest.mark.parametrize("model_type", ["mixtral", "deepseek_v3"])
def test_cpu_grouped_mm_records_each_expert_below_it(model_type, tmp_path):
    """torch's CPU _grouped_mm runs a select + mm per expert below the op: the counts are read there, and an
    expert given no tokens shows as 0 rows (counted, not hit)."""
    path, cfg, seen = _hf_trace(model_type, "grouped_mm", tmp_path / "t.json")
    ex = _experts(path, cfg)
    assert ex["how"] == BY_INDEX
    for p, ids in zip(ex["passes"], seen):
        assert {int(e): n for e, n in p["counts"].items() if n} == _truth(ids, cfg.n_experts)
        assert p["routed"] == T * cfg.n_active and p["experts_hit"] == len(_truth(ids, cfg.n_experts))


def _without(path, out, drop):
    """The trace at ``path`` less the cpu_ops ``drop(event, grouped intervals)`` says to drop."""
    d = json.loads(path.read_text())
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in d["traceEvents"] if e.get("name") == "aten::_grouped_mm"]
    d["traceEvents"] = [e for e in d["traceEvents"] if not (e.get("cat") == "cpu_op" and drop(e, spans))]
    out.write_text(json.dumps(d))
    return out


def test_a_grouped_gemm_without_per_expert_ops_says_the_counts_are_not_in_it(tmp_path):
    """A GPU trace records _grouped_mm as one op (its kernel): here the CPU capture less the ops below each
    _grouped_mm, as such a trace holds it. Only the rows in all are known: 12 tokens x top-2 = 24."""
    path, cfg, _ = _hf_trace("mixtral", "grouped_mm", tmp_path / "t.json")
    inside = _without(path, tmp_path / "g.json", lambda e, spans: any(
        s < e["ts"] and e["ts"] + e["dur"] <= t for s, t in spans))
    ex = _experts(inside, cfg)
    assert ex["how"] == GROUPED and len(ex["passes"]) == 3
    assert all(p["counts"] == {} and p["grouped"] == "aten::_grouped_mm" and p["grouped_rows"] == 24
               for p in ex["passes"])
    assert "per-expert token counts are not in it" in ex["sentence"] and "24 rows per grouped GEMM" in ex["sentence"]
    assert ex["by_layer"] == []


def test_batched_mm_gathers_per_token_and_says_the_counts_are_not_in_it(tmp_path):
    path, cfg, _ = _hf_trace("qwen3_moe", "batched_mm", tmp_path / "t.json")
    ex = _experts(path, cfg)
    assert ex["how"] == GROUPED and [p["counts"] for p in ex["passes"]] == [{}, {}, {}]
    assert "aten::index of the [8, ...] expert weights" in ex["sentence"]
    assert "per-expert token counts are not in it" in ex["sentence"]


def test_without_concrete_inputs_the_experts_are_numbered_in_loop_order(tmp_path):
    """A trace without Concrete Inputs (older torch) has no expert index: the loop visits the experts hit in
    index order, so the counts by position are the true counts in index order, and the sentence says so."""
    path, cfg, seen = _hf_trace("mixtral", "eager", tmp_path / "t.json")
    d = json.loads(path.read_text())
    for e in d["traceEvents"]:
        (e.get("args") or {}).pop("Concrete Inputs", None)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(d))
    ex = _experts(bare, cfg)
    assert ex["how"] == BY_ORDER and "loop order" in ex["sentence"]
    for p, ids in zip(ex["passes"], seen):
        assert [p["counts"][str(i)] for i in range(len(p["counts"]))] == list(_truth(ids, cfg.n_experts).values())


def test_generate_numbers_the_steps_and_layers_of_each_phase(tmp_path):
    """Prefill of 12 tokens then 2 decode steps of 1: passes by phase, step and layer, each equal to its
    router call."""
    path, cfg, seen = _hf_trace("mixtral", "eager", tmp_path / "t.json", decode=2)
    ex = _experts(path, cfg)
    got = [(p["phase"], p["step"], p["layer"], p["tokens"]) for p in ex["passes"]]
    assert got == ([("prefill", 0, layer, T) for layer in range(3)]
                   + [("decode", s, layer, 1) for s in range(2) for layer in range(3)])
    for p, ids in zip(ex["passes"], seen):
        assert {int(e): n for e, n in p["counts"].items()} == _truth(ids, cfg.n_experts)
    dec = [g for g in ex["by_layer"] if g["phase"] == "decode"]
    assert [(g["layer"], g["steps"], g["tokens"], g["routed"]) for g in dec] == [(i, 2, 2, 4) for i in range(3)]


def test_our_models_torch_path_loops_per_expert(tmp_path):
    """kernels.moe.torch_moe selects w_gate[e], w_up[e], w_down[e]: counts by index, equal to the model's own
    expert_counts of each phase."""
    cfg = load_model("tiny-moe")
    torch.manual_seed(0)
    m = LlamaModel(cfg, dtype="fp32", backend="torch", max_slots=2, max_len=64)
    m.prefill(torch.arange(1, 9), slot=1)                           # warm-up outside the trace
    c0 = m.expert_counts.clone()
    path = tmp_path / "ours.json"
    with HT.one_thread(), capture(path, cuda=False) as cap:
        with cap.phase("prefill"):
            m.prefill(torch.arange(1, T + 1), slot=0)
        c1 = m.expert_counts.clone()
        with cap.phase("decode"):
            m.decode_step(torch.tensor([3]), torch.tensor([0]))
    c2 = m.expert_counts.clone()
    ex = _experts(path, cfg)
    assert ex["how"] == BY_INDEX and [(p["phase"], p["layer"]) for p in ex["passes"]] == [
        ("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1)]
    for p in ex["passes"]:
        want = (c1 - c0 if p["phase"] == "prefill" else c2 - c1)[p["layer"]].tolist()
        assert {int(e): n for e, n in p["counts"].items()} == {e: n for e, n in enumerate(want) if n}
        assert p["routed"] == (T if p["phase"] == "prefill" else 1) * 2 and p["complete"]


def test_a_dense_trace_has_no_experts_section(tmp_path):
    cfg = load_model("tiny")
    m = LlamaModel(cfg, dtype="fp32", backend="torch", max_slots=1, max_len=32)
    path = tmp_path / "dense.json"
    with HT.one_thread(), capture(path, cuda=False):
        m.prefill(torch.arange(1, 9), slot=0)
    assert "experts" not in analyze_trace(read_trace(path), model=cfg).summary
    assert "experts" not in analyze_trace(read_trace(path)).summary          # no --model: nothing to read by


def test_a_pass_counts_exactly():
    p = LayerPass("prefill", 0, 1, tokens=6, k=2, counts={0: 6, 3: 2, 5: 4}, how=BY_INDEX)
    assert (p.hit, p.routed, p.expected, p.complete) == (3, 12, 12, True)     # 6 + 2 + 4 = 12 = 6 x 2
    assert p.imbalance == pytest.approx(1.5)                                   # 6 / (12 / 3)
    short = LayerPass("prefill", 0, 1, tokens=6, k=2, counts={0: 6, 3: 2}, how=BY_INDEX)
    assert not short.complete and short.imbalance == pytest.approx(1.5)       # 6 / (8 / 2)
    ex = ExpertLoads(8, 2, (1,), [p])
    s = ex.sentence
    assert "prefill: 1 layer pass(es), 6 token(s) x top-2, 1 of 1 with every assignment seen" in s
    assert "experts hit 3 of 8" in s and "max/mean tokens per expert hit 1.50" in s
    assert "expert 0 with 6 of 12" in s
    assert ex.by_layer()[0]["counts"] == {"0": 6, "3": 2, "5": 4}
    assert "no router GEMM" in expert_sentence({"how": "not found", "passes": [], "n_experts": 8})


def _a(ex: dict, model):
    return SimpleNamespace(header=SimpleNamespace(kind="trace", model=model, settings={"experts": ex}))


def test_the_imbalance_rule_reads_the_traces_counts():
    model = load_model("tiny-moe")
    big = [LayerPass("prefill", s, 0, tokens=256, k=2, counts={0: 256, 1: 96, 2: 80, 3: 80}, how=BY_INDEX)
           for s in range(2)]
    f = expert_findings(_a(ExpertLoads(8, 2, (0, 1), big).to_json(), model), "trace")
    # summed: 512 of 1,024 on expert 0; mean 1,024 / 4 = 256 >= TRACE_MIN_MEAN; max/mean 512 / 256 = 2.0
    assert [x.rule for x in f] == ["expert-imbalance"]
    assert "expert 0 got 2.0x the mean tokens of the 4 experts hit" in f[0].claim
    assert "512 of 1,024 routed over 2 step(s)" in f[0].evidence
    few = [LayerPass("prefill", 0, 0, tokens=12, k=2, counts={0: 12, 1: 6, 2: 6}, how=BY_INDEX)]
    assert 12 * 2 / 3 < TRACE_MIN_MEAN                           # a mean of 8 tokens: chance, not judged
    assert expert_findings(_a(ExpertLoads(8, 2, (0, 1), few).to_json(), model), "trace") == []


def test_the_command_and_the_report_carry_the_counts(tmp_path):
    from profiler.cli import main
    from reports.trace_section import trace_facts
    from roofline.analysis import analyze
    from roofline.records import read_results

    path, _, seen = _hf_trace("qwen2_moe", "eager", tmp_path / "t.json")
    dev = tmp_path / "cpu.json"
    dev.write_text(json.dumps({"name": "test CPU", "kind": "cpu", "peak_tflops": {"fp32": 0.1}, "bandwidth_gbs": 20}))
    folder = M.checkpoint("qwen2_moe")
    res = CliRunner().invoke(main, ["trace", str(path), "--model", str(folder / "config.json"), "--device-file",
                                    str(dev), "--out", str(tmp_path / "out"), "--json", "--no-report"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [p["layer"] for p in out["experts"]["passes"]] == [0, 2]
    assert out["experts"]["passes"][0]["counts"] == {str(e): n for e, n in _truth(seen[0], 8).items()}
    a = analyze(read_results(tmp_path / "out" / "results.jsonl"))
    facts = trace_facts(a)
    assert facts[-1] == out["experts"]["sentence"] and "top-4" in facts[-1]
