"""Model configs are checked where they enter: a config.json, the dataclass, a result-file header.

Every bad input is a one-line RooflineError naming the field, the bad value and the rule.
Run: pytest tests/test_inputs_model_config.py
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from roofline.errors import RooflineError
from roofline.models import PRESETS, ModelConfig, load_model

BASE = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512, "model_type": "llama"}


def write(tmp_path, text=None, **over):
    """tmp_path/config.json holding BASE updated by ``over`` (a key set to ... is dropped), or ``text``."""
    p = tmp_path / "config.json"
    if text is None:
        d = {**BASE, **over}
        text = json.dumps({k: v for k, v in d.items() if v is not ...})
    p.write_text(text)
    return p


def error(path) -> str:
    with pytest.raises(RooflineError) as e:
        load_model(str(path))
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert msg.startswith(f"model config {path}")
    return msg


# ---- files ----------------------------------------------------------------------------------

def test_a_binary_file_is_an_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    msg = error(p)
    assert "not a UTF-8 text file" in msg and "0x89" in msg


def test_a_folder_named_config_json_is_an_error(tmp_path):
    folder = tmp_path / "x" / "config.json"
    folder.mkdir(parents=True)
    # given the folder itself ...
    assert "is a folder, not a file" in error(folder)
    # ... or the folder above it, whose config.json is a folder
    with pytest.raises(RooflineError, match="is a folder, not a file"):
        load_model(str(tmp_path / "x"))


def test_a_folder_holding_config_json_loads(tmp_path):
    write(tmp_path)
    assert load_model(str(tmp_path)).hidden == 64


def test_an_unreadable_file_is_an_error(tmp_path, monkeypatch):
    p = write(tmp_path)
    real_bytes, real_text = Path.read_bytes, Path.read_text

    def deny(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", lambda self, *a, **k: deny(self) if self == p else real_bytes(self))
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: deny(self) if self == p else real_text(self, *a, **k))
    assert "cannot be read (permission denied)" in error(p)


def test_missing_file_and_bad_json_keep_their_messages(tmp_path):
    assert "does not exist" in error(tmp_path / "nope.json")
    assert "not valid JSON (line 1)" in error(write(tmp_path, "{not json"))
    assert "must hold a JSON object" in error(write(tmp_path, "[1, 2]"))


# ---- integer sizes --------------------------------------------------------------------------

@pytest.mark.parametrize("written, shown", [
    ("Infinity", "Infinity"), ("NaN", "NaN"), ("-Infinity", "-Infinity"), ("1e400", "1e400 (too large for a number)"),
    ("4096.5", "4096.5"), ("true", "true (a boolean)"), ('"4096"', '"4096" (a string)'), ("null", "null"),
    ("[64]", "[64] (a list)"), ("0", "0"), ("-64", "-64"),
])
def test_hidden_size_must_be_a_positive_integer(tmp_path, written, shown):
    text = json.dumps(BASE).replace('"hidden_size": 64', f'"hidden_size": {written}')
    msg = error(write(tmp_path, text))
    assert f"hidden_size must be a positive integer, but {shown} was given." in msg


@pytest.mark.parametrize("key", ["intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                 "max_position_embeddings"])
def test_every_size_is_checked(tmp_path, key):
    assert f"{key} must be a positive integer, but 2.5 was given." in error(write(tmp_path, **{key: 2.5}))


def test_an_integral_float_is_accepted_as_an_int(tmp_path):
    c = load_model(str(write(tmp_path, hidden_size=64.0, vocab_size=256.0)))
    assert c.hidden == 64 and type(c.hidden) is int and c.vocab == 256 and type(c.vocab) is int


def test_max_position_embeddings_below_one(tmp_path):
    assert "max_position_embeddings must be a positive integer, but 0 was given" in \
        error(write(tmp_path, max_position_embeddings=0))
    # absent: transformers' LlamaConfig default (roofline.families.llama.LLAMA_KEYS)
    assert load_model(str(write(tmp_path, max_position_embeddings=...))).max_context == 2048


# ---- heads ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -2])
def test_num_key_value_heads_zero_or_negative(tmp_path, value):
    msg = error(write(tmp_path, num_key_value_heads=value))
    assert msg.endswith(f"num_key_value_heads must be a positive integer (absent means num_attention_heads), "
                        f"but {value} was given.")


def test_num_key_value_heads_absent_or_null_means_all_heads(tmp_path):
    assert load_model(str(write(tmp_path, num_key_value_heads=...))).n_kv_heads == 4
    assert load_model(str(write(tmp_path, num_key_value_heads=None))).n_kv_heads == 4


def test_heads_must_group(tmp_path):
    msg = error(write(tmp_path, num_attention_heads=4, num_key_value_heads=3, head_dim=16))
    assert "num_attention_heads (4) must be a multiple of num_key_value_heads (3)" in msg


def test_odd_explicit_head_dim(tmp_path):
    msg = error(write(tmp_path, head_dim=15))
    assert "head_dim must be even (RoPE rotates pairs of dimensions), but it is 15" in msg


def test_odd_derived_head_dim(tmp_path):
    msg = error(write(tmp_path, hidden_size=60))   # 60 / 4 = 15
    assert "head_dim must be even" in msg and "15 (hidden_size 60 / num_attention_heads 4)" in msg


def test_hidden_not_divisible_by_heads_without_head_dim(tmp_path):
    msg = error(write(tmp_path, hidden_size=66))
    assert "hidden_size (66) must be a multiple of num_attention_heads (4) when no head_dim is given" in msg


def test_explicit_head_dim_zero_or_bad(tmp_path):
    assert "head_dim must be a positive integer (absent means hidden_size / num_attention_heads), but 0 was given" \
        in error(write(tmp_path, head_dim=0))
    assert 'but "16" (a string) was given' in error(write(tmp_path, head_dim="16"))


def test_explicit_head_dim_need_not_divide_hidden(tmp_path):
    c = load_model(str(write(tmp_path, hidden_size=66, head_dim=32)))
    assert c.head_dim == 32 and c.q_dim == 128


# ---- booleans and floats ----------------------------------------------------------------------

@pytest.mark.parametrize("value, shown", [("false", '"false" (a string)'), ("true", '"true" (a string)'),
                                          (0, "0"), (1, "1")])
def test_tie_word_embeddings_must_be_a_json_boolean(tmp_path, value, shown):
    msg = error(write(tmp_path, tie_word_embeddings=value))
    assert "tie_word_embeddings must be true or false" in msg and f"but {shown} was given." in msg


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), (None, False), (..., False)])
def test_tie_word_embeddings_real_booleans(tmp_path, value, expected):
    assert load_model(str(write(tmp_path, tie_word_embeddings=value))).tie_embeddings is expected


@pytest.mark.parametrize("key, written", [("rope_theta", "0"), ("rope_theta", "-10000.0"), ("rope_theta", "NaN"),
                                          ("rms_norm_eps", "0"), ("rms_norm_eps", "-1e-05"),
                                          ("rms_norm_eps", "Infinity"), ("rms_norm_eps", "NaN"),
                                          ("rms_norm_eps", '"1e-5"')])
def test_rope_theta_and_rms_eps_positive_finite(tmp_path, key, written):
    text = json.dumps(BASE)[:-1] + f', "{key}": {written}}}'
    msg = error(write(tmp_path, text))
    assert f"{key} must be a positive finite number" in msg and f"but {written}" in msg


def test_good_floats_are_parsed_exactly(tmp_path):
    c = load_model(str(write(tmp_path, rope_theta=1000000.0, rms_norm_eps=1e-6)))
    assert c.rope_theta == 1000000.0 and c.rms_eps == 1e-6 and c.notes == ()


# ---- RoPE formats -----------------------------------------------------------------------------

def test_rope_parameters_current_transformers_format(tmp_path):
    c = load_model(str(write(tmp_path, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})))
    assert c.rope_theta == 500000.0 and c.notes == ()


def test_top_level_rope_theta_wins_and_is_noted(tmp_path):
    c = load_model(str(write(tmp_path, rope_theta=10000.0,
                             rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})))
    assert c.rope_theta == 10000.0
    assert len(c.notes) == 1 and "disagree" in c.notes[0] and "10000" in c.notes[0] and "500000" in c.notes[0]
    same = load_model(str(write(tmp_path, rope_theta=500000.0, rope_parameters={"rope_theta": 500000})))
    assert same.rope_theta == 500000.0 and same.notes == ()


def test_rope_scaling_is_a_note_not_silent(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    c = load_model(str(write(tmp_path, rope_theta=500000.0, rope_scaling=scaling)))
    assert c.rope_theta == 500000.0
    (note,) = c.notes
    assert note.startswith("rope_scaling ") and '"llama3"' in note and "not modelled" in note
    assert "theta=500000" in note and "costs are unaffected" in note and "\n" not in note


def test_non_default_rope_type_in_rope_parameters_is_a_note(tmp_path):
    c = load_model(str(write(tmp_path, rope_parameters={"rope_theta": 1e6, "rope_type": "dynamic", "factor": 4.0},
                             rope_scaling={"rope_type": "dynamic", "factor": 4.0})))
    assert c.rope_theta == 1e6
    (note,) = c.notes          # the same scaling under both keys: one note
    assert '"dynamic"' in note and "not modelled" in note


def test_yarn_is_modelled_not_a_note(tmp_path):
    c = load_model(str(write(tmp_path, rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 128})))
    # (factor, beta_fast, beta_slow, original positions, attention factor 0.1 ln 4 + 1, truncate)
    assert c.notes == () and c.rope_yarn == pytest.approx((4.0, 32.0, 1.0, 128, 1.1386294361119891, True))


def test_default_or_null_rope_scaling_is_silent(tmp_path):
    assert load_model(str(write(tmp_path, rope_scaling=None))).notes == ()
    assert load_model(str(write(tmp_path, rope_scaling={"rope_type": "default"}))).notes == ()


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_rope_dicts_of_the_wrong_type(tmp_path, key):
    msg = error(write(tmp_path, **{key: "linear"}))
    assert f"{key} must be an object" in msg and '"linear" (a string)' in msg


def test_bad_rope_theta_inside_rope_parameters(tmp_path):
    msg = error(write(tmp_path, rope_parameters={"rope_theta": -1, "rope_type": "default"}))
    assert "rope_parameters.rope_theta must be a positive finite number" in msg and "but -1 was given" in msg


# ---- notes round-trip and from_dict -------------------------------------------------------------

def test_notes_in_to_dict_and_from_dict(tmp_path):
    c = load_model(str(write(tmp_path, rope_scaling={"rope_type": "linear", "factor": 2.0})))
    d = c.to_dict()
    assert isinstance(d["notes"], list) and d["notes"] == list(c.notes)
    back = ModelConfig.from_dict(json.loads(json.dumps(d)))
    assert back == c and back.notes == c.notes
    assert replace(c, notes=()) == c  # notes do not take part in equality


def test_presets_unchanged():
    t = PRESETS["tiny"]
    assert (t.hidden, t.intermediate, t.n_layers, t.n_heads, t.n_kv_heads, t.vocab, t.max_context, t.head_dim) == \
        (64, 176, 2, 4, 2, 256, 512, 16)
    assert PRESETS["llama-3-8b"].rope_theta == 500000.0 and PRESETS["qwen2.5-7b"].rms_eps == 1e-6
    noted = {"gemma-3-12b", "gemma-3-27b"}   # their linear RoPE scaling (global layers) is a note; YaRN is modelled
    for p in PRESETS.values():
        assert (p.notes == ()) == (p.name not in noted) and ModelConfig.from_dict(p.to_dict()) == p


def test_from_dict_ignores_unknown_keys():
    d = dict(PRESETS["tiny"].to_dict(), something_new=3)
    assert ModelConfig.from_dict(d) == PRESETS["tiny"]
    old = PRESETS["tiny"].to_dict()
    del old["notes"]                 # headers written before notes existed
    assert ModelConfig.from_dict(old).notes == ()


@pytest.mark.parametrize("key, value, expect", [
    ("hidden", "64", 'hidden must be a positive integer, but "64" (a string) was given'),
    ("n_kv_heads", 0, "n_kv_heads must be a positive integer, but 0 was given"),
    ("n_layers", True, "n_layers must be a positive integer, but true (a boolean) was given"),
    ("head_dim", 17, "head_dim must be even"),
    ("rope_theta", None, "rope_theta must be a positive finite number"),
    ("rms_eps", -1.0, "rms_eps must be a positive finite number"),
    ("tie_embeddings", "false", 'tie_embeddings must be true or false'),
    ("notes", "x", "notes must be a list of sentences"),
    ("notes", [1], "notes must be a list of sentences"),
    ("name", 7, "name must be a string, but 7 was given"),
])
def test_from_dict_names_the_bad_field(key, value, expect):
    d = dict(PRESETS["tiny"].to_dict(), **{key: value})
    with pytest.raises(RooflineError) as e:
        ModelConfig.from_dict(d)
    assert expect in str(e.value)


def test_from_dict_missing_key_and_not_a_dict():
    d = PRESETS["tiny"].to_dict()
    del d["vocab"]
    with pytest.raises(RooflineError, match="missing the key 'vocab'"):
        ModelConfig.from_dict(d)
    with pytest.raises(RooflineError, match="must be a JSON object"):
        ModelConfig.from_dict([1, 2])


def test_dataclass_checks_the_same_rules():
    with pytest.raises(RooflineError, match=r"model 'x': n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        ModelConfig("x", 64, 176, 2, 4, 3, 256, 512)
    with pytest.raises(RooflineError, match="head_dim must be even"):
        ModelConfig("x", 60, 176, 2, 4, 2, 256, 512)
    with pytest.raises(RooflineError, match=r"hidden \(66\) must be a multiple of n_heads \(4\)"):
        ModelConfig("x", 66, 176, 2, 4, 2, 256, 512)
    assert ModelConfig("x", 64.0, 176, 2, 4, 2, 256, 512).hidden == 64


def test_an_unmodelled_rope_scaling_is_said_once_by_the_commands(tmp_path):
    from click.testing import CliRunner

    from profiler.cli import main

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                             "max_position_embeddings": 512, "rope_parameters": {"rope_theta": 500000.0},
                             "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    r = CliRunner().invoke(main, ["explain", "--model", str(p), "--phase", "decode", "--batch", "1", "--context", "8"])
    assert r.exit_code == 0, r.output
    assert r.output.count("is not modelled") == 1 and "theta=500000" in r.output
    r = CliRunner().invoke(main, ["latency", "--model", str(p), "--requests", "1", "--prompt-tokens", "8",
                                  "--output-tokens", "2", "--out", str(tmp_path / "L")])
    assert r.exit_code == 0, r.output
    assert r.output.count("is not modelled") == 1
