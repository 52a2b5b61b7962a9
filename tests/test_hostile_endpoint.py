"""``roofline latency --endpoint`` against a hostile server (``tests/hostile_server.py``, issue 23): every fault is
a failed request with its reason, or a counted and labelled disagreement; never a traceback, an unreadable file,
an unbounded count or a leaked key."""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from profiler.cli import main  # noqa: E402
from profiler.endpoint import SSE, Failed, _event, _Stream, scrub, split_tokens  # noqa: E402
from roofline.records import read_results  # noqa: E402
from tests.hostile_server import hostile_server  # noqa: E402

KEY = "sk-proj-Zq8x3Secret0123456789"


@pytest.fixture(scope="module")
def server():
    with hostile_server() as (url, state):
        yield url, state


def run(url, model, out, *extra):
    r = CliRunner().invoke(main, ["latency", "--endpoint", url, "--model-name", model, "--requests", "2",
                                  "--prompt-tokens", "8", "--output-tokens", "4", "--rate", "100", "--arrival",
                                  "fixed", "--timeout", "1", "--api-key", KEY, "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    assert KEY not in r.output and "Traceback" not in r.output
    raw = (out / "latency.jsonl").read_text()
    assert KEY not in raw and KEY[8:20] not in raw            # not the key, not a piece of it
    return read_results(out / "latency.jsonl").requests, r.output


def test_usage_that_claims_more_than_was_asked_for_is_kept_but_not_believed(server, tmp_path):
    ts, out = run(server[0], "lying-usage", tmp_path / "lie")
    assert [(t.ok, t.n, t.served_output_tokens, t.token_counts) for t in ts] == \
        [(True, 4, 1000, "usage beyond the request")] * 2
    assert all(t.chunk_tokens == (1, 1, 1, 1) for t in ts)
    ts, _ = run(server[0], "huge-usage", tmp_path / "huge")          # 10**9 claimed: no MemoryError, 4 counted
    assert [(t.n, t.served_output_tokens, t.token_counts) for t in ts] == [(4, 10**9, "usage beyond the request")] * 2
    assert "2 of 2 requests reported usage beyond the 4 tokens asked for" in out


def test_usage_of_the_wrong_type_is_no_count(server, tmp_path):
    ts, _ = run(server[0], "nan-usage", tmp_path)
    assert [(t.ok, t.n, t.served_output_tokens, t.token_counts) for t in ts] == \
        [(True, 4, None, "one per chunk, no usage")] * 2


def test_an_echoed_api_key_is_redacted_everywhere(server, tmp_path):
    ts, out = run(server[0], "echo-key", tmp_path / "401")
    assert [t.error for t in ts] == ["http 401: Incorrect API key provided: Bearer [redacted]. You can find your "
                                     "API key at https://example.invalid."] * 2
    ts, _ = run(server[0], "echo-event", tmp_path / "event")
    assert [t.error for t in ts] == ["error event: Incorrect API key provided: Bearer [redacted]"] * 2
    assert f"Bearer {KEY}" in server[1]["auth"]                     # it was sent, only never kept


def test_a_nested_event_and_a_cut_stream_are_failed_requests_with_reasons(server, tmp_path):
    ts, _ = run(server[0], "nested", tmp_path / "nested")
    assert all(t.error.startswith("malformed event: not JSON (the event is nested deeper than 32 levels")
               for t in ts), [t.error for t in ts]
    ts, _ = run(server[0], "cut", tmp_path / "cut")
    assert [t.error.split(":")[0] for t in ts] == ["disconnected"] * 2 and [t.n for t in ts] == [2, 2]


def test_scrub_takes_out_keys_and_authorization_values():
    assert scrub(f"bad key {KEY}", KEY) == "bad key [redacted]"
    assert scrub('{"Authorization": "Bearer abc.def"}') == '{"Authorization": "Bearer [redacted]"}'
    assert scrub("authorization: Basic dXNlcjpwYXNz") == "authorization: Basic [redacted]"
    assert scrub("api_key=xyz123 and bearer  tok") == "api_key=[redacted] and bearer  [redacted]"


def test_split_tokens_never_counts_more_than_the_request():
    chunks = [(0.1 * i, None) for i in range(4)]
    assert split_tokens(chunks, 10**9, False, 4) == ([1, 1, 1, 1], "usage beyond the request")
    assert split_tokens(chunks, 6, False, 8) == ([1, 1, 2, 2], "spread from usage")      # 2 extra over chunks 2..4
    per = [(0.1, 1), (0.2, 2), (0.3, 997)]
    assert split_tokens(per, None, True, 4) == ([1, 1, 1], "usage beyond the request")
    assert split_tokens([(0.0, None)] * 6, None, False, 4) == ([1] * 6, "chunks beyond the request")


def test_the_sse_parser_never_raises_anything_but_a_failed_request():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=10)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.sampled_from(["choices", "usage", "text", "delta", "content",
                                                              "completion_tokens", "finish_reason", "error",
                                                              "message", "role", "object"]), inner, max_size=4),
                          max_leaves=16)
    lines = st.one_of(values.map(lambda v: "data: " + json.dumps(v)), st.text(max_size=40),
                      st.sampled_from(["", ": ping", "data: [DONE]", "data: {", "data: " + "[" * 5000, "event: x"]))

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.lists(lines, max_size=12), st.sampled_from(["completions", "chat"]), st.integers(1, 64))
    def check(feed, api, max_tokens):
        s, sse = _Stream(sent=0.0), SSE()
        try:
            for i, line in enumerate(feed):
                data = sse.feed(line)
                if data is not None and not s.done:
                    _event(s, data, 0.01 * i, api, KEY)
        except Failed as e:
            assert KEY not in str(e)
        counts, _ = split_tokens(s.chunks, None, s.per_chunk, max_tokens) if s.chunks else ([], "")
        assert sum(counts) <= max(max_tokens, len(s.chunks))

    check()


