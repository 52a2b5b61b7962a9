"""A fault-injecting OpenAI-compatible server for the tests: each served "model" is one way of being broken.

    with hostile_server() as url:                      # 127.0.0.1, an ephemeral port; stops on leaving
        roofline latency --endpoint URL --model-name lying-usage ...

Models (``GET /v1/models`` lists them all, "ok" with ``dtype: fp32`` as ``roofline serve`` lists its own;
``/tokenize`` counts one token per character plus <bos>):

    ok            four one-token chunks with usage, a finish chunk, the usage chunk, [DONE]
    lying-usage   four chunks, each claiming completion_tokens 250, 500, 750, 1000 (for max_tokens 4)
    huge-usage    four chunks without usage, then a usage chunk claiming 10**9 tokens
    echo-key      HTTP 401 whose body echoes the Authorization header (as OpenAI's does)
    echo-event    one chunk, then an error event echoing the Authorization header
    nested        one chunk, then a ``data:`` line nested 100,000 deep
    cut           two chunks, then the connection is closed mid-stream (no finish, no [DONE])
    stall         one chunk, then nothing for 5 s (past the test's timeout)
    nan-usage     four chunks whose usage is NaN / true / -3 / "7" (no count the client can use)

Every stream ends by itself; nothing waits on the client. ``state["auth"]`` collects the
Authorization headers seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

MODELS = ("ok", "lying-usage", "huge-usage", "echo-key", "echo-event", "nested", "cut", "stall", "nan-usage")


def _chunk(model: str, text: str, usage=None, finish=None, choices=True, raw_usage: str | None = None) -> str:
    d = {"id": "x", "object": "text_completion", "model": model,
         "choices": [{"index": 0, "text": text, "finish_reason": finish}] if choices else []}
    if usage is not None:
        d["usage"] = {"prompt_tokens": 5, "completion_tokens": usage, "total_tokens": 5 + usage}
    out = json.dumps(d)
    if raw_usage is not None:                         # a usage value json.dumps would not write (NaN) or would quote
        out = out[:-1] + f', "usage": {{"prompt_tokens": 5, "completion_tokens": {raw_usage}}}}}'
    return f"data: {out}\n\n"


def make_app(state: dict):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        state["auth"].append(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", **({"dtype": "fp32"} if m == "ok"
                                                                                        else {})} for m in MODELS]})

    async def tokenize(request):
        body = await request.json()
        return JSONResponse({"count": 1 + len(body.get("prompt", ""))})

    async def script(model: str, auth: str):
        if model == "ok":
            for i in range(1, 5):
                yield _chunk(model, "abcd"[i - 1], usage=i)
            yield _chunk(model, "", usage=4, finish="length") + _chunk(model, "", usage=4, choices=False)
        elif model == "lying-usage":
            for i in range(1, 5):
                yield _chunk(model, "abcd"[i - 1], usage=250 * i)
            yield _chunk(model, "", usage=1000, finish="length")
        elif model == "huge-usage":
            for i in range(4):
                yield _chunk(model, "abcd"[i])
            yield _chunk(model, "", finish="length") + _chunk(model, "", usage=10**9, choices=False)
        elif model == "echo-event":
            yield _chunk(model, "a")
            yield "data: " + json.dumps({"error": {"message": f"Incorrect API key provided: {auth}",
                                                   "type": "invalid_request_error"}}) + "\n\n"
            return
        elif model == "nested":
            yield _chunk(model, "a")
            yield "data: " + "[" * 100_000 + "]" * 100_000 + "\n\n"
        elif model == "cut":
            yield _chunk(model, "a") + _chunk(model, "b")
            raise ConnectionResetError("cut by the test server")   # uvicorn closes the connection mid-body
        elif model == "stall":
            yield _chunk(model, "a")
            await asyncio.sleep(5)
        elif model == "nan-usage":
            for i, raw in enumerate(("NaN", "true", "-3", '"7"')):
                yield _chunk(model, "abcd"[i], raw_usage=raw)
            yield _chunk(model, "", finish="length")
        yield "data: [DONE]\n\n"

    async def completions(request):
        body = await request.json()
        model = body.get("model", "ok")
        auth = request.headers.get("authorization", "")
        state["auth"].append(auth)
        if model == "echo-key":
            return JSONResponse({"error": {"message": f"Incorrect API key provided: {auth}. You can find your API "
                                           f"key at https://example.invalid.", "type": "invalid_request_error",
                                           "code": "invalid_api_key"}}, status_code=401)
        return StreamingResponse(script(model, auth), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/tokenize", tokenize, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"])])


@contextlib.contextmanager
def hostile_server():
    """The server on 127.0.0.1 (an ephemeral port) in a thread; yields (base URL, state); stops on leaving."""
    import uvicorn

    state: dict = {"auth": []}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    srv = uvicorn.Server(uvicorn.Config(make_app(state), log_level="critical", timeout_graceful_shutdown=1))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert srv.started, "the hostile test server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", state
    finally:
        srv.should_exit = True
        th.join(10)
        sock.close()
