"""``roofline serve``: our model behind an OpenAI-compatible API, measured by ``roofline latency --endpoint``.

One server process for the module (``--model small --port 0 --max-slots 2 --max-queue 1``, on
127.0.0.1); the last test stops it with SIGINT and checks it exits cleanly. Everything is on loopback.
"""

import contextlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from profiler.cli import main  # noqa: E402
from roofline.records import read_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SLOTS, QUEUE = 2, 1


def start_server(tmp: Path, *args):
    """(process, base URL): ``roofline serve --port 0`` in a child process; its first stdout line names the port."""
    err = open(tmp / "serve.err", "w")
    p = subprocess.Popen([sys.executable, "-m", "profiler.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    err.close()
    ready, _, _ = select.select([p.stdout], [], [], 60)
    line = p.stdout.readline() if ready else ""
    if not line.startswith("serving "):
        p.kill()
        pytest.fail(f"roofline serve did not start: {line!r} {(tmp / 'serve.err').read_text()}")
    return p, line.split(" on ")[1].strip()


def stop(p, sig=signal.SIGINT, timeout=20) -> int:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        return p.wait(timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    p, url = start_server(tmp, "--model", "small", "--max-slots", str(SLOTS), "--max-queue", str(QUEUE),
                          "--max-model-len", "1024")
    yield {"proc": p, "url": url, "tmp": tmp}
    stop(p)


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def metrics(url) -> dict:
    text = httpx.get(url + "/metrics").text
    return {k.split(":")[1]: float(v) for k, v in (ln.split() for ln in text.splitlines() if ln.strip())}


# ------------------------------------------------------------------ measured from outside vs in-process

RUN = ["--requests", "6", "--prompt-tokens", "40", "--output-tokens", "8", "--rate", "40", "--arrival", "fixed"]


def test_endpoint_run_against_roofline_serve_matches_the_in_process_run(served, tmp_path):
    r = cli("latency", "--endpoint", served["url"], "--model", "small", "--dtype", "fp32", *RUN,
            "--max-concurrency", str(SLOTS), "--out", tmp_path / "E", "--json")
    assert r.exit_code == 0, r.output
    (ep,) = json.loads(r.stdout)["summaries"]
    i = cli("latency", "--model", "small", *RUN, "--max-slots", str(SLOTS), "--out", tmp_path / "I", "--json")
    assert i.exit_code == 0, i.output
    (ip,) = json.loads(i.stdout)["summaries"]
    remote = read_results(tmp_path / "E" / "latency.jsonl").requests
    local = read_results(tmp_path / "I" / "latency.jsonl").requests
    assert ep["failed"] == 0 and ip["failed"] == 0
    # the same token counts: the prompt sized with the server's /tokenize, every token counted from per-chunk usage
    assert [(t.prompt_len, t.n) for t in remote] == [(t.prompt_len, t.n) for t in local] == [(40, 8)] * 6
    assert all(t.served_prompt_tokens == 40 and t.served_output_tokens == 8 and t.token_counts == "usage per chunk"
               for t in remote)
    # tokens are streamed as they are made, not held back and sent in a burst: every request's 8 tokens came in 8
    # chunks of one token, at 8 increasing times after the request was sent (structure, not a timing ratio: a
    # loaded machine stretches both runs unevenly)
    for t in remote:
        assert t.chunk_tokens == (1,) * 8 and len(t.deliveries) == 8
        assert t.sent < t.deliveries[0] and all(a < b for a, b in zip(t.deliveries, t.deliveries[1:]))
    assert all(ep[k]["p50"] > 0 and ip[k]["p50"] > 0 for k in ("ttft", "tpot"))
    d = cli("diagnose", tmp_path / "E" / "latency.jsonl", "--device", "h100", "--json")
    assert d.exit_code == 0, d.output
    assert {f["data"]["metric"] for f in json.loads(d.stdout) if f["rule"] == "latency-floor"} == {"TTFT", "TPOT"}


def test_prefix_reuse_shows_from_outside(served, tmp_path):
    # 40-token prompts sharing their first 33 tokens, 0.1 s apart: each later one reuses 2 full 16-token blocks
    r = cli("latency", "--endpoint", served["url"], "--requests", "3", "--prompt-tokens", "40", "--output-tokens",
            "2", "--rate", "10", "--arrival", "fixed", "--shared-prefix", "33", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    ts = read_results(tmp_path / "latency.jsonl").requests
    assert [t.cached_tokens for t in ts] == [0, 32, 32]          # from usage.prompt_tokens_details.cached_tokens


def test_chat_prompts_are_sized_with_their_template(served, tmp_path):
    r = cli("latency", "--endpoint", served["url"], "--api", "chat", "--requests", "2", "--prompt-tokens", "30",
            "--output-tokens", "3", "--rate", "20", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    ts = read_results(tmp_path / "latency.jsonl").requests
    assert [(t.served_prompt_tokens, t.n) for t in ts] == [(30, 3), (30, 3)]    # "user: ...\nassistant:" counted


# ------------------------------------------------------------------ the API

def test_the_api_answers_like_an_openai_server_and_validates_requests(served):
    url = served["url"]
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"] == "small"
        assert c.post("/tokenize", json={"prompt": "abc"}).json()["count"] == 4          # <bos> + 3 bytes

        def err(resp, status, param=None):
            assert resp.status_code == status, resp.text
            e = resp.json()["error"]
            assert e["message"] and e["type"] and (param is None or e["param"] == param)
            return e["message"]

        err(c.post("/v1/completions", content=b"{not json"), 400)
        err(c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0}), 400, "max_tokens")
        err(c.post("/v1/completions", json={"prompt": 7}), 400, "prompt")
        err(c.post("/v1/completions", json={"prompt": "hi", "n": 2}), 400, "n")
        err(c.post("/v1/completions", json={"prompt": "hi", "stream_options": {"include_usage": True}}), 400,
            "stream_options")
        assert "maximum context length is 1024" in err(c.post("/v1/completions", json={"prompt": "x" * 1000,
                                                                                        "max_tokens": 100}), 400)
        assert "does not exist" in err(c.post("/v1/completions", json={"prompt": "hi", "model": "gpt-4"}), 404)
        err(c.post("/v1/chat/completions", json={"messages": []}), 400, "messages")
        err(c.get("/v1/nothing"), 404)
        whole = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5, "ignore_eos": True}).json()
        assert whole["usage"]["completion_tokens"] == 5 and whole["choices"][0]["finish_reason"] == "length"
        events = []
        with c.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert sum("content" in ch["choices"][0]["delta"] for ch in chunks[1:] if ch["choices"]) == 3
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_a_full_server_answers_503_and_a_client_that_leaves_frees_its_slot(served):
    url = served["url"]
    body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True}   # ~seconds of decoding
    with httpx.Client(base_url=url, timeout=30) as c:
        before = metrics(url)
        with contextlib.ExitStack() as stack:
            streams = [stack.enter_context(c.stream("POST", "/v1/completions", json=body))
                       for _ in range(SLOTS + QUEUE)]                # 2 running, 1 waiting: full
            lines = [s.iter_lines() for s in streams]        # kept: an iterator dropped closes its connection
            for it in lines[:SLOTS]:
                assert next(it).startswith("data: ")             # both are decoding
            busy = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_busy"
            m = metrics(url)
            assert m["num_requests_running"] == SLOTS and m["kv_slots_free"] == 0
        # the three clients went away mid-stream: their requests are cancelled and the slots freed
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = metrics(url)
            if m["requests_cancelled_total"] - before["requests_cancelled_total"] == SLOTS + QUEUE and \
                    m["kv_slots_free"] == SLOTS and m["requests_in_flight"] == 0:
                break
            time.sleep(0.02)
        assert m["requests_cancelled_total"] - before["requests_cancelled_total"] == SLOTS + QUEUE, m
        assert m["kv_slots_free"] == SLOTS and m["num_requests_running"] == 0 and m["num_requests_waiting"] == 0
        ok = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


# ------------------------------------------------------------------ bad input, missing extra, shutdown

def test_serve_without_the_extra_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "uvicorn" else real(n, *a))
    r = cli("serve", "--model", "tiny", "--port", "0")
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "pip install 'roofline[serve]'" in lines[0], r.output


def test_a_taken_port_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        r = cli("serve", "--model", "tiny", "--port", s.getsockname()[1])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "cannot listen on 127.0.0.1:" in lines[0], r.output


def test_sigterm_and_sigint_stop_the_server_cleanly(served, tmp_path):
    p, url = start_server(tmp_path, "--model", "tiny")
    assert httpx.get(url + "/health").status_code == 200
    assert stop(p, signal.SIGTERM) == 0
    assert "roofline serve: stopped." in (tmp_path / "serve.err").read_text()
    assert stop(served["proc"], signal.SIGINT) == 0                  # the module's server, last
    assert "roofline serve: stopped." in (served["tmp"] / "serve.err").read_text()
    with pytest.raises(httpx.ConnectError):
        httpx.get(served["url"] + "/health", timeout=2)