# ------------------------------------------------------------------ diagnose of endpoint runs (issues 22 and 23)

def diagnose(path, *extra):
    r = CliRunner().invoke(main, ["diagnose", str(path), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_diagnose_tells_the_latency_story_of_an_endpoint_run(server, tmp_path):
    run(server[0], "ok", tmp_path)
    (split,) = [f for f in diagnose(tmp_path / "latency.jsonl") if f["rule"] == "latency-split"]
    assert split["claim"].startswith("[endpoint=completions,concurrency=unlimited] Mean TTFT ")
    assert "= client queue " in split["claim"] and "TPOT p50 " in split["claim"] and "ITL p50 " in split["claim"]
    assert split["evidence"].startswith("2 ok requests (0 failed), measured from the client")


def test_the_endpoint_floor_uses_the_dtype_the_run_recorded_or_was_given_and_says_which(server, tmp_path):
    run(server[0], "ok", tmp_path, "--model", "tiny")                  # the server lists dtype fp32
    assert read_results(tmp_path / "latency.jsonl").header.dtype == "fp32"
    floors = [f for f in diagnose(tmp_path / "latency.jsonl", "--device", "h100") if f["rule"] == "latency-floor"]
    assert {f["data"]["metric"] for f in floors} == {"TTFT", "TPOT"}
    assert all("tiny (fp32, listed by the server (GET /v1/models))" in f["evidence"] for f in floors)
    floors = [f for f in diagnose(tmp_path / "latency.jsonl", "--device", "h100", "--dtype", "bf16")
              if f["rule"] == "latency-floor"]
    assert all("tiny (bf16, given with --dtype)" in f["evidence"] for f in floors)
    run(server[0], "lying-usage", tmp_path / "none", "--model", "tiny")  # a server that names no dtype
    floors = [f for f in diagnose(tmp_path / "none" / "latency.jsonl", "--device", "h100")
              if f["rule"] == "latency-floor"]
    assert floors and all("(bf16, assumed: neither --dtype nor the server named it)" in f["evidence"] for f in floors)


def test_diagnose_of_a_run_where_every_request_failed_says_so_and_why(server, tmp_path):
    run(server[0], "echo-key", tmp_path)
    found = [f for f in diagnose(tmp_path / "latency.jsonl") if f["rule"] != "noisy-run"]   # the host's load aside
    assert [f["rule"] for f in found] == ["requests-failed"]
    assert found[0]["claim"] == ("[endpoint=completions,concurrency=unlimited] All 2 requests failed (2 http 401): "
                                 "there is no latency to diagnose.")
    assert "Incorrect API key provided: Bearer [redacted]" in found[0]["evidence"] and KEY not in found[0]["evidence"]


def test_a_password_or_key_in_the_endpoint_url_is_never_printed_or_recorded(tmp_path):
    from profiler.endpoint import public_url
    from profiler.endpoint_run import EndpointRun
    from profiler.run import redact

    url = f"https://me:{KEY}@example.invalid:8000/v1?api_key={KEY}&mode=fast"
    shown = "https://me:[redacted]@example.invalid:8000/v1?api_key=[redacted]&mode=fast"
    assert public_url(url) == shown
    assert public_url(f"http://{KEY}@h") == "http://[redacted]@h"      # a bare token as the user name
    assert public_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    run = EndpointRun(url=url, out=tmp_path)
    assert run.settings("m")["endpoint"] == shown and KEY not in run.command()
    assert redact(["latency", "--endpoint", url, "--api-key", KEY]) == ["latency", "--endpoint", shown,
                                                                         "--api-key", "***"]
    r = CliRunner().invoke(main, ["latency", "--endpoint", f"ftp://me:{KEY}@h", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and KEY not in r.output and "ftp://me:[redacted]@h" in r.output, r.output
    r = CliRunner().invoke(main, ["latency", "--endpoint", f"http://me:{KEY}@127.0.0.1:1", "--connect-timeout", "1",
                                  "--requests", "1", "--out", str(tmp_path / "y")])
    assert r.exit_code != 0 and KEY not in r.output and "me:[redacted]@127.0.0.1:1" in r.output, r.output
