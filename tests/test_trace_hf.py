"""A Hugging Face LlamaForCausalLM (random weights, built from a config, no download) traced on the CPU.

``transformers`` is a test-only dependency (the ``test`` extra); these tests skip when it is
not installed.
"""

import json
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from profiler.capture import capture  # noqa: E402
from profiler.cli import main  # noqa: E402
from roofline import workload as W  # noqa: E402
from roofline.cost import ZERO  # noqa: E402
from roofline.models import load_model  # noqa: E402
from roofline.traces.analyze import analyze_trace  # noqa: E402
from roofline.traces.events import read_trace  # noqa: E402

PROMPT, NEW = 8, 4
HF = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          vocab_size=256, max_position_embeddings=128, tie_word_embeddings=False)
FP = dict(weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    cfg = transformers.LlamaConfig(**HF)
    cfg.save_pretrained(tmp)                       # config.json: what `--model` reads
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, PROMPT))
    path = tmp / "hf.json.gz"
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)          # warm-up, outside the trace
        with capture(path):
            model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return tmp, path, analyze_trace(read_trace(path))


def test_prefill_and_decode_found_from_the_forward_sequence(hf):
    _, _, r = hf
    ph = r.summary["phases"]
    assert ph["prefill"]["steps"] == 1 and ph["decode"]["steps"] == NEW - 1
    assert "forward sequence" in ph["prefill"]["method"]
    assert (ph["prefill"]["batch"], ph["prefill"]["context"]) == (1, PROMPT)
    assert (ph["decode"]["batch"], ph["decode"]["context"]) == (1, PROMPT)   # first decode: 8 cached tokens


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_gemms_are_costed_exactly(hf, phase):
    tmp, _, r = hf
    cfg = load_model(tmp / "config.json")
    step = W.prefill(cfg, 1, PROMPT, **FP) if phase == "prefill" else W.decode(cfg, 1, PROMPT, **FP)
    linears = [o for o in step.ops if o.name.endswith("_proj") or o.name == "lm_head"]
    gemms = [m for m in r.measurements if m.point.phase == phase and m.config["category"] == "gemm"
             and m.point.op.startswith("aten::mm")]
    for m in gemms:                                       # each is one of the model's linear layers exactly
        assert any(m.point.cost == o.cost for o in linears), m.point.op
    # per step (a decode phase of 3 steps: counts are instances / 3) they are all of them, nothing more
    per_step = sum((m.point.cost * m.point.count for m in gemms), ZERO)
    assert per_step == sum((o.total for o in linears), ZERO)


def test_attention_costed_per_decode_context(hf):
    _, _, r = hf
    att = {m.point.op: m for m in r.measurements if m.point.phase == "decode" and m.config["category"] == "attention"}
    # one SDPA shape per decode step (9, 10, 11 keys), each in one of three steps: count 2 layers / 3
    assert sorted(a.config["detail"]["s_kv"] for a in att.values()) == [9, 10, 11]
    assert all(a.point.count == pytest.approx(2 / 3) for a in att.values())


def test_uncosted_share_is_reported(hf):
    _, _, r = hf
    s = r.summary
    # a share of measured time: under load any op can take most of it, so its value is not bounded here
    assert 0 < s["uncosted_share"] < 1 and s["uncosted_share"] == pytest.approx(s["uncosted_s"] / s["attributed_s"])
    top = [u["time_s"] for u in s["top_uncosted"]]          # the largest uncosted ops: a part of the whole
    assert top and top == sorted(top, reverse=True) and sum(top) <= s["uncosted_s"] * (1 + 1e-9)
    assert s["costed_s"] + s["uncosted_s"] + s["framework_s"] + s["communication_s"] == pytest.approx(s["attributed_s"])


def test_the_command_writes_a_result_file_with_the_model_expectation(hf, tmp_path):
    tmp, path, _ = hf
    dev = tmp_path / "cpu.json"
    dev.write_text(json.dumps({"name": "test CPU", "kind": "cpu", "peak_tflops": {"fp32": 0.1},
                               "bandwidth_gbs": 20}))
    res = CliRunner().invoke(main, ["trace", str(path), "--model", str(tmp / "config.json"), "--device-file",
                                    str(dev), "--out", str(tmp_path / "out"), "--json", "--no-report"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {s["phase"] for s in out["steps"]} == {"prefill", "decode"}
    e = out["model_expectation"]["decode"]
    cfg = load_model(tmp / "config.json")
    assert e["model_flops"] == W.decode(cfg, 1, PROMPT, **FP).total.flops
    assert e["traced_flops"] > 0 and e["not_modelled_s"] >= 0
    assert out["ranks"][0]["uncosted_share"] > 0


def test_without_forward_marks_each_embedding_starts_a_forward(hf, tmp_path):
    tmp, _, _ = hf
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF)).eval()
    path = tmp_path / "plain.json"
    with torch.no_grad():
        model.generate(torch.randint(0, 256, (1, PROMPT)), max_new_tokens=2, do_sample=False)
        with capture(path, mark_forwards=False):
            model.generate(torch.randint(0, 256, (1, PROMPT)), max_new_tokens=NEW, min_new_tokens=NEW,
                           do_sample=False)
    r = analyze_trace(read_trace(path))
    ph = r.summary["phases"]
    assert "embedding" in ph["prefill"]["method"] and "token ids" in ph["prefill"]["method"]
    assert ph["prefill"]["steps"] == 1 and ph["decode"]["steps"] == NEW - 1
