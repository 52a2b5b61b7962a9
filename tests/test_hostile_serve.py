"""``roofline serve`` against broken and hostile clients (issue 23): nothing a client sends gives a 500 or a traceback.

One ``roofline serve --model tiny`` process per test module (127.0.0.1, an ephemeral port), a second one for
the graceful SIGTERM; each is stopped by the test that owns it.
"""

import json
import signal
import socket
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from profiler.server import parse_request  # noqa: E402
from roofline.safejson import HTTP_BODY, BadJSON, loads  # noqa: E402
from tests.test_serve import start_server, stop  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-serve")
    p, url = start_server(tmp, "--model", "tiny", "--max-slots", "8", "--max-model-len", "512")
    yield {"url": url, "err": tmp / "serve.err", "proc": p}
    stop(p)


def _error(resp, status: int) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    e = resp.json()["error"]
    assert e["type"] == "invalid_request_error"
    return e["message"]


def test_a_lone_surrogate_is_a_400_on_every_route(served):
    body = b'{"prompt": "x\\ud800y", "max_tokens": 2}'
    chat = b'{"messages": [{"role": "user", "content": "x\\ud800y"}], "max_tokens": 2}'
    with httpx.Client(base_url=served["url"], timeout=30) as c:
        for path, raw in (("/v1/completions", body), ("/v1/chat/completions", chat), ("/tokenize", body)):
            msg = _error(c.post(path, content=raw, headers={"content-type": "application/json"}), 400)
            assert "lone surrogate (\\ud800)" in msg, msg


def test_a_deeply_nested_body_is_a_400_not_a_recursion_error(served):
    with httpx.Client(base_url=served["url"], timeout=30) as c:
        for depth in (100_000, 40):
            raw = b"[" * depth + b"]" * depth
            msg = _error(c.post("/v1/completions", content=raw), 400)
            assert "nested deeper than 32 levels" in msg, msg


def test_a_wrongly_typed_tokenize_field_is_a_400(served):
    with httpx.Client(base_url=served["url"], timeout=30) as c:
        msg = _error(c.post("/tokenize", json={"prompt": "abc", "add_special_tokens": "yes"}), 400)
        assert "'add_special_tokens' must be true or false" in msg
        assert c.post("/tokenize", json={"prompt": "abc", "add_special_tokens": False}).json()["count"] == 3


def test_half_a_body_then_gone_leaves_no_traceback(served):
    host, port = served["url"].split("//")[1].rsplit(":", 1)
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: 1000\r\n\r\n{\"prompt\": \"he")
    with httpx.Client(base_url=served["url"], timeout=30) as c:   # the server still answers, after the three
        ok = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    log = served["err"].read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


def test_the_request_validator_never_raises_anything_but_its_own_error():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from profiler.server import BadRequest

    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
    keys = st.sampled_from(["prompt", "messages", "max_tokens", "max_completion_tokens", "n", "stream",
                            "stream_options", "min_tokens", "ignore_eos", "model", "role", "content"])
    bodies = st.dictionaries(keys, values, max_size=6) | values

    @settings(max_examples=400, deadline=None, database=None)
    @given(bodies, st.booleans())
    def check(body, chat):
        try:
            req = parse_request(loads(json.dumps(body), limits=HTTP_BODY), chat=chat, served="m", max_len=64)
        except (BadRequest, BadJSON):
            return
        assert 1 <= req["max_tokens"] and req["prompt_tokens"] + req["max_tokens"] <= 64
        # an empty prompt is a request too (the tokenizer's BOS is its one token, as the OpenAI API takes "")
        assert isinstance(req["prompt"], str) and req["prompt_tokens"] == len(req["prompt"].encode("utf-8")) + 1

    check()


def test_sigterm_lets_running_streams_finish_then_ends_the_rest_with_a_shutdown_event(tmp_path):
    p, url = start_server(tmp_path, "--model", "small", "--max-slots", "8", "--max-model-len", "2048",
                          "--shutdown-grace", "1")
    # three short streams (finish within the grace) and three that cannot (2,000 tokens); all six are running
    lengths = [4, 4, 4, 2000, 2000, 2000]
    ends: list = [None] * 6
    first = [threading.Event() for _ in lengths]
    go = threading.Event()

    def client(i):
        body = {"prompt": "hello", "max_tokens": lengths[i], "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as s:
            events = []
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:
                        first[i].set()
                        go.wait(60)          # the short ones hold their stream open until the signal
            ends[i] = events

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for e in first:
        assert e.wait(60)
    p.send_signal(signal.SIGTERM)
    go.set()
    for t in threads:
        t.join(60)
    assert stop(p, signal.SIGTERM) == 0
    assert all(ev is not None and ev[-1] == "[DONE]" for ev in ends), ends
    last = [json.loads(ev[-2]) for ev in ends]
    assert [d["choices"][0]["finish_reason"] for d in last[:3]] == ["length"] * 3
    assert [d["error"]["type"] for d in last[3:]] == ["server_shutdown"] * 3
    log = (tmp_path / "serve.err").read_text()
    assert "Traceback" not in log and "CancelledError" not in log and "roofline serve: stopped." in log, log


def test_a_stop_repeated_while_the_server_winds_down_does_not_kill_it_by_the_signal():
    """uvicorn puts the previous handlers back before the process ends; a supervisor's second SIGTERM in that
    window killed the server (exit -15, CI stop 26). The handlers it puts back are ours: they note the stop."""
    from types import SimpleNamespace

    from profiler.commands.serve import _swallow_late_stops

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    server = SimpleNamespace(should_exit=False)
    try:
        _swallow_late_stops(server)
        signal.raise_signal(signal.SIGTERM)     # the default disposition would end this process here
        assert server.should_exit is True
        server.should_exit = False
        signal.raise_signal(signal.SIGINT)      # the default handler would raise KeyboardInterrupt
        assert server.should_exit is True
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
