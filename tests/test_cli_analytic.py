"""`roofline devices` and `roofline explain`: output numbers, JSON shape, one-line errors."""

import json

import pytest
from click.testing import CliRunner

from profiler.cli import main
LLAMA_OPS = ["embedding", "attn_norm", "q_proj", "k_proj", "v_proj", "rope", "kv_append", "attention", "o_proj", "attn_residual", "mlp_norm", "gate_proj", "up_proj", "swiglu", "down_proj", "mlp_residual", "final_norm", "lm_head"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_devices_table_and_json():
    r = run("devices")
    assert r.exit_code == 0 and "h100-sxm" in r.output and "295" in r.output
    data = json.loads(run("devices", "--json").output)
    h100 = next(d for d in data if d["key"] == "h100-sxm")
    assert h100["ridge"]["bf16"] == pytest.approx(295.22, rel=1e-3)


def test_explain_linear_walks_the_seed():
    r = run("explain", "linear", "--tokens", "1024", "--in", "4096", "--out", "4096", "--dtype", "bf16",
            "--device", "h100")
    assert r.exit_code == 0, r.output
    assert "33,554,432 bytes" in r.output
    assert "34,359,738,368" in r.output
    assert "1,024.0 FLOP/byte" in r.output
    assert "295.2" in r.output and "compute-bound" in r.output
    d = json.loads(run("explain", "linear", "--tokens", "1", "--in", "4096", "--out", "4096", "--json").output)
    assert d["weight_only_intensity"] == 1.0 and d["bound"] == "memory"


def test_explain_phase_json_shape():
    r = run("explain", "--model", "llama-2-7b", "--device", "h100", "--phase", "decode", "--batch", "1",
            "--context", "1024", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["phase"] == "decode" and d["model"] == "llama-2-7b"
    assert [o["name"] for o in d["ops"]] == LLAMA_OPS
    for o in d["ops"]:
        assert set(o) >= {"name", "count", "flops", "bytes", "intensity", "bound", "time_s"}
    assert set(d["total"]) >= {"flops", "bytes", "intensity", "bound", "time_s"}
    assert d["total"]["bound"] == "memory"
    q = next(o for o in d["ops"] if o["name"] == "q_proj")
    assert q["count"] == 32 and q["flops"] == 2 * 4096 * 4096


def test_explain_prefill_text_verdict():
    r = run("explain", "--model", "llama-3-8b", "--phase", "prefill", "--batch", "1", "--context", "4096")
    assert r.exit_code == 0, r.output
    assert "compute-bound" in r.output.splitlines()[-1]


def test_custom_device_flags():
    d = json.loads(run("explain", "--peak-tflops", "100", "--bandwidth-gbs", "1000", "--json").output)
    assert d["ridge"] == pytest.approx(100.0)


@pytest.mark.parametrize("args, msg", [
    (["explain", "--model", "gpt-17"], "Presets:"),
    (["explain", "--device", "tpu"], "Known devices"),
    (["explain", "--batch", "0"], "batch must be at least 1"),
    (["explain", "--batch", "-3"], "batch must be at least 1"),
    (["explain", "--phase", "prefill", "--context", "100", "--chunk", "500"], "larger than the prompt"),
    (["explain", "--phase", "prefill", "--context", "100", "--cached", "100"], "shorter than the prompt"),
    (["explain", "linear", "--tokens", "8"], "needs --in, --out"),
    (["explain", "--weight-dtype", "int3"], "Unknown dtype"),
])
def test_bad_input_is_one_line(args, msg):
    r = run(*args)
    assert r.exit_code == 2
    assert msg in r.output
    assert "Traceback" not in r.output


def test_bad_config_json_names_missing_key(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    r = run("explain", "--model", str(p))
    assert r.exit_code == 2 and "'intermediate_size'" in r.output
    p.write_text("{not json")
    r = run("explain", "--model", str(p))
    assert r.exit_code == 2 and "not valid JSON" in r.output


def test_hf_config_loads(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
                             "max_position_embeddings": 2048, "_name_or_path": "my-model",
                             "model_type": "llama"}))
    d = json.loads(run("explain", "--model", str(p), "--json").output)
    assert d["model"] == "my-model"
    k = next(o for o in d["ops"] if o["name"] == "k_proj")
    assert k["flops"] == 2 * 256 * 128  # kv_dim = 2 heads x 64


@pytest.mark.parametrize("cmd", [["ceilings"], ["env"], ["latency"]])
def test_measuring_commands_refuse_a_catalogue_name_as_torch_device(cmd):
    r = run(*cmd, "--device", "h100")
    assert r.exit_code == 2
    assert "must be cpu, cuda or cuda:N" in r.output and "Traceback" not in r.output


def test_explain_mix_prices_a_continuous_batching_step():
    r = run("explain", "--model", "llama-3-8b", "--device", "h100", "--mix", "prefill=1x512@1536,decode=31x2048",
            "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    q = next(o for o in d["ops"] if o["name"] == "q_proj")
    assert d["phase"] == "mixed" and q["flops"] == 2 * 543 * 4096 * 4096      # every linear on the 543 tokens
    text = run("explain", "--model", "llama-3-8b", "--device", "h100", "--mix", "prefill=1x512@1536,decode=31x2048")
    assert "mixed step of 32 sequences, 543 tokens through the linears, the longest 2,048" in text.output
    for extra, says in ((["--batch", "4"], "--mix describes the whole step: drop --phase, --batch"),
                        (["--context", "9"], "--mix describes the whole step"),):
        bad = run("explain", "--model", "llama-3-8b", "--mix", "decode=4x128", *extra)
        assert bad.exit_code != 0 and says in bad.output
    bad = run("explain", "--model", "llama-3-8b", "--mix", "decode=4x999999")
    assert bad.exit_code != 0 and "past llama-3-8b's maximum context" in bad.output
