"""Issue 31: `--allow-unknown-fields` on `profile` and `check` too (it was on explain, trace, latency, serve and
diagnose): a config key the family does not know is refused in one line without it; with it the run goes on, the
model's notes list the key, the result header records the flag and the resume command carries it."""

import json

from click.testing import CliRunner

from cli_errors import one_line_error
from profiler.cli import main
from roofline.records import read_results

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
         "my_new_feature": True}
PROFILE = ["profile", "--backends", "torch", "--phases", "decode", "--batches", "1", "--contexts", "8", "--budget-ms",
           "1", "--no-report", "--quiet"]


def folder(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d


def test_profile_refuses_an_unknown_key_and_goes_on_with_the_flag(tmp_path):
    d = folder(tmp_path)
    out = tmp_path / "o"
    one_line_error(CliRunner().invoke(main, [*PROFILE, "--model", str(d), "--out", str(out)]),
                   "my_new_feature = true", "--allow-unknown-fields")
    assert not out.exists()
    r = CliRunner().invoke(main, [*PROFILE, "--model", str(d), "--out", str(out), "--allow-unknown-fields"])
    assert r.exit_code == 0, r.output
    rf = read_results(out / "results.jsonl")
    assert rf.header.settings["allow_unknown_fields"] is True
    assert any("my_new_feature" in n and "ignored" in n for n in rf.header.model.notes)
    assert "--allow-unknown-fields" in rf.header.command


def test_check_takes_the_flag(tmp_path):
    d = folder(tmp_path)
    one_line_error(CliRunner().invoke(main, ["check", "--model", str(d), "--no-quality", "--backend", "torch"]),
                   "my_new_feature", "--allow-unknown-fields")
    r = CliRunner().invoke(main, ["check", "--model", str(d), "--no-quality", "--backend", "torch",
                                  "--allow-unknown-fields"])
    assert r.exit_code == 0 and "checks passed" in r.output, r.output
