"""``roofline latency --endpoint`` against a scripted OpenAI-compatible server (loopback only).

The server is a tiny Starlette app on uvicorn in a thread of this process, on 127.0.0.1 and an
ephemeral port; it stops at the end of the module. Its "models" are scripts:

* ``/tokenize`` counts one token per 4 characters (and one for <bos>), as a BPE tokenizer roughly would;
* ``paced``: first chunk 30 ms after the request arrives, then chunks 10, 10, 24 and 10 ms apart;
  the 24 ms chunk carries three tokens (usage in every chunk says so): 7 tokens in all;
* ``paced-no-usage``: the same stream with usage only at the end (the client must spread);
* ``faulty``: request i (in arrival order) gets FAULTS[i]: ok, an error event mid-stream, a stall
  past the timeout, HTTP 500, a JSON body instead of a stream, a malformed event, a stream that
  ends without [DONE].
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from profiler.cli import main  # noqa: E402
from profiler.endpoint import SSE, deliveries, split_tokens  # noqa: E402
from profiler.run import redact  # noqa: E402
from roofline.latency import latency_runs  # noqa: E402
from roofline.records import read_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MS = 1e-3
# (seconds after the previous chunk, text, tokens in the chunk)
PACED = [(0.030, "a", 1), (0.010, "b", 1), (0.010, "c", 1), (0.024, "def", 3), (0.010, "g", 1)]
TTFT, ITLS, TPOT = 30 * MS, [10 * MS, 10 * MS, 8 * MS, 8 * MS, 8 * MS, 10 * MS], 54 * MS / 6
FAULTS = ["ok", "error-event", "stall", "http-500", "not-sse", "malformed", "no-done"]
CHUNK_GAPS = [10 * MS, 10 * MS, 24 * MS, 10 * MS]   # the paced server's sleeps between its 5 chunks, after TTFT
SLACK = 0.5 * MS    # two monotonic clocks read a sleep's ends: never early by more than this


def _chunk(model, text, usage=None, finish=None, choices=True):
    d = {"id": "x", "object": "text_completion", "model": model,
         "choices": [{"index": 0, "text": text, "finish_reason": finish}] if choices else []}
    if usage is not None:
        d["usage"] = {"prompt_tokens": 12, "completion_tokens": usage, "total_tokens": 12 + usage}
    return f"data: {json.dumps(d)}\n\n"


def make_app(state):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        state["auth"].append(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": [{"id": m} for m in ("paced", "paced-no-usage", "faulty",
                                                                             "gated")]})

    async def paced(model, per_chunk, start):
        due, n = start, 0
        for gap, text, k in PACED:
            due += gap
            await asyncio.sleep(max(0.0, due - time.perf_counter() - 0.002))
            while time.perf_counter() < due:            # the last 2 ms spun: a sleep overshoots by ~0.5 ms here
                pass
            n += k
            yield _chunk(model, text, usage=n if per_chunk else None)
        yield _chunk(model, "", usage=n if per_chunk else None, finish="length")
        yield _chunk(model, "", usage=n, choices=False)
        yield "data: [DONE]\n\n"

    async def faulty(kind):
        if kind == "ok":
            yield _chunk("faulty", "a", usage=1) + _chunk("faulty", "b", usage=2, finish="length")
            yield "data: [DONE]\n\n"
        elif kind == "error-event":
            yield _chunk("faulty", "a")
            yield 'data: {"error": {"message": "out of KV cache", "type": "server_error", "code": 500}}\n\n'
        elif kind == "stall":
            yield _chunk("faulty", "a")
            await asyncio.sleep(5)                      # the client's timeout (0.5 s) ends it first
            yield "data: [DONE]\n\n"
        elif kind == "malformed":
            yield _chunk("faulty", "a")
            yield "data: {this is not json\n\n"
        elif kind == "no-done":
            yield _chunk("faulty", "a") + _chunk("faulty", "b")

    async def completions(request):
        start = request.state.arrived                   # the delays count from the request's arrival
        body = await request.json()
        state["bodies"].append(body)
        model = body.get("model")
        if model == "gated":              # the first two stream at once; the rest wait until the test opens the gate
            state["gated"] = state.get("gated", 0) + 1
            if state["gated"] > 2:
                deadline = time.monotonic() + 30
                while not state["gate"].is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            return StreamingResponse(paced("gated", True, time.perf_counter()), media_type="text/event-stream")
        if model in ("paced", "paced-no-usage"):
            return StreamingResponse(paced(model, model == "paced", start), media_type="text/event-stream")
        kind = FAULTS[state["faulty"] % len(FAULTS)]
        state["faulty"] += 1
        if kind == "http-500":
            return JSONResponse({"error": {"message": "engine crashed", "type": "server_error"}}, status_code=500)
        if kind == "not-sse":
            return JSONResponse({"choices": [{"text": "whole answer"}]})
        return StreamingResponse(faulty(kind), media_type="text/event-stream")

    async def tokenize(request):                         # a tokenizer of 4 characters per token, plus <bos>
        text = (await request.json())["prompt"]
        return JSONResponse({"count": 1 + -(-len(text) // 4)})

    async def html(request):
        return PlainTextResponse("<html>not an API</html>", media_type="text/html")

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"]),
                            Route("/tokenize", tokenize, methods=["POST"]), Route("/html/v1/models", html)])

    async def stamped(scope, receive, send):            # the moment uvicorn hands the request over
        if scope["type"] == "http":
            scope.setdefault("state", {})["arrived"] = time.perf_counter()
        await app(scope, receive, send)
    return stamped


@pytest.fixture(scope="module")
def server():
    import uvicorn

    state = {"faulty": 0, "bodies": [], "auth": [], "gate": threading.Event()}
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)        # client and server share this process: hand the interpreter over quickly
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    srv = uvicorn.Server(uvicorn.Config(make_app(state), log_level="warning", timeout_graceful_shutdown=1))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started
    state["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    asyncio.run(_warm_up(state["url"]))     # first-call costs on both sides are not what the timing tests measure
    state["bodies"].clear()
    yield state
    srv.should_exit = True
    th.join(10)
    sock.close()
    sys.setswitchinterval(old_switch)
    assert not th.is_alive()


async def _warm_up(url):
    async with httpx.AsyncClient(base_url=url) as c:
        async with c.stream("POST", "/v1/completions", json={"model": "paced", "prompt": "x"}) as r:
            async for _ in r.aiter_lines():
                pass


def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def one_line_error(r, text):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0], r.output


# ------------------------------------------------------------------ timing against known delays

def test_measured_ttft_and_itl_match_the_scripted_delays(server, tmp_path):
    out = tmp_path / "E"
    r = cli("latency", "--endpoint", server["url"] + "/v1", "--model-name", "paced", "--requests", "8",
            "--output-tokens", "7", "--prompt-tokens", "12", "--rate", "1000", "--arrival", "fixed",
            "--max-concurrency", "1", "--out", out, "--json", "--api-key", "s3cret-key")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any(f.startswith("TTFT = first output chunk received - request sent") for f in doc["formulas"])
    rf = read_results(out / "latency.jsonl")
    ts = rf.requests
    assert len(ts) == 8 and all(t.ok for t in ts)
    for t in ts:
        assert t.chunk_tokens == (1, 1, 1, 3, 1) and t.token_counts == "usage per chunk"
        assert t.served_output_tokens == 7 and t.served_prompt_tokens == 12 and t.n == 7
        assert t.e2e == pytest.approx(t.finish - t.sent) and t.ttft == pytest.approx(t.deliveries[0] - t.sent)
        assert t.queue[0] == t.arrival and t.sent >= t.arrival            # a concurrency slot was waited for
    # Load-independent (issue 22): a server that sleeps its scripted delays cannot deliver sooner, so each chunk
    # arrives at least its scripted time after the request was sent (30, 40, 50, 74, 84 ms); a busy machine only
    # makes it later. The per-token split of the 3-token chunk and TPOT are exact arithmetic on the timestamps.
    due = [TTFT + sum(CHUNK_GAPS[:k]) for k in range(len(CHUNK_GAPS) + 1)]
    for t in ts:
        chunk_ends = [t.deliveries[i] for i in (0, 1, 2, 5, 6)]           # chunks of 1, 1, 1, 3, 1 tokens
        assert [d - t.sent >= want - SLACK for d, want in zip(chunk_ends, due)] == [True] * 5, t.deliveries
        assert t.itls[2] == pytest.approx(t.chunk_itls[2] / 3) and t.itls[2] == pytest.approx(t.itls[4])
        assert t.tpot == pytest.approx((t.e2e - t.ttft) / 6)                 # (E2E - TTFT) / (7 - 1)
        assert len(t.itls) == 6 and len(t.chunk_itls) == 4
    # with one request in flight, each one is sent after the previous one finished
    assert all(b.sent >= a.finish for a, b in zip(ts, ts[1:]))
    s = doc["summaries"][0]
    assert s["config"] == "endpoint=completions,concurrency=1" and s["settings"]["token_counts"] == {
        "usage per chunk": 8}
    assert s["ttft"]["p50"] >= TTFT - SLACK and s["chunk_itl"]["n"] == 8 * 4
    # what was asked for: streaming with usage, exactly 7 tokens where accepted, the key as a bearer token
    body = server["bodies"][-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["min_tokens"] == 7
    # the prompt was sized with the server's /tokenize: 12 tokens = <bos> + 11 x 4 characters at most
    assert 41 <= len(body["prompt"]) <= 44 and all(t.prompt_tokens == 12 for t in ts)
    assert server["auth"][-1] == "Bearer s3cret-key"
    text = (out / "latency.jsonl").read_text()
    assert "s3cret-key" not in text and "s3cret-key" not in r.output          # never written
    assert rf.header.settings["endpoint"] == server["url"] + "/v1" and rf.header.kind == "latency"


def test_without_usage_per_chunk_the_extra_tokens_are_spread_and_said(server, tmp_path):
    r = cli("latency", "--endpoint", server["url"], "--model-name", "paced-no-usage", "--requests", "5",
            "--output-tokens", "7", "--prompt-tokens", "12", "--rate", "1000", "--max-concurrency", "1",
            "--no-usage-per-chunk", "--no-ignore-eos", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    ts = read_results(tmp_path / "latency.jsonl").requests
    # 5 output chunks, usage says 7: the 2 extra go evenly to the chunks after the first (1 each to chunks 2 and 4)
    assert all(t.token_counts == "spread from usage" and t.chunk_tokens == (1, 1, 2, 1, 2) and t.n == 7 for t in ts)
    # TTFT, E2E and TPOT = (E2E - TTFT) / (7 - 1) do not depend on the split (at least the scripted delays: a busy
    # machine only adds to them)
    for t in ts:
        assert t.ttft >= TTFT - SLACK and t.e2e >= TTFT + 54 * MS - SLACK    # a late first chunk shortens the rest
        assert t.tpot == pytest.approx((t.e2e - t.ttft) / 6)
    body = server["bodies"][-1]
    assert body["stream_options"] == {"include_usage": True} and "ignore_eos" not in body


def test_token_split_rules_and_even_gaps():
    chunks = [(0.0, None), (1.0, None), (2.0, None)]
    assert split_tokens(chunks, 3, False) == ([1, 1, 1], "one per chunk")
    assert split_tokens(chunks, None, False) == ([1, 1, 1], "one per chunk, no usage")
    assert split_tokens(chunks, 2, False) == ([1, 1, 1], "chunks, usage disagrees")
    assert split_tokens(chunks, 7, False) == ([1, 3, 3], "spread from usage")        # 4 extra over 2 chunks
    assert split_tokens([(0.0, 2), (1.0, 3)], 5, True) == ([2, 3], "usage per chunk")
    # a chunk of k tokens after a gap g: k deliveries g / k apart; the first chunk's tokens arrive with it
    assert deliveries([0.1, 0.4], [2, 3]) == pytest.approx([0.1, 0.1, 0.2, 0.3, 0.4])


def test_sse_parsing_follows_the_spec():
    sse, out = SSE(), []
    for line in [": ping", "event: completion", 'data: {"a":', "data: 1}", "", "data:[DONE]", ""]:
        ev = sse.feed(line)
        if ev is not None:
            out.append(ev)
    assert out == ['{"a":\n1}', "[DONE]"]


# ------------------------------------------------------------------ failures: counted, with reasons

def test_every_failure_is_counted_with_its_reason_and_nothing_is_lost(server, tmp_path):
    server["faulty"] = 0
    r = cli("latency", "--endpoint", server["url"], "--model-name", "faulty", "--requests", len(FAULTS),
            "--output-tokens", "2", "--prompt-tokens", "8", "--rate", "1000", "--arrival", "fixed",
            "--max-concurrency", "1", "--timeout", "0.5", "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    (s,) = json.loads(r.stdout)["summaries"]
    assert s["requests"] == len(FAULTS) and s["failed"] == len(FAULTS) - 1
    assert s["failures"] == {"error event": 1, "timeout": 1, "http 500": 1, "not an event stream": 1,
                             "malformed event": 1, "disconnected": 1}
    ts = {t.id: t for t in read_results(tmp_path / "latency.jsonl").requests}
    assert len(ts) == len(FAULTS)                                # every request written, ok or failed
    err = {FAULTS[i]: t.error for i, t in ts.items()}
    assert ts[0].ok and ts[0].n == 2
    assert err["error-event"] == "error event: out of KV cache"
    assert err["stall"].startswith("timeout: ") and "(1 tokens received)" in err["stall"]
    assert 0.5 <= ts[2].finish - ts[2].sent < 1.5
    assert err["http-500"] == "http 500: engine crashed"
    assert err["not-sse"].startswith("not an event stream: HTTP 200 with content type 'application/json'")
    assert err["malformed"].startswith("malformed event: not JSON")
    assert err["no-done"].startswith("disconnected: the stream ended after 2 tokens without [DONE]")
    again = cli("latency", "--endpoint", server["url"], "--model-name", "faulty", "--requests", len(FAULTS),
                "--output-tokens", "2", "--prompt-tokens", "8", "--rate", "1000", "--arrival", "fixed",
                "--max-concurrency", "1", "--timeout", "0.5", "--out", tmp_path, "--resume")
    assert again.exit_code == 0 and "already in the file (not run again): endpoint=completions,concurrency=1" in \
        again.output, again.output


# ------------------------------------------------------------------ bad input: one line, nothing written

def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_url_is_a_clear_error_within_the_connect_timeout(tmp_path):
    t = time.monotonic()
    r = cli("latency", "--endpoint", f"http://127.0.0.1:{_closed_port()}", "--connect-timeout", "2", "--out",
            tmp_path / "E")
    one_line_error(r, "cannot reach http://127.0.0.1:")
    assert time.monotonic() - t < 2.0 and not (tmp_path / "E" / "latency.jsonl").exists()


@pytest.mark.parametrize("args, text", [
    (["--endpoint", "{url}/html"], "does not look like an OpenAI-compatible server: GET /v1/models answered HTTP 200 "
                                   "(text/html)"),
    (["--endpoint", "{url}", "--model-name", "llama"], "model 'llama' is not served at"),
    (["--endpoint", "{url}", "--max-concurrency", "0"], "--max-concurrency must be from 1 to 100000 requests in "
                                                       "flight (or none: no limit), but 0 was given"),
    (["--endpoint", "{url}", "--max-concurrency", "2,lots"], "--max-concurrency entry 'lots' is not a number"),
    (["--endpoint", "ftp://127.0.0.1/"], "is not an http(s) URL"),
    (["--endpoint", "{url}", "--chunk", "16"], "--chunk shapes the in-process loop; with --endpoint the server"),
    (["--endpoint", "{url}", "--timeout", "0"], "--timeout must be a positive, finite number of seconds"),
    (["--max-concurrency", "4"], "--max-concurrency is for --endpoint runs"),
])
def test_bad_input_is_one_line(server, tmp_path, args, text):
    r = cli("latency", *[a.format(url=server["url"]) for a in args], "--out", tmp_path / "E")
    one_line_error(r, text)
    assert not (tmp_path / "E" / "latency.jsonl").exists()


def test_api_key_values_are_redacted_from_recorded_commands():
    assert redact(["latency", "--api-key", "k", "--api-key=k2", "--rate", "2"]) == [
        "latency", "--api-key", "***", "--api-key=***", "--rate", "2"]


# ------------------------------------------------------------------ interrupts, resume, report, diagnose

def test_ctrl_c_keeps_every_finished_request_and_resume_completes_it(server, tmp_path):
    """A real SIGINT to a real `roofline latency --endpoint` process, mid-run: the server answers two requests and
    holds the third until the signal is sent (so a loaded machine cannot finish the run first), then lets the
    resume through."""
    out = tmp_path / "E"
    server["gated"], _ = 0, server["gate"].clear()
    args = [sys.executable, "-m", "profiler.cli", "latency", "--endpoint", server["url"], "--model-name", "gated",
            "--model", "tiny", "--requests", "12", "--output-tokens", "7", "--prompt-tokens", "12", "--rate", "1000",
            "--arrival", "fixed", "--max-concurrency", "1", "--out", str(out)]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    path, deadline = out / "latency.jsonl", time.monotonic() + 20
    try:
        while time.monotonic() < deadline:        # the two the server answers: then it holds the third
            if path.exists() and path.read_text().count('"type":"request"') >= 2:
                break
            time.sleep(0.01)
        p.send_signal(signal.SIGINT)
        try:                                      # the client drops its held request, or waits for it:
            _, err = p.communicate(timeout=2)     # then the gate opens and the one request in flight ends
        except subprocess.TimeoutExpired:
            server["gate"].set()
            _, err = p.communicate(timeout=20)
    finally:
        server["gate"].set()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted:" in err and "requests are kept in" in err and "--resume" in err
    runs = latency_runs(read_results(path))
    (part,) = runs
    assert not part.complete and 2 <= len(part.timelines) < 12 and all(t.ok for t in part.timelines)
    resume = err.split("Resume with:")[1].strip().splitlines()[0].split()
    assert resume[:2] == ["roofline", "latency"] and "--api-key" not in resume
    r = cli(*resume[1:])
    assert r.exit_code == 0, r.output
    runs = latency_runs(read_results(path))
    assert [(x.attempt, x.complete, len(x.timelines)) for x in runs] == [(2, True, 12)]
    # report and diagnose read the endpoint file as they read any latency file
    rep = cli("report", path, "--out", tmp_path / "rep")
    assert rep.exit_code == 0, rep.output and (tmp_path / "rep" / "report.html").exists()
    d = cli("diagnose", path, "--device", "h100", "--json")
    assert d.exit_code == 0, d.output
    floors = [f for f in json.loads(d.stdout) if f["rule"] == "latency-floor"]
    assert [f["data"]["metric"] for f in floors] == ["TTFT", "TPOT"]          # the header's model: tiny
    assert all(f["data"]["ratio"] > 1 for f in floors)
    plain = cli("diagnose", path)
    assert plain.exit_code == 0 and "roofline floor" not in plain.output and "interrupted" not in plain.output
