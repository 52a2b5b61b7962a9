"""``roofline latency`` and ``roofline diagnose`` through click: bad input, and short real-model runs."""

import json
import math

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline.latency import RequestTimeline
from roofline.records import read_results


@pytest.mark.parametrize("args,msg", [
    (["--slo", "ttft=fast"], "SLO 'ttft=fast' is malformed"),
    (["--slo", "latency=2s"], "SLO metric 'latency' is unknown"),
    (["--rate", "0"], "--rate must be between 0.001 and 1e+06 requests per second, but 0 was given"),
    (["--rate", "-2"], "--rate must be between 0.001 and 1e+06 requests per second"),
    (["--rate", "1e-300"], "--rate must be between 0.001 and 1e+06 requests per second, but 1e-300 was given"),
    (["--rate", "nan"], "--rate must be between 0.001 and 1e+06"),
    (["--rate", "inf"], "--rate must be between 0.001 and 1e+06"),
    (["--output-tokens", "0"], "--output-tokens must be from 1 (prefill already yields the first token)"),
    (["--chunk", "0"], "--chunk must be from 1 to 1048576 tokens per step, but 0 was given"),
    (["--sweep-chunks", "16,0"], "--sweep-chunks entry must be from 1 to 1048576 tokens"),
    (["--requests", "0"], "--requests must be from 1 to 100000"),
    (["--block-size", "0"], "--block-size must be from 1"),
    (["--max-slots", "0"], "--max-slots must be from 1 to 4096"),
    (["--threads", "100000"], "must be between 1 and this machine's"),
    (["--device", "tpu"], "must be cpu, cuda or cuda:N"),
    (["--sweep-chunks", "16,lots"], "--sweep-chunks entry 'lots' is not a token count"),
    (["--shared-prefix", "999"], "--shared-prefix must be between 0 and the prompt length"),
])
def test_bad_input_is_one_line_and_nothing_runs(tmp_path, args, msg):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["latency", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and msg in lines[0], r.output
    assert not out.exists()                      # nothing ran, nothing written


def test_diagnose_missing_file_is_one_line(tmp_path):
    r = CliRunner().invoke(main, ["diagnose", str(tmp_path / "nope.jsonl")])
    assert r.exit_code == 2 and "does not exist" in r.output and len(r.output.strip().splitlines()) == 1


def ordered(t: RequestTimeline) -> bool:
    seq = [t.arrival, *t.tokenize, *t.queue]
    for s, e, _ in t.chunks:
        seq += [s, e]
    seq += [t.first_selected, *t.deliveries, t.finish]
    return all(b >= a for a, b in zip(seq, seq[1:]))


def test_real_model_run_writes_ordered_timelines_and_summary(tmp_path):
    r = CliRunner().invoke(main, ["latency", "--model", "tiny", "--requests", "4", "--prompt-tokens", "40",
                                  "--output-tokens", "5", "--rate", "50", "--arrival", "fixed", "--chunk", "16",
                                  "--slo", "ttft=10s,tpot=5s", "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (s,) = doc["summaries"]
    assert s["requests"] == 4 and s["failed"] == 0 and s["met_slo"] == 4
    assert any(f.startswith("TTFT = ") for f in doc["formulas"])
    rf = read_results(tmp_path / "latency.jsonl")
    assert rf.header.kind == "latency" and rf.header.model_name == "tiny"
    reqs, steps = rf.requests, rf.serving_steps
    assert len(reqs) == 4 and all(t.ok and t.n == 5 and ordered(t) for t in reqs)
    assert all(sum(c[2] for c in t.chunks) == 40 for t in reqs)            # 40 tokens, no shared prefix
    assert all(c[2] <= 16 for t in reqs for c in t.chunks)                  # chunked under the budget
    assert steps and all(st.decode + st.prefill <= 16 for st in steps)
    assert [t.arrival for t in reqs] == pytest.approx([0.0, 0.02, 0.04, 0.06])   # fixed rate 50/s


def test_real_model_prefix_reuse_cuts_prefilled_tokens_and_ttft(tmp_path):
    # arrivals 0.5 s apart: no queueing, so TTFT is prefill; 384 of 400 tokens are shared (24 blocks)
    r = CliRunner().invoke(main, ["latency", "--model", "small", "--requests", "4", "--prompt-tokens", "400",
                                  "--output-tokens", "3", "--rate", "2", "--arrival", "fixed", "--chunk", "512",
                                  "--shared-prefix", "390", "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    off, on = json.loads(r.stdout)["summaries"]
    assert off["config"].endswith("prefix-cache=off") and on["config"].endswith("prefix-cache=on")
    assert off["prefilled_tokens"] == 4 * 400
    # request 0 prefills 400; each later one reuses 384 (24 full blocks of 16) and prefills 16
    assert on["prefilled_tokens"] == 400 + 3 * 16 and on["cached_tokens"] == 3 * 384
    rf = read_results(tmp_path / "latency.jsonl")
    ttft = {cfg: sorted(t.ttft for t in rf.requests if t.config == cfg and t.id > 0)
            for cfg in (off["config"], on["config"])}
    # noise on a shared CPU only adds time, so compare the fastest: 16 tokens vs 400 tokens of prefill
    assert min(ttft[on["config"]]) < 0.7 * min(ttft[off["config"]])
    assert not math.isnan(on["tpot"]["p50"])


def test_diagnose_cli_on_a_latency_run(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["latency", "--model", "tiny", "--requests", "3", "--prompt-tokens", "48",
                             "--output-tokens", "4", "--rate", "100", "--shared-prefix", "40", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "TTFT = first token delivered - arrival" in r.output and "prefix-cache=off" in r.output
    d = runner.invoke(main, ["diagnose", str(tmp_path / "latency.jsonl"), "--json"])
    assert d.exit_code == 0, d.output
    found = json.loads(d.stdout)
    assert {"latency-split", "prefix-reuse"} <= {f["rule"] for f in found}
    prefix = [f for f in found if f["rule"] == "prefix-reuse"]
    assert len(prefix) == 1 and "prefix-cache=off" in prefix[0]["claim"]    # only the run without reuse
    text = runner.invoke(main, ["diagnose", str(tmp_path / "latency.jsonl")]).output
    assert "evidence:" in text and "try:" in text
