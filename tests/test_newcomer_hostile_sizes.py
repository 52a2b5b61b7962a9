"""Issue 33, sizes no model has: a config.json with 10^9 layers, a hidden size of 2^40 or a vocabulary of 10^12 is
refused in one line naming the field, its value and the bound, by every command, before anything allocates; a
model inside the bounds that still cannot fit is refused by ``check --model`` before the allocator is asked."""

import json

import pytest
from click.testing import CliRunner

from cli_errors import one_line_error
from profiler.cli import main
from roofline.config_fields import MAX_SIZES
from roofline.errors import RooflineError
from roofline.models import PRESETS, ModelConfig, load_model

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256}

COMMANDS = {"explain": ["explain", "--context", "8"], "check": ["check", "--no-quality", "--backend", "torch"],
            "profile": ["profile", "--batches", "1", "--contexts", "8", "--backends", "torch"],
            "latency": ["latency", "--requests", "1", "--prompt-tokens", "8", "--output-tokens", "2"]}


def folder(tmp_path, **fields):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**LLAMA, **fields}))
    return d


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("field, value, shown, bound", [
    ("num_hidden_layers", 10 ** 9, "1,000,000,000", "4,096"),
    ("hidden_size", 2 ** 40, "1,099,511,627,776", "131,072"),
    ("vocab_size", 10 ** 12, "1,000,000,000,000", "16,777,216"),
    ("intermediate_size", 10 ** 400, "an integer of 401 digits", "1,048,576"),
])
def test_a_size_no_model_has_is_one_line_in_every_command(tmp_path, command, field, value, shown, bound):
    d = folder(tmp_path, **{field: value})
    res = CliRunner().invoke(main, [*COMMANDS[command], "--model", str(d), *(["--out", str(tmp_path / "o")]
                                                                             if command in ("profile", "latency")
                                                                             else [])])
    one_line_error(res, f"{field} is {shown}, past the largest this tool models ({bound};")
    assert not (tmp_path / "o").exists()


def test_the_bounds_hold_every_preset_and_refuse_the_dataclass_too():
    for name in PRESETS:
        cfg = load_model(name)
        assert cfg.n_layers <= MAX_SIZES["n_layers"] and cfg.vocab <= MAX_SIZES["vocab"]
    small = load_model("tiny")
    with pytest.raises(RooflineError, match="n_layers is 5,000, past the largest this tool models"):
        ModelConfig(**{**small.to_dict(), "n_layers": 5000, "notes": ()})
    assert ModelConfig(**{**small.to_dict(), "n_layers": MAX_SIZES["n_layers"], "notes": ()}).n_layers == 4096


def test_check_refuses_a_model_that_cannot_fit_before_allocating(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import profiler.sweep

    monkeypatch.setattr(profiler.sweep, "device_memory_bytes", lambda device: 16e9)
    d = folder(tmp_path, hidden_size=65536, num_attention_heads=64, num_key_value_heads=8, vocab_size=1 << 24)
    res = CliRunner().invoke(main, [*COMMANDS["check"], "--model", str(d)])
    one_line_error(res, "check --model m: the model checks hold three copies of the whole model (8.91 TB each in "
                        "fp32), more than this", "16 GB: check a smaller model (--model tiny)")


def test_a_mixture_of_10_9_experts_is_refused_by_its_config_name(tmp_path):
    d = folder(tmp_path, model_type="mixtral", num_local_experts=10 ** 9, num_experts_per_tok=2)
    res = CliRunner().invoke(main, [*COMMANDS["explain"], "--model", str(d)])
    one_line_error(res, "num_local_experts is 1,000,000,000, past the largest this tool models (65,536;")
    small = load_model("tiny-moe")
    with pytest.raises(RooflineError, match="moe_intermediate is 2,000,000, past the largest this tool models"):
        ModelConfig(**{**small.to_dict(), "moe_intermediate": 2_000_000, "notes": ()})


def test_serve_refuses_a_model_that_cannot_fit_before_it_binds(tmp_path):
    """Inside the size bounds but 16 TB of weights: `serve` says so in one line (as `latency` does) before it
    builds anything or opens a port, with the flags that would help."""
    d = folder(tmp_path, hidden_size=65536, intermediate_size=262144, num_hidden_layers=64, num_attention_heads=64,
               num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    res = CliRunner().invoke(main, ["serve", "--model", str(d), "--port", "0"])
    line = one_line_error(res, "of weights", "does not fit", "Give fewer --max-slots, a shorter --max-model-len")
    assert "Traceback" not in res.output and "DefaultCPUAllocator" not in line
